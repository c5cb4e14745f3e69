"""tools/mypy_baseline.py: what fails `make lint` and what the baseline lets through (mypy itself is
not run here; `make lint` runs it)."""

from collections import Counter

from tools.mypy_baseline import BASELINE, baseline_text, is_strict, judge, parse, read_baseline, strict_modules

OUTPUT = """\
runtime/local.py:164: error: Item "None" of "Popen[Any] | None" has no attribute "wait"  [union-attr]
runtime/local.py:164: note: see the docs
runtime/local.py:170: error: Item "None" of "Popen[Any] | None" has no attribute "wait"  [union-attr]
stacks/cell.py:12: error: Name "x" already defined on line 3  [no-redef]
ops/fleet.py:40: error: Missing type arguments for generic type "tuple"  [type-arg]
"""
STRICT = ["contract", "stacks.config", "ops", "ops.*"]


def test_baseline_entries_carry_no_line_numbers_so_edits_elsewhere_in_a_file_do_not_churn_them():
    moved = OUTPUT.replace(":164:", ":201:").replace(":170:", ":207:").replace("line 3", "line 9")
    assert [e.key for e in parse(OUTPUT)] == [e.key for e in parse(moved)]
    key = 'runtime/local.py: Item "None" of "Popen[Any] | None" has no attribute "wait"  [union-attr]'
    assert parse(OUTPUT)[0].key == key


def test_notes_are_not_errors():
    assert [e.line for e in parse(OUTPUT)] == [164, 170, 12, 40]


def test_errors_the_baseline_lists_pass_as_often_as_it_lists_them():
    errors = [e for e in parse(OUTPUT) if not e.path.startswith("ops/")]
    verdict = judge(errors, Counter(e.key for e in errors), STRICT)
    assert verdict.ok


def test_one_more_occurrence_than_the_baseline_allows_fails_and_shows_every_occurrence():
    errors = [e for e in parse(OUTPUT) if e.path == "runtime/local.py"]
    verdict = judge(errors, Counter({errors[0].key: 1}), STRICT)
    assert not verdict.ok
    assert verdict.new == [(errors, 1)]


def test_an_error_in_a_strict_module_fails_even_if_the_baseline_lists_it():
    errors = parse(OUTPUT)
    verdict = judge(errors, Counter(e.key for e in errors), STRICT)
    assert [e.path for e in verdict.strict] == ["ops/fleet.py"]
    assert not verdict.ok


def test_a_fixed_error_still_in_the_baseline_fails_until_the_baseline_is_updated():
    errors = parse(OUTPUT)
    baseline = Counter(e.key for e in errors if e.path == "runtime/local.py")
    verdict = judge(errors[1:2], baseline, STRICT)
    assert verdict.stale == [errors[0].key]
    assert not verdict.ok


def test_update_writes_a_baseline_that_passes_and_leaves_strict_modules_out(tmp_path):
    errors = parse(OUTPUT)
    path = tmp_path / "baseline.txt"
    path.write_text(baseline_text(errors, STRICT))
    baseline = read_baseline(path)
    assert "ops/fleet.py" not in path.read_text()
    assert sum(baseline.values()) == 3
    assert [e.path for e in judge(errors, baseline, STRICT).strict] == ["ops/fleet.py"]
    assert not judge(errors, baseline, STRICT).new


def test_strict_modules_are_the_ones_pyproject_makes_strict():
    strict = strict_modules()
    assert {"contract", "stacks.config", "ops.*"} <= set(strict)
    assert is_strict("contract/__init__.py", strict)
    assert is_strict("stacks/config.py", strict)
    assert is_strict("ops/commands/plan.py", strict)
    assert is_strict("ops/__init__.py", strict)
    assert not is_strict("stacks/cell.py", strict)
    assert not is_strict("runtime/local.py", strict)


def test_the_checked_in_baseline_lists_nothing_in_a_strict_module():
    strict = strict_modules()
    assert [k for k in read_baseline(BASELINE) if is_strict(k.split(":", 1)[0], strict)] == []

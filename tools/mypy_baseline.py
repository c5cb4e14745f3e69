"""Hold mypy to a baseline: the type errors the code had when checking began, which may only shrink.

Runs mypy as configured in pyproject.toml. Modules under the strict override there get no baseline:
any error in them fails. Elsewhere an error fails unless tools/mypy-baseline.txt lists it; entries
are `path: message  [code]` without line numbers, so edits elsewhere in a file do not churn them.
A listed error that is gone fails too, until `--update` takes it out, so the list only shrinks.

    python tools/mypy_baseline.py            # check (what `make lint` runs)
    python tools/mypy_baseline.py --update   # rewrite the baseline from today's errors
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import subprocess
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "tools" / "mypy-baseline.txt"
PYPROJECT = REPO / "pyproject.toml"
HEADER = (
    "# mypy errors outside the strict modules, one per line, without line numbers. May only shrink:\n"
    "# fix one, then `python tools/mypy_baseline.py --update`. Never add to it by hand.\n"
)

# `path:line: error: message  [code]` (mypy's default output; columns are off).
_ERROR = re.compile(r"^(?P<path>[^:\s][^:]*):(?P<line>\d+): error: (?P<message>.*?)(?:  \[(?P<code>[a-z0-9-]+)\])?$")


@dataclass(frozen=True)
class MypyError:
    path: str
    line: int
    message: str
    code: str

    @property
    def key(self) -> str:
        # Messages quote line numbers of other definitions ("already defined on line 12"): those move
        # with unrelated edits just like the error's own line.
        message = re.sub(r"\bline \d+\b", "line N", self.message)
        return f"{self.path}: {message}  [{self.code}]"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: error: {self.message}  [{self.code}]"


@dataclass
class Verdict:
    strict: list[MypyError] = field(default_factory=list)  # errors in strict modules
    # Errors whose key occurs more often than the baseline allows, with that allowance: which
    # occurrence is the new one only the author knows, so all of them are shown.
    new: list[tuple[list[MypyError], int]] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # baseline entries no error matches any more

    @property
    def ok(self) -> bool:
        return not (self.strict or self.new or self.stale)


def strict_modules(pyproject: Path = PYPROJECT) -> list[str]:
    """Module patterns of the override that makes modules strict (the one with disallow_untyped_defs)."""
    overrides = tomllib.loads(pyproject.read_text())["tool"]["mypy"].get("overrides", [])
    patterns: list[str] = []
    for o in overrides:
        if o.get("disallow_untyped_defs"):
            module = o["module"]
            patterns.extend([module] if isinstance(module, str) else module)
    return patterns


def module_of(path: str) -> str:
    """ops/commands/plan.py -> ops.commands.plan; contract/__init__.py -> contract."""
    dotted = path.removesuffix(".py").replace("/", ".")
    return dotted.removesuffix(".__init__")


def is_strict(path: str, patterns: list[str]) -> bool:
    # mypy's override syntax: "pkg.*" is pkg and everything under it, anything else one module.
    module = module_of(path)
    for p in patterns:
        if p.endswith(".*"):
            if module == p[:-2] or fnmatch.fnmatchcase(module, p):
                return True
        elif module == p:
            return True
    return False


def parse(output: str) -> list[MypyError]:
    """The error lines of mypy's output (notes belong to the error above them and are left out)."""
    errors = []
    for raw in output.splitlines():
        m = _ERROR.match(raw)
        if m:
            errors.append(MypyError(m["path"], int(m["line"]), m["message"], m["code"] or "misc"))
    return errors


def read_baseline(path: Path = BASELINE) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))


def judge(errors: list[MypyError], baseline: Counter[str], strict: list[str]) -> Verdict:
    verdict = Verdict()
    by_key: dict[str, list[MypyError]] = {}
    for e in errors:
        if is_strict(e.path, strict):
            verdict.strict.append(e)
        else:
            by_key.setdefault(e.key, []).append(e)
    for key, found in by_key.items():
        if len(found) > baseline[key]:
            verdict.new.append((found, baseline[key]))
    for key, allowed in baseline.items():
        verdict.stale.extend([key] * (allowed - len(by_key.get(key, []))))
    return verdict


def baseline_text(errors: list[MypyError], strict: list[str]) -> str:
    return HEADER + "".join(f"{k}\n" for k in sorted(e.key for e in errors if not is_strict(e.path, strict)))


def run_mypy() -> tuple[int, str]:
    # The flags pin the output to the one-line form _ERROR reads, whatever else a config sets.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-error-summary",
            "--no-pretty",
            "--hide-error-context",
            "--no-color-output",
            "--show-error-codes",
            "--hide-column-numbers",
            "--hide-error-end",
            "--hide-error-code-links",
            "--hide-absolute-path",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--update", action="store_true", help=f"rewrite {BASELINE.relative_to(REPO)}")
    args = parser.parse_args(argv)

    status, output = run_mypy()
    errors = parse(output)
    if status not in (0, 1) or (status == 1 and not errors):
        # 2: mypy could not run (bad config, duplicate module, crash): nothing to compare.
        print(output, end="", file=sys.stderr)
        print(f"mypy exited with status {status} without a list of errors", file=sys.stderr)
        return 2
    strict = strict_modules()
    if args.update:
        BASELINE.write_text(baseline_text(errors, strict))
        verdict = judge(errors, read_baseline(), strict)
        print(f"{BASELINE.relative_to(REPO)}: {sum(read_baseline().values())} errors")
    else:
        verdict = judge(errors, read_baseline(), strict)

    for e in verdict.strict:
        print(f"{e}   (strict module: no baseline)")
    for found, allowed in verdict.new:
        print(f"{len(found)} x, the baseline allows {allowed}:" if allowed else "not in the baseline:")
        for e in found:
            print(f"  {e}")
    for key in verdict.stale:
        print(f"fixed, still in the baseline: {key}")
    if verdict.stale:
        print("run `python tools/mypy_baseline.py --update` to take fixed errors out of the baseline")
    elsewhere = len(errors) - len(verdict.strict)
    beyond = sum(len(found) - allowed for found, allowed in verdict.new)
    print(
        f"mypy: {len(verdict.strict)} errors in strict modules ({', '.join(strict)}); {elsewhere} elsewhere, "
        f"{beyond} of them beyond the baseline; {len(verdict.stale)} fixed errors still in the baseline"
    )
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())

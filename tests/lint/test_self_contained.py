"""The repository stands alone: the request traces the tests, benchmarks and docs use ship in traces/
and are read through its one reader, and no file reaches outside the checkout for data."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

import traces

ROOT = Path(__file__).resolve().parents[2]
# Not the repository's own text: installed packages, build output, caches.
SKIP_DIRS = {".git", ".venv", "node_modules", "cdk.out", ".cache", ".flotilla", "__pycache__", ".pytest_cache"}
TEXT = {".py", ".md", ".toml", ".ini", ".txt", ".yaml", ".yml", ".json", ".cfg", ".sh"}
# A path to a folder beside the checkout: `../shared/...`, `REPO.parent / "shared"`, `parents[3]`.
OUTSIDE = re.compile(r"\.\./shared\b|\.parent\s*/\s*[\"']shared[\"']|\bparents\[[3-9]\]")
# The request counts traces/README.md gives for each shipped file (the upstream files' line counts).
README_ROWS = {"conversation": 12031, "synthetic": 3993}


def repository_text_files() -> list[Path]:
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if SKIP_DIRS & set(rel.parts) or not path.is_file():
            continue
        if path.suffix in TEXT or path.name in ("Makefile", "Dockerfile"):
            out.append(path)
    return out


def test_no_file_of_the_repository_reads_from_a_folder_beside_it():
    here = Path(__file__).resolve()
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in repository_text_files()
        if path != here
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not found, "read from traces/ (traces.open_trace) instead:\n" + "\n".join(found)


def test_the_check_sees_the_paths_that_once_reached_outside():
    assert OUTSIDE.search('TRACES = REPO.parent / "shared" / "traces"')
    assert OUTSIDE.search("the Mooncake conversation trace (../shared/traces)")
    assert not OUTSIDE.search("REPO = Path(__file__).resolve().parents[2]")
    assert len(repository_text_files()) > 100  # the walk finds the repository's files


@pytest.mark.parametrize("name", sorted(traces.NAMED))
def test_every_named_trace_ships_in_the_repository_and_opens_by_its_short_name(name):
    path = traces.trace_path(name)
    assert path.parent == ROOT / "traces" and path.is_file()
    with traces.open_trace(name) as f:
        first = f.readline()
    with gzip.open(path, "rt") as f:
        assert first == f.readline() and first.strip()


@pytest.mark.parametrize("name", traces.MOONCAKE)
def test_the_mooncake_traces_hold_the_requests_their_readme_states_with_their_fields(name):
    rows = traces.mooncake_rows(name)
    assert len(rows) == README_ROWS[name]
    assert {"timestamp", "input_length", "output_length", "hash_ids"} <= rows[0].keys()
    assert traces.mooncake_rows(name, limit=5) == rows[:5]


def test_a_plain_jsonl_path_reads_the_same_as_its_compressed_twin(tmp_path):
    rows = traces.mooncake_rows("synthetic", limit=3)
    plain = tmp_path / "t.jsonl"
    with traces.open_trace("synthetic") as f:
        plain.write_text("".join(f.readline() for _ in range(3)))
    assert traces.mooncake_rows(plain) == rows


def test_a_trace_that_cannot_be_read_is_refused_naming_the_flag_and_the_choices(tmp_path):
    with pytest.raises(OSError) as missing:
        traces.mooncake_rows("conversaton")
    line = traces.unreadable("--trace", "conversaton", missing.value)
    assert line == (
        "--trace conversaton: No such file or directory; give conversation, synthetic (shipped in traces/) "
        "or a Mooncake JSONL path"
    )
    bad = tmp_path / "broken.jsonl.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(OSError) as corrupt:
        traces.mooncake_rows(bad)
    assert "Not a gzipped file" in traces.unreadable("--trace", bad, corrupt.value)

"""The request traces shipped in this folder (README.md: sources, fields, licences) and the one way the
tests, benchmarks and simulations open them: by short name or by path, gzip or plain, so nothing reads
a trace from outside the repository."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
# Short names of the shipped files, as the benchmarks' --trace flags take them.
NAMED = {
    "conversation": "mooncake-conversation.jsonl.gz",
    "synthetic": "mooncake-synthetic.jsonl.gz",
    "azure-conv": "azure-llm-2023-conv.csv.gz",
    "azure-code": "azure-llm-2023-code.csv.gz",
}
MOONCAKE = ("conversation", "synthetic")


def trace_path(name: str | Path) -> Path:
    """A shipped trace by its short name (NAMED), any other trace by its path."""
    return HERE / NAMED[name] if isinstance(name, str) and name in NAMED else Path(name)


def open_trace(name: str | Path) -> IO[str]:
    """The trace as text, decompressed on the fly when its file ends in .gz (OSError if it cannot be read)."""
    path = trace_path(name)
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")


def mooncake_rows(name: str | Path, limit: int = 0) -> list[dict[str, Any]]:
    """The requests of a Mooncake-format trace (one JSON object a line: timestamp, input_length,
    output_length, hash_ids), in file order; only the first `limit` when limit > 0."""
    rows: list[dict[str, Any]] = []
    with open_trace(name) as f:
        for line in f:
            if limit and len(rows) == limit:
                break
            if line.strip():
                rows.append(json.loads(line))
    return rows


def unreadable(flag: str, name: str | Path, exc: OSError) -> str:
    """The one-line refusal of a --trace value that cannot be read, naming the flag and the fix."""
    why = exc.strerror or str(exc)  # a corrupt .gz raises BadGzipFile, which has no strerror
    return f"{flag} {name}: {why}; give {', '.join(MOONCAKE)} (shipped in traces/) or a Mooncake JSONL path"

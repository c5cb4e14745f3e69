"""Each of the slowest tests of a whole-suite run, run again alone: how much slower the suite made it.

Reads the `--durations=0` lines of a whole-suite run's output (pytest prints `12.34s call
tests/x.py::test` for each phase), picks the slowest tests by setup + call, runs each alone in one
process (`pytest <test> -n 0 --durations=0`) and prints a table of the two runs' phases and their
ratio. A quiet machine is the point: run it with nothing else on it.

    .venv/bin/python -m pytest --durations=0 | tee suite.log       # the whole suite
    .venv/bin/python tools/suite_alone.py suite.log --top 25 --save alone.json   # then each slow test alone
    .venv/bin/python tools/suite_alone.py suite2.log --alone-from alone.json      # another suite run, same tests

Setup counts only where the test bore it in the suite too (more than SETUP_FLOOR_S there): a module's
shared fixture is set up by its first test in the suite, but by every test run alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DURATION = re.compile(r"^(?P<s>\d+(?:\.\d+)?)s (?P<phase>setup|call|teardown)\s+(?P<test>\S.*?)\s*$")
SETUP_FLOOR_S = 1.0


@dataclass
class Phases:
    setup: float = 0.0
    call: float = 0.0
    teardown: float = 0.0

    def counted(self, bore_setup: bool) -> float:
        return self.call + self.teardown + (self.setup if bore_setup else 0.0)


@dataclass
class Row:
    test: str
    suite: Phases
    alone: Phases

    @property
    def bore_setup(self) -> bool:
        return self.suite.setup > SETUP_FLOOR_S

    @property
    def ratio(self) -> float:
        alone = self.alone.counted(self.bore_setup)
        return self.suite.counted(self.bore_setup) / alone if alone > 0 else float("inf")


def durations(text: str) -> dict[str, Phases]:
    """Every test's phases from pytest's `--durations=0` lines."""
    found: dict[str, Phases] = {}
    for line in text.splitlines():
        m = DURATION.match(line.strip())
        if m:
            setattr(found.setdefault(m["test"], Phases()), m["phase"], float(m["s"]))
    return found


def run_alone(test: str) -> Phases:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", test, "-n", "0", "-q", "--durations=0", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""},
        timeout=900,
    )
    phases = durations(proc.stdout).get(test)
    if proc.returncode != 0 or phases is None:
        raise SystemExit(f"{test} failed alone (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    return phases


def table(rows: list[Row]) -> str:
    lines = [
        "| test | in the suite, s (setup + call) | alone, s (setup + call) | suite / alone |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| `{r.test}` | {r.suite.setup:.1f} + {r.suite.call:.1f} | {r.alone.setup:.1f} + {r.alone.call:.1f} "
            f"| {r.ratio:.2f}x{'' if r.bore_setup else ' (call)'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", type=Path, help="output of a whole-suite run with --durations=0")
    ap.add_argument("--top", type=int, default=25, help="how many of the slowest tests to run alone (default 25)")
    ap.add_argument("--save", type=Path, help="write each test's phases alone to this JSON file")
    ap.add_argument("--alone-from", type=Path, help="take the phases alone from a --save file")
    args = ap.parse_args(argv)
    if args.top < 1:
        ap.error(f"--top={args.top} is out of range: give an integer from 1 up")
    if not args.log.is_file():
        ap.error(f"{args.log}: no such file: give the saved output of `pytest --durations=0`")
    suite = durations(args.log.read_text())
    if not suite:
        ap.error(f"{args.log}: no `--durations=0` lines in it: run the suite with --durations=0")
    saved: dict[str, Phases] = {}
    if args.alone_from:
        saved = {t: Phases(**p) for t, p in json.loads(args.alone_from.read_text()).items()}
        slowest = [t for t in saved if t in suite]
    else:
        slowest = sorted(suite, key=lambda t: -(suite[t].setup + suite[t].call))[: args.top]
    rows = []
    for test in slowest:
        row = Row(test, suite[test], saved[test] if test in saved else run_alone(test))
        print(f"{row.ratio:5.2f}x  {test}", file=sys.stderr, flush=True)
        rows.append(row)
    if args.save:
        args.save.write_text(json.dumps({r.test: vars(r.alone) for r in rows}, indent=1))
    print(table(sorted(rows, key=lambda r: -r.ratio)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

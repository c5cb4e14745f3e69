"""An echo engine's process imports no torch: the engine host and the echo engine stay pure Python,
and only the reference engine's path (runtime/node/engine_host.py main, _build_leader_engine) pulls it
in. Importing torch 2.13 costs about 1.5 CPU-seconds a process, paid by every echo unit a local run,
a rehearsal or the suite starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imported(modules: str) -> list[str]:
    code = (
        f"import sys, {modules}; "
        "print(','.join(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'numpy'})))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-800:]
    return [m for m in proc.stdout.strip().split(",") if m]


def test_the_engine_host_with_the_echo_engine_imports_no_torch():
    assert _imported("runtime.node.engine_host, runtime.engines.echo, runtime.engines.text") == []


def test_the_reference_engine_still_brings_torch():
    # The check above can fail: the same probe sees torch where it is imported.
    assert "torch" in _imported("runtime.engines.reference")

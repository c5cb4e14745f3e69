"""Per-token cost of the engine-process line protocol: a token event encoded by the engine process
and decoded by the supervisor, as typed messages (runtime.node.engine_protocol) against the bare
dicts the protocol used before (their code copied below, as it was).

In-process and CPU-bound: figures move with the machine's load; print them with the load average.
Run: .venv/bin/python -m bench.node.engine_protocol [--tokens N]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from runtime.node.engine_protocol import Token, decode_event, encode  # noqa: E402

RID = "9f1c2d3e4b5a69788796a5b4c3d2e1f0"


def dicts() -> None:
    """The bare-dict path: engine_host built the event's fields, _Out.send wrote them, and
    engine_process read the line into a dict and looked at its op and id."""
    fields = {"token_id": 1234, "text": " the", "finish_reason": None}
    line = json.dumps({"op": "token", "id": RID, **fields}, separators=(",", ":")).encode() + b"\n"
    ev = json.loads(line)
    if ev["op"] == "token" and "id" in ev:
        ev["text"]


def typed() -> None:
    line = encode(Token(id=RID, token_id=1234, text=" the"))
    ev = decode_event(line)
    if isinstance(ev, Token):
        ev.text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=200_000, help="tokens per timing (best of 7)")
    a = ap.parse_args()
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"cpu: {platform.processor() or platform.machine()}; load average: {' '.join(load)}")
    result = {"dicts": float("inf"), "typed": float("inf")}
    for _ in range(7):  # interleaved, best of 7 each: both see the same load
        for name, fn in (("dicts", dicts), ("typed", typed)):
            result[name] = min(result[name], timeit.timeit(fn, number=a.tokens) / a.tokens)
    for name, best in result.items():
        print(f"{name}: {best * 1e6:.2f} us per token (encode + decode)")
    print(f"typed / dicts: {result['typed'] / result['dicts']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

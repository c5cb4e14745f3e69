"""A leader's /health/watch stream, one line at a time: the node writes lines with WatchWriter and the
router reads them with read_watch_line; nothing else makes or splits one.

A line is the whole ready body (contract.ready) when anything beyond its load changed, {"load": {...}}
when only the load did, or empty when nothing did (a heartbeat: the watcher counts silence as death).
Either may carry the routing keys the leader admitted since its last line: "keys" [key, ...], and of
those that came with a completion prompt "prompts" [[key, bytes, tokens, tail], ...] with "marks"
[[checkpoint hash, ...], ...] in the same order. A leader of the revision before marks sends prompts
without them, one before prompts sends keys only: both still read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

# A completion prompt as the router sent it (contract.ROUTE_PROMPT_HEADER, ROUTE_MARKS_HEADER) with
# the engine's token count: (bytes, tokens, tail hash, checkpoint hashes).
RoutePrompt = tuple[int, int, int, tuple[int, ...]]
# A routing key a leader admitted, with its prompt when the router sent one.
Admitted = tuple[int, RoutePrompt | None]
# What the router notes per prompt: (key, bytes, tokens, tail, marks).
NotedPrompt = tuple[int, int, int, int, tuple[int, ...]]

_dumps = json.JSONEncoder(separators=(",", ":")).encode  # built once: json.dumps with options builds one per call


def admitted_fields(admitted: Sequence[Admitted]) -> bytes:
    """The ',"keys":...' (and ',"prompts":...,"marks":...') tail of a line; empty with none admitted."""
    if not admitted:
        return b""
    more = b',"keys":' + _dumps([k for k, _ in admitted]).encode()
    prompts = [(k, p) for k, p in admitted if p is not None]
    if prompts:
        more += b',"prompts":' + _dumps([[k, n, t, h] for k, (n, t, h, _) in prompts]).encode()
        more += b',"marks":' + _dumps([list(p[3]) for _, p in prompts]).encode()
    return more


class WatchWriter:
    """One watcher's stream on the node: remembers what the last line said, so the next says only what
    changed (most lines carry the load alone, and a busy router reads thousands a second)."""

    __slots__ = ("_rest", "_load")

    def __init__(self) -> None:
        self._rest = b""
        self._load = b""

    def line(self, body: dict[str, Any], admitted: Sequence[Admitted] = ()) -> bytes:
        """The next line for a ready body (its to_dict(); its "load" is taken out) and the keys admitted
        since the last line."""
        load = _dumps(body.pop("load")).encode()
        rest = _dumps(body).encode()
        more = admitted_fields(admitted)
        if rest != self._rest:  # the whole body: something beyond the load changed
            line = rest[:-1] + b',"load":' + load + more + b"}\n"
        elif load != self._load or more:  # only the load: a short line, which is most of them
            line = b'{"load":' + load + more + b"}\n"
        else:
            line = b"\n"
        self._rest, self._load = rest, load
        return line


def _orjson() -> Callable[[bytes], object] | None:
    """orjson's loads, or None where it is not installed: the Neuron node images hold the router's
    modules (`python -m runtime --help` loads every subcommand) without the router's pins."""
    try:
        import orjson  # noqa: PLC0415 - optional outside the router's image
    except ImportError:
        return None
    return orjson.loads


_orjson_loads = _orjson()


def watch_json(line: bytes) -> object:
    """One watch line parsed: by orjson, which takes the bytes as they are and parses a load line
    about four times faster than the standard library's scanner (the router's whole reading of one:
    half the time, docs/benchmarks.md, Fleet); thousands of lines a second reach a router from 625
    leaders. What orjson refuses goes to json.loads, which takes what the standard library takes and
    says what is wrong: orjson rejects NaN and Infinity (which json.dumps writes) and integers beyond
    64 bits, raising JSONDecodeError, a ValueError (orjson 3.13.0 README, "Deserialize" and "int")."""
    if _orjson_loads is not None:
        try:
            return _orjson_loads(line)
        except ValueError:
            pass
    return json.loads(line)


# A non-empty line as the router takes it: (keys, prompts, load, body): the keys and prompts it lists,
# and either its load alone (body None) or a whole ready body (load None) for contract.ready.read_ready.
# A plain tuple: the router reads thousands a second, and a class would cost it a tenth of each read.
WatchLine = tuple[list[Any], list[NotedPrompt], dict[str, Any] | None, dict[str, Any] | None]
_NONE: list[Any] = []  # shared, never written: the keys or prompts of a line that lists none


def _prompts(prompts: Any, marks: Any) -> list[NotedPrompt]:
    if marks is not None and (type(marks) is not list or len(marks) != len(prompts)):
        raise ValueError(f"marks is not one list per prompts entry: {marks!r}")
    noted: list[NotedPrompt] = []
    for i, entry in enumerate(prompts):
        k, length, tokens, tail = entry
        if not all(type(v) is int for v in entry):
            raise ValueError(f"a prompts entry is not four integers: {entry!r}")
        m = [] if marks is None else marks[i]  # none from a leader of the revision before marks
        if type(m) is not list or not all(type(v) is int for v in m):
            raise ValueError(f"a marks entry is not a list of integers: {m!r}")
        noted.append((k, length, tokens, tail, tuple(m)))
    return noted


def read_watch_line(line: bytes) -> WatchLine | None:
    """A line as sent (without its newline); None for a heartbeat. ValueError, KeyError or TypeError
    when it is not a watch line (the router then marks the unit's body unreadable)."""
    if not line.strip():
        return None
    body = watch_json(line)
    if not isinstance(body, dict):
        raise ValueError("a watch line is not a JSON object")
    keys = body.get("keys") or _NONE
    prompts = body.get("prompts") if keys else None
    noted = _prompts(prompts, body.get("marks")) if prompts else _NONE
    if "state" not in body:  # only the load changed: the rest of the last body holds
        load = body["load"]
        if type(load) is not dict:
            raise TypeError(f"a watch line's load is not an object: {load!r}")
        return keys, noted, load, None
    return keys, noted, None, body

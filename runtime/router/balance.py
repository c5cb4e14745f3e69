"""How a router picks a unit: the power of d choices over routable units, by estimated load.

Many routers each see every unit's load as of its last report. Sending to the least-loaded unit of
such a view makes the routers herd: all of them pick the same unit until its next report. Sampling
d units at random and taking the least loaded of them (Mitzenmacher, "The Power of Two Choices in
Randomized Load Balancing", IEEE TPDS 2001, which also treats d > 2; Envoy's LEAST_REQUEST samples
two by default) spreads the herd and still avoids busy units. bench/fleet/policy_sim.py measured the
policies against each other and against one central queue (docs/benchmarks.md, Fleet): with load
reported within 50 ms, four choices kept p99 queue wait at the ideal's where two did not. This
module is the code both the router and that model run.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import random
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Generic, Protocol, TypeVar

from runtime.router.body import json_object

# Units sampled per pick (measured: docs/benchmarks.md, Fleet).
CHOICES = 4


class LoadView(Protocol):
    """What a router knows of one unit: its last report plus its own requests in flight."""

    in_flight: int  # reported: requests the leader holds; -1 when it does not say (older revision)
    queue_depth: int  # reported: requests waiting for a batch slot
    running: int  # reported: sequences in the batch
    kv_cache_used: float  # reported
    outstanding: int  # this router's requests in flight to the unit, exact and current
    outstanding_at_report: int  # the same count when the last report was taken


U = TypeVar("U", bound=LoadView)


def estimated_load(u: LoadView) -> int:
    """Requests the unit holds as far as this router can tell: the last report, plus what this router
    sent since, minus what it got back since (both already inside the report otherwise)."""
    reported = u.in_flight if u.in_flight >= 0 else u.queue_depth + u.running
    est = reported + u.outstanding - u.outstanding_at_report
    return est if est > 0 else 0


def _key(u: LoadView) -> tuple[int, float]:
    # KV-cache use breaks ties: of two units holding as many requests, the one with room for
    # longer ones.
    return (estimated_load(u), u.kv_cache_used)


def least_loaded(candidates: Sequence[U], usable: Callable[[U], bool], rng: random.Random) -> U | None:
    """The usable unit with the lowest estimated load (ties by KV-cache use, then at random)."""
    best: U | None = None
    best_key: tuple[int, float, float] | None = None
    for u in candidates:
        if not usable(u):
            continue
        key = (*_key(u), rng.random())
        if best_key is None or key < best_key:
            best, best_key = u, key
    return best


def sample_choices(
    candidates: Sequence[U],
    usable: Callable[[U], bool],
    rng: random.Random,
    *,
    choices: int = CHOICES,
    draws: int = 16,
) -> U | None:
    """The least loaded of `choices` distinct usable units drawn at random (ties by KV-cache use,
    then at random); fewer if `draws` draws found fewer; None if they found none (the caller then
    scans, which also tells "every unit saturated" from "none routable")."""
    n = len(candidates)
    if n <= choices:
        return least_loaded(candidates, usable, rng)
    best: U | None = None
    best_key: tuple[int, float, float] | None = None
    seen: set[int] = set()
    found = 0
    for _ in range(draws):
        i = int(rng.random() * n)
        if i in seen:
            continue
        seen.add(i)
        u = candidates[i]
        if not usable(u):
            continue
        key = (*_key(u), rng.random())
        if best_key is None or key < best_key:
            best, best_key = u, key
        found += 1
        if found == choices:
            break
    return best


# --- Routing by cache and by work -----------------------------------------------------------------
# A conversation resends its system prompt and every turn before the new one, so the unit that served
# its last turn holds most of the new prompt's KV cache. A router routes a request with a key (the
# client's session, else a hash of the prompt's leading messages) to the unit the key hashes to, so
# that every router agrees without sharing state, unless that unit holds more than (1 + BOUND_EPS) x
# the mean requests per unit ("consistent hashing with bounded loads": Mirrokni, Thorup, Zadimoghaddam,
# SODA 2018), then to the next unit on the ring, at most WALK units, then to the least work of CHOICES
# sampled units. Work is the unit's outstanding prefill tokens (docs/routing.md). The constants were
# chosen with bench/fleet/trace_sim.py (docs/benchmarks.md, Routing by cache).

# Points per unit on the hash ring: with v points per unit the largest unit's share of the key
# space is within about 1 + O(sqrt(log n / v)) of the mean (Karger et al., STOC 1997).
VNODES = 64
# How far above the mean a preferred unit may go before its keys move on (the paper's epsilon).
BOUND_EPS = 1.0
# Units tried along the ring before falling back to sampled least work.
WALK = 1
# How much longer an estimated wait the preferred unit may have than the sampled one and still win, as a
# multiple of the tokens of the request it is expected to hold (its earlier turns, or its key's lead
# tokens): the prefill another unit would do again, work that delays every request queued behind it
# there. Nothing for a request it is expected to hold nothing of, such as a first turn: keeping that one
# gains no cache, and it waited behind another prompt on its ring unit while a unit stood idle. Units
# report their queued prompts net of what their cache holds of each, so a holder's queue is not
# overstated either (beyond a router's own sends of the last 50 ms, counted whole). Against a quarter of
# the whole prompt, on real engines with later turns resending their previous prompt (an AMD EPYC host,
# four runs at 1.0 and 1.4 req/s, three at 0.4), it kept 86-97 % of the oracle's hits where a quarter
# kept 82-95 %, and answered as many requests within the targets or more (76-77 against 71-73 % at 1.4
# req/s, past capacity); the fleet model finds it faster on both traces. A later turn the router credits
# with nothing goes by work alone: while only a whole resend of a completion prompt was credited, a
# replay of the trace's own hashes (most later turns resending all but their previous prompt's last
# block) answered no more within the targets past capacity than today's policy; with KeyPrompts'
# checkpoints it answers as many as with resent prompts (docs/benchmarks.md, Routing by cache,
# "The slack decided" and "Checkpoints").
AFFINITY_SLACK = 1.0
# Units sampled for the least-work fallback of routing by cache: more than CHOICES because the estimate
# counts this router's own sends at once, which spreads routers without the herding that sampling by
# request count suffers (measured: docs/benchmarks.md, Routing by cache).
CACHE_CHOICES = 8
# Keys whose last unit a router remembers (least recently used forgotten): a conversation's turns come
# seconds to minutes apart; 65,536 keys cost the router about 8 MiB (measured with tracemalloc).
HOLDER_KEYS = 65536
# A prompt's tokens estimated from its bytes, without the model's tokenizer: English text runs about
# four bytes per token under BPE tokenizers (OpenAI's tokenizer guide: "1 token ~= 4 chars in English").
BYTES_PER_TOKEN = 4


class WorkView(LoadView, Protocol):
    """What a router knows of one unit's work: the last report plus its own sends since."""

    max_running: int  # reported: batch slots (0: not said)
    # reported: prompt tokens accepted and not yet at their first token, less what the unit's cache held
    # of each at acceptance; -1: not said
    prefill_tokens: int
    sent_tokens: int  # this router's estimated prompt tokens sent to the unit, ever (whole prompts)
    sent_tokens_at_report: int  # the same when the last report was taken
    tokens_per_step: float  # reported: tokens an answer gains per decode step (speculation); 0: not said


W = TypeVar("W", bound=WorkView)


def estimated_prefill(u: WorkView, new_tokens: int = 0) -> int:
    """Prefill tokens ahead of a new request on the unit: its last report plus what this router sent
    since (a report comes within tens of milliseconds of a change, so those are still prefilling). A
    unit that does not report them (an older revision: -1) is taken to queue prompts like this one."""
    reported = u.prefill_tokens if u.prefill_tokens >= 0 else u.queue_depth * new_tokens
    est = reported + u.sent_tokens - u.sent_tokens_at_report
    return est if est > 0 else 0


def waiting_for_slot(u: WorkView) -> int:
    """Running answers that must end before a new request finds a batch slot on the unit: the requests
    it holds, the new one counted, beyond its slots (0 when it does not say how many it has). A unit with
    every slot taken and none waiting makes the new request wait for one answer, not none."""
    waiting = estimated_load(u) + 1 - u.max_running if u.max_running > 0 else 0
    return waiting if waiting > 0 else 0


def has_free_slot(u: WorkView) -> bool:
    """Whether a new request finds a batch slot free on the unit, as far as this router can tell (always
    when it does not say how many it has): where every slot is taken, it waits for a running answer to
    end, however short the prefill queue."""
    return waiting_for_slot(u) == 0


def can_prefer(u: W, usable: Callable[[W], bool], bound: float) -> bool:
    """Whether a key's unit may take the request: usable, below the load bound with it, and with a
    batch slot free for it."""
    return usable(u) and estimated_load(u) + 1 <= bound and has_free_slot(u)


def estimated_ttft(u: WorkView, new_tokens: int) -> float:
    """Time to first token in units of one prefill token's time: the prefill ahead plus the request's
    own, and a prompt like this one for each running answer that must end before it finds a batch slot
    (waiting_for_slot: the requests waiting there are prompts too, and a unit of an older revision does
    not report its prefill). A unit whose answers gain several tokens per decode step (speculative
    decoding: tokens_per_step) ends them that many times sooner, so each one it must wait for counts
    that much less. Only the order matters: the units of one fleet run the same model."""
    speed = u.tokens_per_step if u.tokens_per_step > 1.0 else 1.0  # 0: not said, as by an older revision
    return float(estimated_prefill(u, new_tokens) + new_tokens * (1 + waiting_for_slot(u) / speed))


def least_work(
    candidates: Sequence[W],
    usable: Callable[[W], bool],
    rng: random.Random,
    new_tokens: int,
    *,
    choices: int = CHOICES,
    draws: int = 16,
) -> W | None:
    """The usable unit of the lowest estimated time to first token among `choices` distinct units drawn
    at random (all of them when there are no more than that); ties by requests held, then at random."""
    n = len(candidates)
    best: W | None = None
    best_key: tuple[float, int, float] | None = None
    if n <= choices:
        pool: Sequence[W] = candidates
    else:
        seen: set[int] = set()
        picked: list[W] = []
        for _ in range(draws):
            i = int(rng.random() * n)
            if i in seen:
                continue
            seen.add(i)
            if usable(candidates[i]):
                picked.append(candidates[i])
                if len(picked) == choices:
                    break
        pool = picked
    for u in pool:
        if n <= choices and not usable(u):
            continue
        key = (estimated_ttft(u, new_tokens), estimated_load(u), rng.random())
        if best_key is None or key < best_key:
            best, best_key = u, key
    return best


def key_hash(data: bytes) -> int:
    """64 bits of a key, the same in every router process (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def ring_points(name: str, vnodes: int = VNODES) -> list[int]:
    """A unit's points on the ring, from its name alone, so every router places it alike."""
    return [key_hash(f"{name}#{i}".encode()) for i in range(vnodes)]


class Ring(Generic[W]):
    """Consistent hashing over units: a key's preference order is the units met walking clockwise
    from its hash; a lookup is a binary search. Kept in step with the routable units by update(): a
    unit that joins or leaves inserts or removes only its own points: at 640 units (41,000 points)
    on a busy 2-core machine one unit leaving or joining took 0.6-0.8 ms, a rebuild 260 ms, a stall of
    the router's event loop long enough to time out connections."""

    __slots__ = ("_members", "_owners", "_points", "_points_of")

    def __init__(self, units: Sequence[W], points: Callable[[W], list[int]]) -> None:
        self._points: list[int] = []
        self._owners: list[W] = []
        self._points_of = points
        self._members: dict[int, tuple[W, list[int]]] = {}  # id(unit) -> (unit, the points it was placed at)
        self.update(units)

    def __len__(self) -> int:
        return len(self._members)

    def update(self, units: Sequence[W]) -> None:
        """Make the ring hold exactly `units`."""
        wanted = {id(u): u for u in units}
        gone = [k for k in self._members if k not in wanted]
        new = [u for k, u in wanted.items() if k not in self._members]
        if len(gone) + len(new) > len(wanted) // 4:  # a large change: sorting once is cheaper
            self._members = {k: (u, self._points_of(u)) for k, u in wanted.items()}
            pairs = sorted((p, i) for i, (_, pts) in enumerate(self._members.values()) for p in pts)
            owners = [u for u, _ in self._members.values()]
            self._points = [p for p, _ in pairs]
            self._owners = [owners[i] for _, i in pairs]
            return
        for k in gone:
            u, pts = self._members.pop(k)
            for p in pts:
                i = bisect.bisect_left(self._points, p)
                while self._owners[i] is not u:  # another unit's point at the same 64-bit hash
                    i += 1
                del self._points[i], self._owners[i]
        for u in new:
            pts = self._points_of(u)
            self._members[id(u)] = (u, pts)
            for p in pts:
                i = bisect.bisect_right(self._points, p)
                self._points.insert(i, p)
                self._owners.insert(i, u)

    def walk(self, key: int) -> Iterator[W]:
        """Distinct units in the key's preference order."""
        n = len(self._points)
        if n == 0:
            return
        start = bisect.bisect_left(self._points, key)
        seen: set[int] = set()
        for j in range(n):
            owner = self._owners[(start + j) % n]
            if id(owner) not in seen:
                seen.add(id(owner))
                yield owner
                if len(seen) == len(self._members):
                    return


def load_bound(mean_load: float, units: int, eps: float = BOUND_EPS) -> int:
    """Requests a unit may hold, the new one included, and still take a key's new request: the paper's
    ceil((1 + eps) m / n) with m counting the request being placed (so an idle fleet's bound is 1)."""
    return math.ceil((1 + eps) * (mean_load + 1 / max(1, units)))


def by_key(
    ring: Ring[W],
    key: int,
    usable: Callable[[W], bool],
    mean_load: float,
    *,
    eps: float = BOUND_EPS,
    walk: int = WALK,
) -> W | None:
    """The first of the key's `walk` preferred units that is usable, below the load bound and with a
    batch slot free for the request; None when none is (the caller then takes the least work of a
    sample)."""
    bound = load_bound(mean_load, len(ring), eps)
    for i, u in enumerate(ring.walk(key)):
        if i >= walk:
            return None
        if can_prefer(u, usable, bound):
            return u
    return None


V = TypeVar("V")


class KeyHolders(Generic[V]):
    """The unit that took each key's latest request, as far as this router knows: its own sends at
    once, and the keys every unit reports it admitted (`keys` of its watch lines, sent by any router),
    so that every router follows a conversation that left its key's unit. Bounded: the least recently
    noted keys are forgotten (a forgotten key falls back to the ring). KeyPrompts keeps its prompt
    summaries per key in one too."""

    __slots__ = ("_units", "capacity")

    def __init__(self, capacity: int = HOLDER_KEYS) -> None:
        self.capacity = capacity
        self._units: OrderedDict[int, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._units)

    def note(self, key: int, unit: V) -> None:
        units = self._units
        units[key] = unit
        units.move_to_end(key)
        if len(units) > self.capacity:
            units.popitem(last=False)

    def get(self, key: int) -> V | None:
        return self._units.get(key)


# The trailing bytes of a completion prompt a router remembers per key. A completion prompt carries no
# turns to tell its cached part by (a chat's earlier messages do: request_key), so a router remembers the
# last prompt it sent under each key: a later prompt of the key with the same bytes before that length
# is taken to resend it (the conversation's next turn, rendered by the client) and its unit to hold it.
PROMPT_TAIL_BYTES = 64
# And the same hash before each of 1/2, 3/4, 7/8 and 15/16 of that length: a later prompt that resends
# all but the end of the last one (a client that re-renders or trims the end of its last turn, token ids
# whose last few change once more text follows them) is credited with the tokens before the furthest of
# these checkpoints it resends, in proportion to the bytes, instead of nothing.
PROMPT_CHECKPOINTS = 4


def prompt_checkpoints(length: int) -> tuple[int, ...]:
    """The byte offsets of a prompt of `length` bytes whose preceding PROMPT_TAIL_BYTES a router
    remembers besides its end, the furthest first: length - length / 2**i for i = 4, 3, 2, 1."""
    return tuple(length - (length >> i) for i in range(PROMPT_CHECKPOINTS, 0, -1))


def _window_hash(prompt: bytes, end: int) -> int:
    return key_hash(prompt[max(0, end - PROMPT_TAIL_BYTES) : end])


class KeyPrompts:
    """Per key, the last completion prompt sent under it, by this router or, as the units report them
    (`prompts` and `marks` of their watch lines), by another: its length in bytes, its tokens, the hash
    of its last PROMPT_TAIL_BYTES bytes and the hashes at its checkpoints (prompt_checkpoints), kept in a
    KeyHolders (bounded the same way): 65,536 keys cost about 32 MiB (measured with tracemalloc)."""

    __slots__ = ("_prompts",)

    def __init__(self, capacity: int = HOLDER_KEYS) -> None:
        self._prompts: KeyHolders[tuple[int, int, int, tuple[int, ...]]] = KeyHolders(capacity)

    def __len__(self) -> int:
        return len(self._prompts)

    @staticmethod
    def summary(prompt: bytes) -> tuple[int, int, tuple[int, ...]]:
        """What is kept of a prompt besides its tokens: its length in bytes, the hash of its tail and
        the hashes at its checkpoints, the furthest first (also what the router tells the unit,
        contract.ROUTE_PROMPT_HEADER and contract.ROUTE_MARKS_HEADER)."""
        n = len(prompt)
        return n, _window_hash(prompt, n), tuple(_window_hash(prompt, c) for c in prompt_checkpoints(n))

    def note(self, key: int, length: int, tokens: int, tail: int, marks: tuple[int, ...] = ()) -> None:
        """The key's latest prompt: this router's own send (RequestKey.prompt_summary), or another
        router's as its unit reports it (`prompts` and `marks` of a watch line; a unit of an older
        revision reports no marks, and a resend of the whole prompt is still credited)."""
        self._prompts.note(key, (length, tokens, tail, marks))

    def cached(self, key: int, prompt: bytes) -> int:
        """Tokens of the key's last prompt if `prompt` resends it; if it resends it only up to one of its
        checkpoints, the tokens before the furthest such, in proportion to the bytes; 0 if neither, or
        if the key is unknown."""
        last = self._prompts.get(key)
        if last is None:
            return 0
        length, tokens, tail, marks = last
        if len(prompt) >= length and _window_hash(prompt, length) == tail:
            return tokens
        for end, mark in zip(prompt_checkpoints(length), marks):
            if len(prompt) >= end and _window_hash(prompt, end) == mark:
                return tokens * end // length
        return 0


def by_cache_and_work(
    ring: Ring[W],
    candidates: Sequence[W],
    usable: Callable[[W], bool],
    rng: random.Random,
    *,
    key: int | None,
    tokens: int,
    cached: int,
    mean_load: float,
    holder: W | None = None,
    lead: int = 0,
    eps: float = BOUND_EPS,
    walk: int = WALK,
    choices: int = CACHE_CHOICES,
    slack: float = AFFINITY_SLACK,
) -> W | None:
    """The shipped policy: the unit expected to hold the key's cache against the least work of `choices`
    sampled units, whichever has the lower estimated time to first token, the first counting only the
    tokens it is not expected to hold (`tokens` - `cached`) and winning while its estimate is longer by
    at most `slack` x the tokens it is expected to hold. The unit expected to hold the cache is
    `holder`, the unit that took the key's latest request (KeyHolders), when it is usable, below the
    load bound and has a batch slot free; else the key's preferred unit on the ring under the same
    conditions (within `walk` steps). `lead`: tokens every request of the key begins with
    (RequestKey.lead_tokens), which the holder holds whoever sent the request it took, so they count as
    cached there too. Without a key: the sampled least work."""
    sampled = least_work(candidates, usable, rng, tokens, choices=choices)
    if key is None:
        return sampled
    preferred: W | None = None
    if holder is not None:
        bound = load_bound(mean_load, len(ring), eps)
        if can_prefer(holder, usable, bound):
            preferred = holder
    if preferred is None:
        preferred = by_key(ring, key, usable, mean_load, eps=eps, walk=walk)
    if preferred is None:
        return sampled
    if sampled is None or sampled is preferred:
        return preferred
    if preferred is holder and lead > cached:
        cached = lead
    new = tokens - cached if tokens > cached else 0
    if estimated_ttft(preferred, new) <= estimated_ttft(sampled, tokens) + slack * (tokens - new):
        return preferred
    return sampled


@dataclass(frozen=True)
class RequestKey:
    """What the router reads from a request to route it: its affinity key (None: route by work
    alone) and its prompt size in estimated tokens."""

    key: int | None
    tokens: int
    source: str  # session | prefix | none
    cached: int = 0  # estimated tokens its key's unit already holds: what it resends of earlier turns
    prompt: bytes = b""  # a completion prompt, as KeyPrompts compares it (its text, or its token ids)
    # Estimated tokens every request of its key begins with: what a prefix key hashes (the chat's leading
    # messages, the completion prompt's first bytes or ids), which any unit that took a request of the
    # key holds, another conversation's included (a shared opening question); 0 for a session key.
    lead_tokens: int = 0

    @cached_property
    def prompt_summary(self) -> tuple[int, int, tuple[int, ...]]:
        """KeyPrompts.summary of the prompt, worked out once per request: the proxy tells the unit,
        and the pick notes it."""
        return KeyPrompts.summary(self.prompt)


# The leading bytes of a completion prompt keyed on: about 1024 tokens (two of the trace's 512-token
# blocks), past a shared system prompt and into the conversation's own text.
PREFIX_KEY_BYTES = 4096


def request_key(body: bytes, session: str | None = None) -> RequestKey:
    """The request's key, from its raw JSON body: the session (the header's value, then the OpenAI
    `user` field), else a hash of the chat's leading messages up to and including the first user
    message (every later turn of the conversation resends them unchanged), else of the completion
    prompt's first PREFIX_KEY_BYTES. Its cached tokens: the messages before the last user message,
    which the conversation's previous turn left in its unit's cache. A body the router cannot read is
    routed by work alone; the unit then answers its error."""
    tokens = len(body) // BYTES_PER_TOKEN
    doc = json_object(body) or {}
    user = doc.get("user")
    if not session and isinstance(user, str) and user:
        session = user
    key: int | None = key_hash(b"s:" + session.encode()) if session else None
    messages = doc.get("messages")
    prompt = doc.get("prompt")
    if isinstance(messages, list) and messages:
        users = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"]
        cached = 0
        if len(users) > 1:  # a later turn: its unit holds the turns before (the first holds nothing special)
            earlier = json.dumps(messages[: users[-1]], separators=(",", ":")).encode()
            cached = min(tokens, len(earlier) // BYTES_PER_TOKEN)
        if key is not None:
            return RequestKey(key, tokens, "session", cached)
        lead = messages[: users[0] + 1] if users else messages
        raw = json.dumps(lead, sort_keys=True, separators=(",", ":")).encode()[:PREFIX_KEY_BYTES]
        return RequestKey(
            key_hash(b"m:" + raw), tokens, "prefix", cached, lead_tokens=min(tokens, len(raw) // BYTES_PER_TOKEN)
        )
    text = b""
    ids: list[int] | None = None
    if isinstance(prompt, str) and prompt:
        text = prompt.encode()
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt[:8]):
        ids = prompt
        tokens = len(ids)
        # Each id closed by a comma, so a prompt's bytes begin with an earlier prompt's exactly when its
        # ids begin with that prompt's ids ("[1,2,3," is not a prefix of "[1,2,34,").
        text = json.dumps(ids, separators=(",", ":")).encode()[:-1] + b","
    if key is not None:
        return RequestKey(key, tokens, "session", prompt=text)
    if ids is not None:
        lead_ids = ids[: PREFIX_KEY_BYTES // BYTES_PER_TOKEN]
        key = key_hash(b"t:" + ",".join(str(t) for t in lead_ids).encode())
        return RequestKey(key, tokens, "prefix", prompt=text, lead_tokens=len(lead_ids))
    if text:
        lead_text = text[:PREFIX_KEY_BYTES]
        return RequestKey(
            key_hash(b"p:" + lead_text),
            tokens,
            "prefix",
            prompt=text,
            lead_tokens=min(tokens, len(lead_text) // BYTES_PER_TOKEN),
        )
    return RequestKey(None, tokens, "none")

"""The leader's index of cached KV blocks: which prompt prefixes every rank holds KV for.

A block is BLOCK_TOKENS consecutive prompt tokens, keyed by a chained hash (the hash of the
previous block's key and this block's tokens), so a key names the whole prefix up to the block's
end, as vLLM's V1 prefix cache does (vllm-project/vllm vllm/v1/core/kv_cache_utils.py,
hash_block_tokens / hash_request_tokens: hash of (parent block hash, block token ids, extra keys);
only full blocks are hashed). The KV itself lives on every rank in the prefill layout
(executor.BlockStore); this index decides, and the step command tells the ranks which blocks to
copy into a new sequence, which to store from it and which to drop.

Reference counts: a block is pinned from the admission that matched or allocated it until the step
that copied or stored it has run, so an admission in the same iteration that evicts for room never
takes a block another admitted request is about to read. Unpinned blocks are evicted least recently
used first; a request's blocks are released tail first, so the tail of a prefix goes before its
head (vllm/v1/core/kv_cache_manager.py KVCacheManager.free: "We free the blocks in reverse order so
that the tail blocks are evicted first when caching is enabled").
"""

from __future__ import annotations

import collections
import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Sequence

# Tokens per cached block: vLLM's default block size on GPUs (CacheConfig.block_size 16). A smaller
# block finds more of a shared prefix; a larger one costs fewer copies and less bookkeeping.
BLOCK_TOKENS = 16
_ROOT = b"flotilla-prefix-root"


def block_hashes(token_ids: Sequence[int], block_tokens: int = BLOCK_TOKENS) -> list[bytes]:
    """The chained key of every full block of token_ids (a partial last block has none)."""
    out, parent = [], _ROOT
    for a in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        h = hashlib.sha256(parent)
        h.update(b"".join(int(t).to_bytes(4, "little") for t in token_ids[a : a + block_tokens]))
        parent = h.digest()
        out.append(parent)
    return out


@dataclass
class _Block:
    block_id: int
    key: bytes
    refs: int = 0
    ready: bool = False  # its KV is stored on every rank (after the step that stores it ran)


@dataclass
class Plan:
    """What one admitted prompt gets from the cache and gives to it."""

    hit: list[int] = field(default_factory=list)  # block ids to copy in, in order from position 0
    store: list[tuple[int, int]] = field(default_factory=list)  # (block number in the prompt, new block id)

    @property
    def pinned(self) -> list[int]:
        return self.hit + [b for _, b in self.store]


class PrefixCache:
    """Block index, reference counts and LRU order (leader only). Sizes are in tokens."""

    def __init__(self, block_tokens: int = BLOCK_TOKENS) -> None:
        self.block_tokens = block_tokens
        self._by_key: dict[bytes, _Block] = {}
        self._by_id: dict[int, _Block] = {}
        # Unpinned blocks, least recently used first: the eviction order.
        self._lru: collections.OrderedDict[int, _Block] = collections.OrderedDict()
        self._ids = itertools.count()
        self.dropped: list[int] = []  # evicted since the last take_dropped(): the ranks drop them too
        # vLLM's prefix-cache counters, in tokens (vllm:prefix_cache_queries / vllm:prefix_cache_hits).
        self.queries = 0
        self.hits = 0

    @property
    def tokens(self) -> int:
        """KV tokens the cache holds (pinned or not): what it takes of the KV budget."""
        return len(self._by_id) * self.block_tokens

    @property
    def evictable_tokens(self) -> int:
        return len(self._lru) * self.block_tokens

    def block_ids(self) -> list[int]:
        return list(self._by_id)

    def refs(self, block_id: int) -> int:
        return self._by_id[block_id].refs

    def holds(self, block_id: int) -> bool:
        return block_id in self._by_id

    def _longest(self, keys: Sequence[bytes], n_tokens: int) -> list[int]:
        """Block ids of the longest stored prefix. At least one prompt token is always left to
        compute, for the logits of the first output token (vLLM: max_cache_hit_length =
        num_tokens - 1 in KVCacheManager.get_computed_blocks)."""
        limit = (n_tokens - 1) // self.block_tokens
        hit = []
        for key in keys[:limit]:
            b = self._by_key.get(key)
            if b is None or not b.ready:
                break
            hit.append(b.block_id)
        return hit

    def match(self, keys: Sequence[bytes], n_tokens: int) -> list[int]:
        """Block ids of the longest stored prefix, pinned."""
        hit = self._longest(keys, n_tokens)
        self._pin(hit)
        return hit

    def held(self, keys: Sequence[bytes], n_tokens: int) -> int:
        """Tokens a prompt would take from the cache if admitted now: match without pinning, counted
        nowhere. Only single-key dict reads, so another thread may ask while the scheduler changes
        the cache (an answer a step stale is still an estimate)."""
        return len(self._longest(keys, n_tokens)) * self.block_tokens

    def count(self, n_tokens: int, hit_blocks: int) -> None:
        """An admitted prompt's query and hit, as vLLM counts them: every prompt token is queried."""
        self.queries += n_tokens
        self.hits += hit_blocks * self.block_tokens

    def allocate(self, keys: Sequence[bytes], start: int, room_tokens: int) -> list[tuple[int, int]]:
        """New pinned blocks for keys[start:] not yet held, in order, while room_tokens lasts (after
        evicting what it must). Stops at the first key it cannot hold: a stored block is reachable
        only through the blocks before it."""
        out = []
        for i in range(start, len(keys)):
            if keys[i] in self._by_key:
                continue  # held already (ready, or stored by another prompt of this step)
            if room_tokens < self.block_tokens:
                break
            b = _Block(block_id=next(self._ids), key=keys[i], refs=1)
            self._by_key[b.key] = self._by_id[b.block_id] = b
            out.append((i, b.block_id))
            room_tokens -= self.block_tokens
        return out

    def evict(self, tokens: int) -> int:
        """Drop least recently used unpinned blocks until `tokens` are free or none is left;
        returns the tokens freed."""
        freed = 0
        while freed < tokens and self._lru:
            block_id, b = self._lru.popitem(last=False)
            del self._by_id[block_id], self._by_key[b.key]
            self.dropped.append(block_id)
            freed += self.block_tokens
        return freed

    def take_dropped(self) -> list[int]:
        out, self.dropped = self.dropped, []
        return out

    def done(self, plan: Plan) -> None:
        """The step that used the plan ran: stored blocks become matchable, and the plan's pins go,
        tail first into the LRU order so a prefix's tail is evicted before its head."""
        for _, block_id in plan.store:
            self._by_id[block_id].ready = True
        self.release(plan.pinned)

    def release(self, block_ids: Sequence[int]) -> None:
        for block_id in reversed(block_ids):
            b = self._by_id[block_id]
            b.refs -= 1
            if b.refs == 0:
                if not b.ready:  # never stored (its step did not run): nobody can read it
                    del self._by_id[block_id], self._by_key[b.key]
                    self.dropped.append(block_id)
                    continue
                self._lru[block_id] = b
                self._lru.move_to_end(block_id)

    def _pin(self, block_ids: Sequence[int]) -> None:
        for block_id in block_ids:
            b = self._by_id[block_id]
            b.refs += 1
            self._lru.pop(block_id, None)

"""API keys and per-key limits in front of the proxy (runtime/router/access.py): 401 in OpenAI's error
shape without a valid key, 429 + Retry-After for one key over its limit while other keys pass, batch
keys shed before interactive ones, revocation within the keys' TTL, the key never passed on."""

from __future__ import annotations

import json
import math

import aiohttp
import pytest
from router_standins import StandInUnit
from router_testkit import metrics_url, post, router_over, run, wait_for

from contract.apikeys import (
    BYTES_PER_TOKEN,
    DEFAULT_COMPLETION_ESTIMATE,
    KeyEntry,
    KeySet,
    KeySetError,
    digest,
    new_key,
)
from runtime.router.access import AccessControl, KeyLimits, estimate_tokens


class Clock:
    """A clock the test moves: limits then depend on what the test says, not on the machine's speed."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Secret:
    """The keys' secret as the router reads it; None: not created yet."""

    def __init__(self, keys: KeySet | None = None) -> None:
        self.value = keys.dumps() if keys is not None else None

    def read(self) -> str | None:
        return self.value


def issue(name: str, **limits) -> tuple[str, str, KeyEntry]:
    kid, key = new_key()
    return kid, key, KeyEntry(name=name, sha256=digest(key), **limits)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_missing_wrong_and_valid_keys_get_401_401_and_200_and_the_unit_never_sees_the_key(capsys):
    kid, key, entry = issue("shop-frontend")

    async def scenario():
        a = await StandInUnit(name="a").start()
        access = AccessControl(read=Secret(KeySet({kid: entry})).read, ttl_s=60)
        async with router_over([a], access=access) as router, aiohttp.ClientSession() as s:
            missing = await post(s, router)
            wrong = await post(s, router, headers=bearer(key[:-1] + ("A" if key[-1] != "A" else "B")))
            ok = await post(s, router, headers=bearer(key))
            models = await post(s, router, path="/v1/models")  # every /v1 path, not only completions
            async with s.get(f"http://127.0.0.1:{router.port}/health") as health:
                health_status = health.status
        await a.stop()
        return missing, wrong, ok, models, health_status, a.authorizations

    missing, wrong, ok, models, health_status, seen = run(scenario())
    for (status, _headers, body), code in ((missing, "missing_api_key"), (wrong, "invalid_api_key")):
        assert status == 401
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"}  # OpenAI's error object
        assert error["code"] == code and error["type"] == "invalid_request_error"
    assert ok[0] == 200 and json.loads(ok[2])["choices"]
    assert models[0] == 401
    assert health_status == 200  # the ALB's health check needs no key
    assert seen == []  # Authorization never forwarded
    err = capsys.readouterr().err
    assert key not in err and key[-20:] not in err  # never logged, not even in part
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert [(r["status"], r["key_id"]) for r in lines if r.get("event") == "router_request"] == [(200, kid)]


def test_one_key_over_its_request_rate_gets_429_with_retry_after_while_another_key_all_succeed():
    slow_id, slow_key, slow = issue("batch-job", requests_per_s=2.0)
    free_id, free_key, free = issue("checkout")
    clock = Clock()

    async def scenario():
        a = await StandInUnit(name="a").start()
        access = AccessControl(read=Secret(KeySet({slow_id: slow, free_id: free})).read, clock=clock)
        async with router_over([a], access=access) as router, aiohttp.ClientSession() as s:
            limited = [await post(s, router, headers=bearer(slow_key)) for _ in range(5)]
            others = [await post(s, router, headers=bearer(free_key)) for _ in range(20)]
            clock.t += 0.5  # half a second refills one request at 2 requests/s
            after = await post(s, router, headers=bearer(slow_key))
            async with s.get(metrics_url(router)) as r:
                metrics = await r.text()
        await a.stop()
        return limited, others, after, metrics

    limited, others, after, metrics = run(scenario())
    # A burst of one second's worth (2), then 429 until the bucket refills.
    assert [status for status, _, _ in limited] == [200, 200, 429, 429, 429]
    status, headers, body = limited[2]
    assert headers["Retry-After"] == "1"  # (1 - 0) / 2 per s = 0.5 s, rounded up to whole seconds
    assert json.loads(body)["error"]["code"] == "rate_limit_exceeded"
    assert [status for status, _, _ in others] == [200] * 20
    assert after[0] == 200
    assert f'flotilla_router_key_requests_total{{key_id="{slow_id}",outcome="rate_limited"}} 3.0' in metrics
    assert f'flotilla_router_key_requests_total{{key_id="{free_id}",outcome="admitted"}} 20.0' in metrics


def test_tokens_per_minute_count_the_prompt_bytes_and_max_tokens_and_say_how_long_to_wait():
    kid, key, entry = issue("summaries", tokens_per_min=600)
    clock = Clock()
    payload = {"model": "tiny", "prompt": "hello there", "max_tokens": 500}
    body = json.dumps(payload).encode()
    cost = math.ceil(len(body) / BYTES_PER_TOKEN) + 500
    assert estimate_tokens(body) == cost
    assert estimate_tokens(b'{"prompt": "x"}') == math.ceil(15 / BYTES_PER_TOKEN) + DEFAULT_COMPLETION_ESTIMATE

    async def scenario():
        a = await StandInUnit(name="a").start()
        access = AccessControl(read=Secret(KeySet({kid: entry})).read, clock=clock)
        async with router_over([a], access=access) as router, aiohttp.ClientSession() as s:
            out = []
            for _ in range(3):
                async with s.post(
                    f"http://127.0.0.1:{router.port}/v1/completions", data=body, headers=bearer(key)
                ) as resp:
                    out.append((resp.status, resp.headers.get("Retry-After")))
        await a.stop()
        return out

    out = run(scenario())
    # 600 in the bucket: the first request leaves 600 - cost > 0, the second takes it below zero,
    # the third waits for the overdraft at 600 tokens per 60 s.
    assert [s for s, _ in out] == [200, 200, 429]
    assert out[2][1] == str(math.ceil((2 * cost - 600) / (600 / 60)))


def test_each_of_n_routers_admits_one_nth_of_a_key_s_limit():
    kid, _key, entry = issue("k", requests_per_s=40.0, tokens_per_min=60_000)
    clock = Clock()
    limits = KeyLimits(routers=4, clock=clock)
    admitted = sum(limits.take(kid, entry, 0) is None for _ in range(100))
    assert admitted == 10  # a second's share: 40 / 4
    clock.t += 1.0
    assert sum(limits.take(kid, entry, 0) is None for _ in range(100)) == 10
    tokens = KeyLimits(routers=4, clock=clock)
    assert tokens.take(kid, KeyEntry(name="t", sha256=entry.sha256, tokens_per_min=60_000), 15_000) is None
    which, wait = tokens.take(kid, KeyEntry(name="t", sha256=entry.sha256, tokens_per_min=60_000), 1)
    assert which == "tokens" and wait == pytest.approx(1e-9 / (15_000 / 60), abs=1e-6)


def test_batch_keys_are_shed_first_when_units_near_their_caps_while_interactive_keys_pass():
    batch_id, batch_key, batch = issue("nightly", priority="batch")
    live_id, live_key, live = issue("assistant")

    async def scenario():
        a = await StandInUnit(name="a").start()
        access = AccessControl(read=Secret(KeySet({batch_id: batch, live_id: live})).read)
        async with router_over([a], access=access, max_queue_depth=8) as router, aiohttp.ClientSession() as s:
            calm = await post(s, router, headers=bearer(batch_key))
            a.queue_depth = 6  # 75 % of the router's cap of 8: batch headroom is used up
            await wait_for(lambda: router.fleet.members[a.url].queue_depth == 6)
            busy_batch = await post(s, router, headers=bearer(batch_key))
            busy_live = await post(s, router, headers=bearer(live_key))
        await a.stop()
        return calm, busy_batch, busy_live

    calm, busy_batch, busy_live = run(scenario())
    assert calm[0] == 200
    assert busy_batch[0] == 429 and "Retry-After" in busy_batch[1]
    assert json.loads(busy_batch[2])["error"]["code"] == "batch_shed"
    assert busy_live[0] == 200


def test_batch_keys_are_shed_when_the_units_reported_wait_nears_their_queue_timeout():
    batch_id, batch_key, batch = issue("nightly", priority="batch")
    live_id, live_key, live = issue("assistant")

    async def scenario():
        a = await StandInUnit(name="a").start()
        a.queue_timeout_s = 20.0
        access = AccessControl(read=Secret(KeySet({batch_id: batch, live_id: live})).read)
        async with router_over([a], access=access) as router, aiohttp.ClientSession() as s:
            a.wait_s = 16.0  # 80 % of the queue timeout: past the batch headroom (75 %), not full
            await wait_for(lambda: router.fleet.members[a.url].wait_s == 16.0)
            busy_batch = await post(s, router, headers=bearer(batch_key))
            busy_live = await post(s, router, headers=bearer(live_key))
        await a.stop()
        return busy_batch, busy_live

    busy_batch, busy_live = run(scenario())
    assert busy_batch[0] == 429 and json.loads(busy_batch[2])["error"]["code"] == "batch_shed"
    assert busy_live[0] == 200


def test_a_revoked_key_stops_working_within_the_ttl_and_a_new_key_starts():
    kid, key, entry = issue("old")
    new_id, new_key_, new_entry = issue("new")
    secret = Secret(KeySet({kid: entry}))

    async def scenario():
        a = await StandInUnit(name="a").start()
        access = AccessControl(read=secret.read, ttl_s=0.1)
        async with router_over([a], access=access) as router, aiohttp.ClientSession() as s:
            before = await post(s, router, headers=bearer(key))
            secret.value = KeySet({new_id: new_entry}).dumps()
            await wait_for(lambda: kid not in router.access.keys.keys, timeout=2.0, what="the TTL re-read")
            after_old = await post(s, router, headers=bearer(key))
            after_new = await post(s, router, headers=bearer(new_key_))
        await a.stop()
        return before, after_old, after_new

    before, after_old, after_new = run(scenario())
    assert before[0] == 200 and after_old[0] == 401 and after_new[0] == 200


def test_an_unreadable_or_malformed_secret_keeps_the_last_keys_and_no_secret_means_no_key_works():
    kid, key, entry = issue("k")
    secret = Secret(KeySet({kid: entry}))

    async def scenario():
        access = AccessControl(read=secret.read)
        await access.refresh()
        secret.value = "{not json"
        await access.refresh()
        kept = access.authenticate(f"Bearer {key}")
        secret.value = None
        await access.refresh()
        return kept, access.authenticate(f"Bearer {key}"), access.read_errors

    kept, gone, errors = run(scenario())
    assert kept == (kid, entry) and errors == 1
    assert gone == "invalid"


@pytest.mark.parametrize(
    "doc, fragment",
    [
        ('{"version": 1, "keys": {"zz": {}}}', "ids are 8 hex digits"),
        ('{"version": 1, "keys": {"0123abcd": {"name": "x", "sha256": "00"}}}', "sha256"),
        (
            '{"version": 1, "keys": {"0123abcd": {"name": "x", "sha256": "' + "0" * 64 + '", "priority": "vip"}}}',
            "priority='vip': one of interactive, batch",
        ),
        (
            '{"version": 1, "keys": {"0123abcd": {"name": "x", "sha256": "' + "0" * 64 + '", "requests_per_s": 0}}}',
            "requests_per_s=0",
        ),
        ('{"keys": {}}', 'expected {"version": 1'),
    ],
)
def test_a_malformed_key_set_is_refused_with_the_field_and_the_fix(doc, fragment):
    with pytest.raises(KeySetError) as err:
        KeySet.loads(doc)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_the_settings_pick_the_key_source_and_a_keys_file_is_read_like_the_secret(tmp_path):
    from runtime.router.access import make_access
    from runtime.router.settings import RouterSettings

    kid, key, entry = issue("from-a-file")
    path = tmp_path / "keys.json"
    base = {"units": ("http://127.0.0.1:1",)}
    assert make_access(RouterSettings(**base)) is None  # nothing configured: open, as local mode without a key
    access = make_access(RouterSettings(**base, api_keys_file=str(path), limit_routers=3))

    async def scenario():
        await access.refresh()
        before = access.authenticate(f"Bearer {key}")  # no file yet: no key works
        path.write_text(KeySet({kid: entry}).dumps())
        await access.refresh()
        return before, access.authenticate(f"Bearer {key}")

    before, after = run(scenario())
    assert before == "invalid" and after == (kid, entry)
    assert access.limits.routers == 3
    local = make_access(RouterSettings(**base, api_key="s3cret"))
    assert local.authenticate("Bearer s3cret")[0] == "local" and local.authenticate("Bearer other") == "invalid"
    assert local.authenticate("Basic s3cret") == "missing"

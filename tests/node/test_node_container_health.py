"""/health/container, what the ECS container health check asks, in its two phases on real members:
it fails until the unit has been ready once in the member's life (ECS counts a task towards the
minimum healthy percent as soon as its check passes, so passing early lets a rollout stop the old
revision while the new one still loads), then it means alive (a unit re-forming after a member died
stays healthy; ECS must not kill its other members)."""

from __future__ import annotations

import time

from nodeproc import get_json, wait_for

import contract

LOAD_S = "1.5"  # the echo engine's stand-in for loading a model
SETTLE_S = "0.3"


def container(member) -> int:
    return get_json(member.url + contract.NODE_CONTAINER_HEALTH_PATH)[0]


def test_container_health_fails_while_the_unit_loads_and_passes_only_after_it_was_ready(new_unit):
    unit = new_unit(engine="echo", FLOTILLA_ECHO_LOAD_S=LOAD_S, FLOTILLA_READY_SETTLE_S=SETTLE_S).start()
    leader = unit.leader
    wait_for(lambda: leader.live()[0] == 200, timeout=60, what="the leader's HTTP server")
    seen: list[tuple[int, int, int]] = []  # (live, ready, container) per poll, in order
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        sample = (leader.live()[0], leader.ready()[0], container(leader))
        seen.append(sample)
        if sample[2] == 200:
            break
        time.sleep(0.05)
    assert seen[-1][2] == 200, f"never healthy: {seen[-5:]}\n{unit.dump_logs()}"
    # Alive but loading: the container check failed (while the old /health/live already passed).
    assert any(live == 200 and ready == 503 and c == 503 for live, ready, c in seen), seen[:10]
    # Healthy only after the unit had been seen ready.
    first_ready = next(i for i, (_, ready, _) in enumerate(seen) if ready == 200)
    first_healthy = next(i for i, (_, _, c) in enumerate(seen) if c == 200)
    assert first_ready < first_healthy
    assert all(c == 503 for _, _, c in seen[:first_ready])
    # Every member of the unit says the same once the unit is ready.
    wait_for(lambda: all(container(m) == 200 for m in unit.members), timeout=30, what="every member healthy")
    assert leader.log_events("unit_started")


def test_a_started_member_stays_healthy_while_its_unit_reforms_after_a_follower_died(new_unit):
    unit = new_unit(engine="echo", FLOTILLA_READY_SETTLE_S=SETTLE_S).start().wait_ready(timeout=90)
    leader, follower = unit.members
    wait_for(lambda: container(leader) == 200, timeout=30, what="the leader to pass its container check")
    follower.sigkill()
    wait_for(lambda: leader.ready()[0] == 503, timeout=30, what="the leader to notice its follower died")
    # Re-forming, not ready: the container check still passes (alive), so ECS keeps the leader.
    assert [container(leader) for _ in range(5)] == [200] * 5
    assert leader.live()[0] == 200
    follower.start()
    unit.wait_ready(timeout=90)
    # The replacement follower is a new process: it passes only once its unit has been ready.
    wait_for(lambda: container(follower) == 200, timeout=30, what="the replacement follower to pass")


def test_a_member_whose_unit_never_gets_ready_never_passes(new_unit):
    unit = new_unit(engine="echo", FLOTILLA_ECHO_LOAD_S="600", FLOTILLA_READY_SETTLE_S=SETTLE_S).start()
    wait_for(lambda: all(m.live()[0] == 200 for m in unit.members), timeout=60, what="both members alive")
    wait_for(lambda: unit.leader.log_events("formation_offered"), timeout=60, what="the leader to start loading")
    polls = [(m.live()[0], container(m)) for _ in range(10) for m in unit.members]
    assert polls == [(200, 503)] * 20
    # Nothing here is about stopping: an engine still loading answers no Shutdown, so a SIGTERM
    # would wait out the member's 10 s grace for its engine (EngineProcess.stop) before killing it.
    for m in unit.members:
        m.sigkill_with_engine()

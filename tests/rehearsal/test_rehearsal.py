"""The ECS rehearsal end to end: 3 units of 2 real node processes (echo engine) behind the real
router, created and rolled from the synthesized templates under steady load, with ECS's rules
(ops/rehearsal/ecs.py) at time scale 0.01.

The emulator counts a task healthy as ECS does (its container health check passed), so the first
test fails with the container health check that asked /health/live: ECS then stops the old unit as
soon as the new one's HTTP server answers, while the new unit still loads. The last test keeps that
proof: the same rollout under the old check takes units out of rotation. The drain test rolls one
unit of one node under long streamed answers: its old leader hands them over rather than wait.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

import contract
from ops.rehearsal import cloudformation as cfn
from ops.rehearsal.run import Options, rehearse
from ops.rehearsal.template import read_fleet

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stacks"))
from synth_helpers import LLAMA_70B, config_with, synthesize  # noqa: E402

pytestmark = pytest.mark.timeout(300)

LOAD_S = 1.0  # real seconds a unit takes to load (100 emulated seconds at scale 0.01)


def synth(tmp_path: Path, **overrides) -> Path:
    out = tmp_path / "cdk.out"
    synthesize(config_with(units=3, nodes_per_unit=2, unit_rollout="surge", model=LLAMA_70B, **overrides), out)
    return out


def rehearsal(cdk_out: Path, tmp_path: Path, **options):
    fleet = read_fleet(cdk_out)
    options.setdefault("load_s", LOAD_S)
    return asyncio.run(rehearse(fleet, Options(work_dir=tmp_path / "run", **options)))


def test_a_surge_rollout_of_three_units_under_load_loses_no_request_and_keeps_every_unit_in_rotation(tmp_path):
    report = rehearsal(synth(tmp_path), tmp_path)
    assert report.units == 3 and report.nodes_per_unit == 2
    # surge (minimum healthy 100 %): every unit stays in rotation, so the floor is all of them
    assert report.floor == 3
    assert report.rollout == {"Cell-0": cfn.StackOutcome.COMPLETE}
    assert report.failures == [], report.failures[:5]
    assert report.served > 40
    assert report.min_in_rotation >= report.floor, report.rotation
    assert report.final_revisions == dict.fromkeys(("cell0-unit0", "cell0-unit1", "cell0-unit2"), "1-next")
    assert report.revisions_served.get("1", 0) > 0 and report.revisions_served.get("1-next", 0) > 0
    # One unit at a time (3 units: a wave of 1), in the template's DependsOn order.
    assert report.waves == [["cell0-unit0"], ["cell0-unit1"], ["cell0-unit2"]]
    completed = [e.who for e in report.events if "COMPLETED" in e.text and "1-next" in e.text]
    assert completed == ["cell0-unit0", "cell0-unit1", "cell0-unit2"]
    # Each unit's new tasks were healthy before any of its old tasks was told to stop.
    for unit in ("cell0-unit0", "cell0-unit1", "cell0-unit2"):
        mine = [e.text for e in report.events if e.who == unit]
        first_new_healthy = next(i for i, t in enumerate(mine) if "/1-next/" in t and t.endswith("HEALTHY"))
        first_old_stop = next(i for i, t in enumerate(mine) if t.startswith("stopping") and "/1/" in t)
        assert first_new_healthy < first_old_stop, mine


def test_a_revision_that_never_gets_ready_trips_the_breaker_rolls_back_and_never_leaves_rotation(tmp_path):
    # A 900 s grace period (9 s here, still room for a loaded machine to start a unit) so the
    # breaker trips within the test: it needs three failed tasks, and ECS replaces an unhealthy task
    # only after the grace period.
    report = rehearsal(synth(tmp_path, node={"health_check_grace_s": 900}), tmp_path, never_ready=True)
    assert report.rollout == {"Cell-0": cfn.StackOutcome.ROLLED_BACK}
    assert report.breaker_trips == {"cell0-unit0": 1, "cell0-unit1": 0, "cell0-unit2": 0}
    # Three failed tasks (the threshold for 2 tasks: max(3, 0.5 x 2)) before the breaker tripped.
    assert report.tasks_launched["cell0-unit0"]["1-next"] >= 3
    # The stack stopped at the first unit: the others never started a task of the bad revision.
    assert report.tasks_launched["cell0-unit1"] == {"1": 2}
    assert report.tasks_launched["cell0-unit2"] == {"1": 2}
    assert report.final_revisions == dict.fromkeys(("cell0-unit0", "cell0-unit1", "cell0-unit2"), "1")
    assert report.failures == [], report.failures[:5]
    assert report.min_in_rotation == 3, report.rotation
    assert set(report.revisions_served) == {"1"}


def test_under_the_old_liveness_health_check_the_same_rollout_takes_units_out_of_rotation(tmp_path, monkeypatch):
    # The container check as it was: /health/live, 200 as soon as the HTTP server is up.
    monkeypatch.setattr(contract, "NODE_CONTAINER_HEALTH_PATH", contract.NODE_LIVE_PATH)
    cdk_out = synth(tmp_path)
    assert read_fleet(cdk_out).services[0].health.path == contract.NODE_LIVE_PATH
    report = rehearsal(cdk_out, tmp_path, load_s=2.0)
    assert report.rollout == {"Cell-0": cfn.StackOutcome.COMPLETE}  # CloudFormation calls it done...
    assert report.min_in_rotation < report.floor, report.rotation  # ...while units were out of rotation


# Answers far longer than the rollout takes to reach the old leader: at 0.01 s a token (the echo
# engine's FLOTILLA_ECHO_STEP_S) at least 15 s each, while the new unit is healthy within a few
# seconds and the old leader's drain timeout is 1 s (100 s at scale 0.01). Every stream the clients
# opened before the rollout is still in flight when the old leader gets SIGTERM.
LONG_ANSWER_TOKENS = 1500


def test_a_draining_leader_hands_its_long_answers_over_instead_of_waiting_for_them(tmp_path):
    cdk_out = tmp_path / "cdk.out"
    synthesize(config_with(units=1, nodes_per_unit=1, unit_rollout="surge"), cdk_out)
    report = rehearsal(cdk_out, tmp_path, answer_tokens=LONG_ANSWER_TOKENS, clients=2)
    assert report.rollout == {"Cell-0": cfn.StackOutcome.COMPLETE}
    assert report.failures == [], report.failures[:5]
    [drain] = report.drains  # the one unit's old leader
    assert drain.unit == "cell0-unit0" and "/1/" in drain.task
    assert drain.in_flight == 2, drain  # both clients' answers were on it at SIGTERM
    # Each left at its next token, unfinished, for the router to continue on the new unit: none was
    # still open when the drain timeout ran out.
    assert drain.handed_over == drain.in_flight, drain
    assert drain.unfinished == 0, drain
    # The answers open at the rollout are the run's last requests: the clients start none after them
    # (one more round of long answers would only be waited for).
    assert report.served == 2, report.served

"""The unit's states and the formation handshake: typed in runtime/node/handshake.py, and on the wire
exactly the JSON the router, the docs and members of other revisions expect."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from memberships import membership

import contract
from runtime.membership import Member, Membership, Role
from runtime.node.handshake import Load, Loading, MemberStatus, Offer, ReadyBody, UnitState
from runtime.node.metrics import NodeMetrics
from runtime.node.settings import load_settings
from runtime.node.supervisor import UnitSupervisor

DOC = (Path(__file__).resolve().parents[2] / "docs" / "node.md").read_text()


def ready_body(**over) -> ReadyBody:
    fields = {
        "ready": True,
        "state": UnitState.READY,
        "unit": "cell0-unit0",
        "revision": "7",
        "rank": 0,
        "world_size": 2,
        "role": Role.LEADER,
        "cell": "cell0",
        "load": Load(queue_depth=1, running=2, max_running=16, kv_cache_used=0.25),
    }
    return ReadyBody(**{**fields, **over})


def test_the_states_and_roles_are_the_strings_docs_node_md_promises():
    shape = re.search(r'"state": "([a-z|]+)".*?"role": "([a-z|]+)"', DOC, re.DOTALL)
    assert shape, "docs/node.md no longer documents /health/ready's state and role"
    assert shape.group(1).split("|") == [s.value for s in UnitState]
    assert shape.group(2).split("|") == [r.value for r in Role]


def test_the_ready_body_is_plain_json_with_the_keys_the_router_reads():
    wire = json.loads(json.dumps(ready_body(state=UnitState.DRAINING, role=Role.FOLLOWER, rank=1).to_dict()))
    assert wire == {
        "ready": True,
        "state": "draining",
        "unit": "cell0-unit0",
        "revision": "7",
        "rank": 1,
        "world_size": 2,
        "role": "follower",
        "cell": "cell0",
        "load": {
            "queue_depth": 1,
            "running": 2,
            "max_running": 16,
            "kv_cache_used": 0.25,
            "in_flight": 0,
            "prefill_tokens": 0,
            "wait_s": 0.0,
            "queue_timeout_s": 0.0,
            "prefix_cache_queries": 0,
            "prefix_cache_hits": 0,
            "prefix_cache_hit_rate": 0.0,
            "step_s": 0.0,
            "spec_draft_tokens": 0,
            "spec_accepted_tokens": 0,
            "spec_acceptance_rate": 0.0,
            "tokens_per_step": 0.0,
        },
        "members": [],
        "leader": "",
        "strategies": None,
        "loading": None,
    }
    assert {
        contract.ATTR_UNIT,
        contract.ATTR_REVISION,
        contract.ATTR_ROLE,
        contract.ATTR_CELL,
        contract.ATTR_MEMBERS,
        contract.ATTR_LEADER,
    } <= set(wire)


def test_a_loading_member_reads_back_with_its_phase_and_bytes_and_an_older_one_without_loading_reads_none():
    from runtime.node.handshake import MemberReport

    loading = Loading(phase="fetch_model", done_bytes=412, total_bytes=810, phase_s=95.2)
    body = ready_body().model_copy(update={"loading": loading})
    assert ReadyBody.from_dict(json.loads(json.dumps(body.to_dict()))).loading == loading
    member = {"rank": 1, "address": "10.0.0.2:8000", "state": "forming", "ready": False, "revision": "7"}
    assert MemberReport.from_dict(member).loading is None  # a leader of an older revision
    assert MemberReport.from_dict({**member, "loading": loading.to_dict()}).loading == loading


def test_a_ready_body_of_an_older_member_without_members_or_leader_still_reads():
    wire = ready_body().to_dict()
    del wire["members"], wire["leader"]
    assert ReadyBody.from_dict(wire) == ready_body()


def test_an_offer_names_follower_ranks_as_json_object_keys_and_reads_back():
    offer = Offer(formation="f1", dist_port=29500, boot_ids={1: "boot-a", 2: "boot-b"})
    wire = json.loads(json.dumps(offer.to_dict()))
    assert wire == {"formation": "f1", "dist_port": 29500, "boot_ids": {"1": "boot-a", "2": "boot-b"}}
    assert Offer.from_dict(wire) == offer and Offer.from_dict(wire).boot_ids[1] == "boot-a"


def test_a_member_status_is_the_ready_body_plus_the_handshake_and_reads_back():
    offer = Offer(formation="f1", dist_port=29500, boot_ids={1: "boot-a"})
    st = MemberStatus(
        **dict(ready_body()),
        boot_id="boot-l",
        formation="f1",
        offer=offer,
        draining=False,
        engine_alive=True,
        engine_ready=True,
    )
    wire = json.loads(json.dumps(st.to_dict()))
    assert set(wire) == set(ready_body().to_dict()) | {
        "boot_id",
        "formation",
        "offer",
        "draining",
        "engine_alive",
        "engine_ready",
    }
    back = MemberStatus.from_dict(wire)
    assert back == st and back.state is UnitState.READY and back.role is Role.LEADER


def test_a_status_from_a_newer_member_with_more_keys_still_reads():
    st = MemberStatus(
        **dict(ready_body()),
        boot_id="b",
        formation=None,
        offer=None,
        draining=False,
        engine_alive=False,
        engine_ready=False,
    )
    assert MemberStatus.from_dict({**st.to_dict(), "added_later": {"x": 1}}) == st


@pytest.mark.parametrize("change", [{"boot_id": None}, {"state": "sleeping"}, {"offer": {"formation": "f"}}])
def test_a_status_in_another_shape_is_refused_with_a_value_error(change):
    st = MemberStatus(
        **dict(ready_body()),
        boot_id="b",
        formation=None,
        offer=None,
        draining=False,
        engine_alive=False,
        engine_ready=False,
    )
    with pytest.raises(ValueError):
        MemberStatus.from_dict({**st.to_dict(), **change})


class _NeverJoins:
    async def join(self) -> Membership:
        raise AssertionError("not called")

    async def changed(self, current: Membership) -> bool:
        return False


def test_a_fresh_member_reports_forming_as_a_follower_until_ranked():
    s = load_settings(
        ["--peers", "127.0.0.1:18000,127.0.0.1:18001", "--rank", "1", "--unit", "u", "--revision", "r", "--cell", "c"],
        {},
    )
    sup = UnitSupervisor(settings=s, rendezvous=_NeverJoins(), metrics=NodeMetrics())
    body = sup.ready_body().to_dict()
    assert (body["ready"], body["state"], body["role"], body["rank"], body["world_size"], body["cell"]) == (
        False,
        "forming",
        "follower",
        1,
        2,
        "c",
    )
    status = sup.status_body().to_dict()
    assert (status["formation"], status["offer"], status["draining"]) == (None, None, False)
    sup.membership = membership([("127.0.0.1", 18000)])
    assert sup.ready_body().role is Role.LEADER


def test_the_leader_reports_each_follower_as_it_last_saw_it_and_a_follower_names_its_leader():
    s = load_settings(
        ["--peers", "127.0.0.1:18000,127.0.0.1:18001,127.0.0.1:18002", "--rank", "0", "--unit", "u"],
        {},
    )
    addresses = [("127.0.0.1", 18000 + r) for r in range(3)]
    sup = UnitSupervisor(settings=s, rendezvous=_NeverJoins(), metrics=NodeMetrics())
    sup.membership = membership(addresses, revision="dev")
    answered = MemberStatus(
        **dict(
            ready_body(
                rank=1,
                role=Role.FOLLOWER,
                state=UnitState.FORMING,
                ready=False,
                revision="dev",
                loading=Loading(phase="warmup", phase_s=12.5),
            )
        ),
        boot_id="b1",
        formation=None,
        offer=None,
        draining=False,
        engine_alive=False,
        engine_ready=False,
    )
    sup._note_follower(sup.membership.members[1], answered)
    sup._note_follower(sup.membership.members[2], None)
    body = sup.ready_body().to_dict()
    assert body["members"] == [
        {
            "rank": 1,
            "address": "127.0.0.1:18001",
            "state": "forming",
            "ready": False,
            "revision": "dev",
            "loading": {"phase": "warmup", "done_bytes": 0, "total_bytes": 0, "phase_s": 12.5},
        },
        {
            "rank": 2,
            "address": "127.0.0.1:18002",
            "state": "unreachable",
            "ready": False,
            "revision": "",
            "loading": None,
        },
    ]
    assert body["leader"] == ""
    sup.membership = membership(addresses, rank=2, revision="dev")
    follower = sup.ready_body().to_dict()
    assert (follower["members"], follower["leader"]) == ([], "127.0.0.1:18000")


def test_a_leader_whose_formation_ended_reports_no_followers_until_it_asks_them_again():
    import asyncio

    s = load_settings(["--peers", "127.0.0.1:18000,127.0.0.1:18001", "--rank", "0", "--unit", "u"], {})
    sup = UnitSupervisor(settings=s, rendezvous=_NeverJoins(), metrics=NodeMetrics())
    sup._note_follower(Member(rank=1, host="127.0.0.1", api_port=18001), None)
    assert len(sup.ready_body().members) == 1
    asyncio.run(sup._end_formation())
    # The last word on a follower of an ended formation (e.g. "ready" just before it died) is stale.
    assert sup.ready_body().members == []

"""The fleet-wide admission limit (`flotilla shed`): the router reads it while running and sheds what
it says, without a restart; a parameter it cannot read leaves the last limit in force."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import boto3
import pytest
from moto import mock_aws
from router_standins import StandInUnit
from router_testkit import base_url, metrics_url, post, router_over, run, wait_for

from contract.admission import AdmissionError, AdmissionLimit, parameter_name
from runtime.router.admission import AdmissionControl, ParameterSource


class Parameter:
    """What a test sets as the SSM parameter's value (None: the parameter does not exist)."""

    def __init__(self, value: str | None = None) -> None:
        self.value, self.fail = value, False
        self.reads = 0

    def read(self) -> str | None:
        self.reads += 1
        if self.fail:
            raise RuntimeError("ThrottlingException: Rate exceeded")
        return self.value


def control(param: Parameter) -> AdmissionControl:
    return AdmissionControl(param.read, interval_s=0.05, name="/flotilla/test/admission")


def test_a_limit_set_while_the_router_runs_lowers_the_queue_cap_and_clearing_it_restores_it():
    async def scenario():
        a = await StandInUnit(name="a").start()
        a.queue_depth = 3  # below the router's own --max-queue-depth (32)
        param = Parameter()
        async with router_over([a], admission=control(param)) as router, aiohttp.ClientSession() as s:
            await wait_for(lambda: router.fleet.members[a.url].queue_depth == 3)
            first = (await post(s, router))[0]
            param.value = AdmissionLimit(max_queue_depth=3, reason="INC-42").dumps()
            await wait_for(lambda: router.admission.limit is not None, what="the limit to be read")
            status, headers, body = await post(s, router)
            param.value = None
            await wait_for(lambda: router.admission.limit is None, what="the limit to be cleared")
            last = (await post(s, router))[0]
        await a.stop()
        assert first == 200 and last == 200
        assert status == 429 and headers["Retry-After"] == "1"
        assert json.loads(body)["error"]["code"] == "overloaded"  # every unit at the (lowered) cap
        assert len(a.received) == 2

    run(scenario())


def test_admit_percent_zero_sheds_every_new_request_before_choosing_a_unit():
    async def scenario():
        a = await StandInUnit(name="a").start()
        param = Parameter(AdmissionLimit(admit_percent=0).dumps())
        async with router_over([a], admission=control(param)) as router, aiohttp.ClientSession() as s:
            results = [await post(s, router) for _ in range(5)]
            async with s.get(metrics_url(router)) as resp:
                metrics = await resp.text()
        await a.stop()
        assert {status for status, _, _ in results} == {429}
        assert all(json.loads(body)["error"]["code"] == "load_shed" for _, _, body in results)
        assert a.received == []
        assert 'flotilla_router_shed_total{reason="admission"} 5.0' in metrics

    run(scenario())


def test_a_lower_outstanding_cap_holds_per_unit():
    async def scenario():
        a = await StandInUnit(name="a").start()
        a.gate = asyncio.Event()
        param = Parameter(AdmissionLimit(max_outstanding_per_unit=2).dumps())
        async with router_over([a], admission=control(param)) as router, aiohttp.ClientSession() as s:

            async def stream():
                async with s.post(base_url(router) + "/v1/completions", json={"prompt": "x", "stream": True}) as resp:
                    return resp.status, await resp.read()

            streams = [asyncio.create_task(stream()) for _ in range(2)]
            await wait_for(lambda: a.active == 2)
            extra = [await post(s, router) for _ in range(3)]
            a.gate.set()
            await asyncio.gather(*streams)
        await a.stop()
        assert [status for status, _, _ in extra] == [429, 429, 429]
        assert a.max_active == 2

    run(scenario())


def test_a_parameter_that_cannot_be_read_keeps_the_last_limit_in_force():
    async def scenario():
        param = Parameter(AdmissionLimit(admit_percent=0).dumps())
        c = control(param)
        await c.start()
        param.fail = True
        reads = param.reads
        await wait_for(lambda: param.reads > reads + 2)
        assert c.limit == AdmissionLimit(admit_percent=0) and c.read_errors >= 2 and not c.admits()
        errors = c.read_errors
        param.fail, param.value = False, "{not json"
        await wait_for(lambda: c.read_errors > errors)
        assert c.limit == AdmissionLimit(admit_percent=0)
        await c.close()

    run(scenario())


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"admit_percent": 101}', "admit_percent=101: a whole number from 0 to 100"),
        ('{"admit_percent": true}', "admit_percent=True: a whole number from 0 to 100"),
        ('{"max_queue_depth": 0}', "max_queue_depth=0: a whole number from 1 to 100000, or absent"),
        ('{"max_inflight": 3}', "unknown field(s) max_inflight: allowed"),
        ("[1]", "not a JSON object"),
        ("{", "not JSON"),
    ],
)
def test_a_value_that_is_not_a_limit_is_named_field_by_field(text, expected):
    with pytest.raises(AdmissionError) as exc:
        AdmissionLimit.loads(text)
    assert expected in str(exc.value)


def test_the_ssm_parameter_source_reads_the_value_and_none_when_it_does_not_exist(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        ssm = boto3.client("ssm", region_name="us-east-1")
        source = ParameterSource(parameter_name("flotilla"), client=ssm)
        assert source.read() is None
        ssm.put_parameter(Name=parameter_name("flotilla"), Value='{"admit_percent": 50}', Type="String")
        assert AdmissionLimit.loads(source.read()) == AdmissionLimit(admit_percent=50)

"""Every place an operator gives a value (deployment config, node and router flags and variables, the
operations CLI) refuses a bad one in the same wording: `<input as given>=<value> <problem>: <fix>`."""

from __future__ import annotations

import argparse

import pytest

import contract
from contract.bad_input import NOT_GIVEN, BadInput, bad_input_line
from contract.settings import SettingsError
from ops.commands import rehearse
from ops.errors import UsageError
from runtime.node.settings import SettingsError as NodeSettingsError
from runtime.node.settings import load_settings
from runtime.router.settings import RouterSettings
from runtime.router.settings import SettingsError as RouterSettingsError
from stacks.config import ConfigError, parse_config


def test_the_line_names_the_input_the_value_the_problem_and_the_fix():
    assert bad_input_line("--clients", "0", "is out of range", "give 1 to 64", text=True) == (
        "--clients=0 is out of range: give 1 to 64"
    )
    # A typed value keeps its type in view: the string '2' is not the integer 2.
    assert bad_input_line("units", "2", "is not allowed", "an integer") == "units='2' is not allowed: an integer"
    # Text that does not read as one token is quoted, so where it ends is plain.
    assert bad_input_line("FLOTILLA_MODEL", "a b", "is not known", "fix it", text=True).startswith(
        "FLOTILLA_MODEL='a b' "
    )
    assert bad_input_line("FLOTILLA_PEERS", NOT_GIVEN, "is required", "list the members") == (
        "FLOTILLA_PEERS is required: list the members"
    )
    assert "\n" not in bad_input_line("x", 1, "is\nwrong", "fix\n  it")


def _config() -> str:
    with pytest.raises(ConfigError) as e:
        parse_config({"units": 0})
    return str(e.value)


def _node() -> str:
    with pytest.raises(NodeSettingsError) as e:
        load_settings(["--max-running", "0"], {contract.ENV_PEERS: "127.0.0.1:1", contract.ENV_RANK: "0"})
    return str(e.value)


def _router() -> str:
    parser = argparse.ArgumentParser()
    RouterSettings.add_arguments(parser)
    with pytest.raises(RouterSettingsError) as e:
        RouterSettings.from_args(parser.parse_args(["--units", "http://127.0.0.1:1", "--max-queue-depth", "0"]), {})
    return str(e.value)


def _ops() -> str:
    args = argparse.Namespace(time_scale=1.0, load_seconds=0, clients=0, concurrency=None)
    with pytest.raises(UsageError) as e:
        rehearse._check(args)
    return str(e.value)


@pytest.mark.parametrize(
    "refuse, expected",
    [
        (_config, "units=0 is not allowed: an integer from 1 to 10000"),
        (_node, "--max-running=0 is out of range: give a value in 1..4096"),
        (_router, "--max-queue-depth=0 is out of range: give a value in 1..100000"),
        (_ops, "--clients=0 is out of range: give 1 to 64"),
    ],
    ids=["config", "node", "router", "ops"],
)
def test_each_input_kind_refuses_in_the_one_wording(refuse, expected):
    assert refuse() == expected


def test_a_config_error_is_a_bad_input():
    assert issubclass(ConfigError, BadInput)


def test_config_node_and_router_settings_refuse_with_the_one_settings_error():
    assert issubclass(ConfigError, SettingsError)
    assert NodeSettingsError is SettingsError and RouterSettingsError is SettingsError

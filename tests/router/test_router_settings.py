"""Router settings from flags, environment and defaults: which wins, and the one-line error (exit code 2)
a bad value gets, naming the setting, the value, what is allowed and where the value came from."""

from __future__ import annotations

import argparse

import pytest

import contract
from runtime.__main__ import main
from runtime.router.settings import DOCS, RouterSettings, SettingsError, docs_with_settings, router_command

UNIT = "http://127.0.0.1:8000"


def from_cli(argv: list[str], env: dict[str, str] | None = None) -> RouterSettings:
    parser = argparse.ArgumentParser()
    RouterSettings.add_arguments(parser)
    return RouterSettings.from_args(parser.parse_args(argv), env or {})


def test_a_flag_wins_over_the_environment_which_wins_over_the_default():
    env = {contract.ENV_PORT: "9000", contract.ENV_POLL_INTERVAL: "0.1", contract.ENV_UNITS: UNIT}
    s = from_cli(["--port", "7000"], env)
    assert (s.port, s.poll_interval_s, s.units) == (7000, 0.1, (UNIT,))
    assert s.drain_timeout_s == 120.0 and s.max_queue_depth == 32


def test_an_empty_environment_variable_counts_as_unset():
    s = from_cli(["--units", UNIT], {contract.ENV_PORT: "", contract.ENV_DRAIN_TIMEOUT: ""})
    assert (s.port, s.drain_timeout_s) == (contract.ROUTER_PORT, 120.0)


def test_units_are_comma_separated_and_flag_words_map_to_settings():
    s = from_cli(["--units", f"{UNIT}, http://10.0.0.2:8000 ,", "--access-log", "off", "--log-level", "debug"])
    assert s.units == (UNIT, "http://10.0.0.2:8000")
    assert s.access_log is False and s.log_level == "DEBUG"


def test_stale_after_defaults_to_three_poll_intervals_and_must_exceed_one():
    assert from_cli(["--units", UNIT]).stale_after_s == 0.75
    assert from_cli(["--units", UNIT, "--poll-interval", "1"]).stale_after_s == 3.0
    with pytest.raises(SettingsError, match="stale_after_s=0.2 must be longer than poll_interval_s=0.25"):
        from_cli(["--units", UNIT, "--stale-after", "0.2"])


def test_an_idle_leader_heartbeats_every_one_and_a_half_poll_intervals_within_half_the_silence_bound():
    # Fewer heartbeats (each a socket read for the router) without moving the silence bound.
    default = from_cli(["--units", UNIT])
    assert (default.keepalive_s, default.stale_after_s) == (0.375, 0.75)
    assert from_cli(["--units", UNIT, "--poll-interval", "1"]).keepalive_s == 1.5
    assert from_cli(["--units", UNIT, "--stale-after", "0.5"]).keepalive_s == 0.25  # half the bound wins
    assert from_cli(["--units", UNIT, "--keepalive", "0.1"]).keepalive_s == 0.1
    # Never longer than a node's watch takes (0.01 to 10 s): it would refuse the watch.
    assert from_cli(["--units", UNIT, "--poll-interval", "10", "--stale-after", "30"]).keepalive_s == 10.0


def test_a_heartbeat_slower_than_half_the_silence_bound_is_refused_in_one_line():
    with pytest.raises(SettingsError) as err:
        from_cli(["--units", UNIT, "--keepalive", "0.5"])
    assert str(err.value) == (
        "keepalive_s=0.5 must be at most half of stale_after_s=0.75: a leader's heartbeat may come a whole "
        "interval late before it counts as silent (lower --keepalive or raise --stale-after)"
    )
    assert from_cli(["--units", UNIT, "--keepalive", "1", "--stale-after", "2"]).keepalive_s == 1.0


def test_cloudmap_services_are_comma_separated_names():
    s = from_cli(
        ["--discovery", "cloudmap", "--cloudmap-namespace", "ns", "--cloudmap-service", "units-cell0, units-cell1,"]
    )
    assert s.cloudmap_services == ("units-cell0", "units-cell1")


def test_poll_timeout_defaults_to_twice_the_poll_interval_and_at_least_a_second():
    assert from_cli(["--units", UNIT, "--poll-interval", "2"]).poll_timeout_s == 4.0
    assert from_cli(["--units", UNIT, "--poll-interval", "0.1"]).poll_timeout_s == 1.0
    assert from_cli(["--units", UNIT, "--poll-interval", "2", "--poll-timeout", "3"]).poll_timeout_s == 3.0


@pytest.mark.parametrize(
    "argv, env, expected",
    [
        (["--poll-interval", "x"], {}, "--poll-interval=x is not a number: give a number from 0.01 to 60"),
        (
            [],
            {contract.ENV_PORT: "http"},
            f"{contract.ENV_PORT}=http is not an integer: give an integer from 0 to 65535",
        ),
        (
            ["--max-queue-depth", "0"],
            {},
            "--max-queue-depth=0 is out of range: give an integer from 1 to 100000",
        ),
        (
            [],
            {contract.ENV_DISCOVERY: "dns"},
            f"{contract.ENV_DISCOVERY}=dns is not allowed: give one of static, cloudmap",
        ),
        (["--access-log", "yes"], {}, "--access-log=yes is not allowed: give json or off"),
    ],
)
def test_a_bad_value_gets_one_line_naming_the_setting_as_given_and_the_fix(argv, env, expected):
    with pytest.raises(SettingsError) as exc:
        from_cli(["--units", UNIT, *argv], env)
    assert str(exc.value) == expected


def test_several_bad_values_are_all_named_on_one_line():
    with pytest.raises(SettingsError) as exc:
        RouterSettings(units=(UNIT,), port=-1, max_attempts=99)
    assert "\n" not in str(exc.value)
    assert "port=-1" in str(exc.value) and "max_attempts=99" in str(exc.value)


def test_the_pause_a_router_asks_for_stays_within_what_openai_sdks_honour():
    assert RouterSettings(units=(UNIT,), retry_after_s=contract.RETRY_AFTER_MAX_S).retry_after_s == 120
    cap = contract.RETRY_AFTER_MAX_S
    with pytest.raises(SettingsError, match=f"retry_after_s=121 is out of range: give an integer from 1 to {cap}"):
        RouterSettings(units=(UNIT,), retry_after_s=121)


def test_an_unknown_setting_is_rejected_by_name():
    with pytest.raises(SettingsError, match="bogus=1 is not a router setting: remove it"):
        RouterSettings(units=(UNIT,), bogus=1)


def test_the_command_exits_2_with_the_message_on_stderr(capsys, monkeypatch):
    monkeypatch.setenv(contract.ENV_UNITS, UNIT)
    monkeypatch.setenv(contract.ENV_DRAIN_TIMEOUT, "soon")
    assert main(["router"]) == 2
    err = capsys.readouterr().err
    assert err == (f"router: {contract.ENV_DRAIN_TIMEOUT}=soon is not a number: give a number from 0 to 86400\n")


def test_every_flag_and_environment_variable_of_the_router_is_declared():
    parser = argparse.ArgumentParser()
    RouterSettings.add_arguments(parser)
    flags = {a.option_strings[0]: a.help for a in parser._actions if a.option_strings[0] != "-h"}
    assert set(flags) == {
        "--host",
        "--port",
        "--metrics-host",
        "--metrics-port",
        "--discovery",
        "--units",
        "--units-file",
        "--cloudmap-namespace",
        "--cloudmap-service",
        "--poll-interval",
        "--poll-timeout",
        "--stale-after",
        "--keepalive",
        "--change-report",
        "--discovery-interval",
        "--max-outstanding-per-unit",
        "--max-queue-depth",
        "--balance",
        "--drain-grace",
        "--drain-timeout",
        "--first-byte-timeout",
        "--idle-stream-timeout",
        "--max-moves",
        "--stream-stall",
        "--stream-stall-max",
        "--event-loop",
        "--access-log",
        "--ready-units-interval",
        "--admission-parameter",
        "--admission-interval",
        "--api-keys-secret",
        "--api-keys-file",
        "--api-key",
        "--api-keys-ttl",
        "--limit-routers",
        "--batch-headroom",
        "--log-level",
    }
    envs = {
        "--port": contract.ENV_PORT,
        "--metrics-port": contract.ENV_METRICS_PORT,
        "--discovery": contract.ENV_DISCOVERY,
        "--units": contract.ENV_UNITS,
        "--cloudmap-namespace": contract.ENV_CLOUDMAP_NAMESPACE,
        "--cloudmap-service": contract.ENV_CLOUDMAP_SERVICE,
        "--poll-interval": contract.ENV_POLL_INTERVAL,
        "--drain-timeout": contract.ENV_DRAIN_TIMEOUT,
        "--admission-parameter": contract.ENV_ADMISSION_PARAMETER,
        "--balance": contract.ENV_BALANCE,
        "--api-keys-secret": contract.ENV_API_KEYS_SECRET,
        "--api-key": contract.ENV_API_KEY,
        "--api-keys-ttl": contract.ENV_API_KEYS_TTL,
        "--limit-routers": contract.ENV_LIMIT_ROUTERS,
    }
    for flag, help_text in flags.items():
        assert "(default: " in help_text, flag
        assert (f"env {envs[flag]})" in help_text) if flag in envs else ("env " not in help_text), flag


def test_discovery_passes_are_every_2_s_from_a_file_and_every_5_s_from_cloud_map():
    assert from_cli(["--units", UNIT]).discovery_interval_s == 2.0
    cloudmap = ["--discovery", "cloudmap", "--cloudmap-namespace", "ns", "--cloudmap-service", "units-cell0"]
    assert from_cli(cloudmap).discovery_interval_s == 5.0
    assert from_cli([*cloudmap, "--discovery-interval", "1"]).discovery_interval_s == 1.0


def test_api_keys_come_from_one_source_only():
    with pytest.raises(SettingsError) as err:
        from_cli(["--units", UNIT, "--api-key", "k"], {contract.ENV_API_KEYS_SECRET: "flotilla/x/api-keys"})
    assert str(err.value) == (
        "api_keys_secret and api_key are both set: give the keys one way (a secret, a file or one key)"
    )


def test_the_command_that_starts_a_router_gives_each_setting_as_the_router_reads_it():
    values = {
        "host": "127.0.0.1",
        "port": 0,
        "units": (UNIT, "http://10.0.0.2:8000"),
        "poll_interval_s": 0.05,
        "max_outstanding_per_unit": 4,
        "access_log": "off",
        "drain_grace_s": 0,
        "balance": None,  # left out: the router's own default
    }
    argv = router_command(python="py", **values, extra=["--log-level", "warning"])
    assert argv[:4] == ["py", "-m", "runtime", "router"]
    read = from_cli(argv[4:])
    assert read == RouterSettings(**{k: v for k, v in values.items() if v is not None}, log_level="WARNING")


def test_the_router_command_refuses_a_name_that_is_not_a_setting_in_one_line():
    with pytest.raises(TypeError, match="^poll_interval is not a router setting with a flag: use one of host, "):
        router_command(poll_interval=0.2)


def test_docs_router_md_shows_the_settings_as_declared():
    doc = DOCS.read_text()
    assert docs_with_settings(doc) == doc, (
        "docs/router.md's settings table differs from the declarations in runtime/router/settings.py: "
        "run python -m runtime.router.settings --write-docs"
    )
    assert "| `--max-queue-depth` | — | 32 | an integer from 1 to 100000 |" in doc  # the rule's words

"""The router's settings, each declared once (type, default, check, flag, environment variable, help):
the `python -m runtime router` flags and their help are derived from these declarations.

Flags win over environment variables, which win over defaults. A bad value raises SettingsError with
one line in contract.bad_input's wording: the setting as given (its flag or variable), the value and the fix;
each value's rule is declared with contract.declare, as the node's and the deployment config's are.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

import contract
from contract import apikeys
from contract.bad_input import NOT_GIVEN, bad_input_line
from contract.declare import (
    NOT_ALLOWED,
    Integer,
    Number,
    OneOf,
    refusal,
    refused,
    rule_of,
    settings_docs_parser,
    spliced,
)
from contract.settings import SettingsError as SettingsError  # the one settings error, raised from here too

_BAD = "router_setting"  # the error type of a rule across settings: its message is the line


@dataclass(frozen=True)
class Option:
    """How a setting is given on the command line and in the environment."""

    flag: str
    help: str
    env: str | None = None
    choices: tuple[str, ...] | None = None  # the words the flag takes, when not the field's Literal values
    default: str | None = None  # the default as the help shows it, when not the field's


def _bad(message: str) -> PydanticCustomError:
    return PydanticCustomError(_BAD, message)


def _units(value: Any) -> Any:
    # Checked here, before the tuple is built, so that an error shows the value as it was given.
    if isinstance(value, str):  # a flag or FLOTILLA_UNITS: comma-separated
        value = tuple(u.strip() for u in value.split(",") if u.strip())
    return _base_urls(value) if isinstance(value, (tuple, list)) else value


def _names(value: Any) -> Any:
    if isinstance(value, str):  # a flag or FLOTILLA_CLOUDMAP_SERVICE: comma-separated
        return tuple(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))
    return value


def _base_urls(units: tuple[Any, ...] | list[Any]) -> tuple[Any, ...] | list[Any]:
    for url in units:
        if isinstance(url, str) and not url.startswith(("http://", "https://")) or url.count(":") < 2:
            raise refusal(
                f"has {url!r}, which is not a base URL",
                f"write each unit as http://host:port (e.g. http://127.0.0.1:{contract.NODE_API_PORT})",
            )
    return units


ACCESS_LOG_WORDS = {"json": True, "off": False}


def _access_log_word(value: Any) -> Any:
    if isinstance(value, str):
        if value not in ACCESS_LOG_WORDS:
            raise refusal(NOT_ALLOWED, f"give {' or '.join(ACCESS_LOG_WORDS)}")
        return ACCESS_LOG_WORDS[value]
    return value


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


class RouterSettings(BaseModel):
    """One validated object built once at start-up and passed down. Every default suits a small fleet."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: Annotated[str, Option("--host", "address to listen on")] = "0.0.0.0"
    port: Annotated[
        int, Integer(0, 65535, text=True), Option("--port", "listen port; 0 = any free port", env=contract.ENV_PORT)
    ] = contract.ROUTER_PORT
    # /metrics has its own listener: the public port serves only the API and /health
    metrics_host: Annotated[
        str, Option("--metrics-host", "address /metrics listens on (loopback: only the router's own host or task)")
    ] = "127.0.0.1"
    metrics_port: Annotated[
        int,
        Integer(0, 65535, text=True),
        Option("--metrics-port", "/metrics listen port; 0 = any free port", env=contract.ENV_METRICS_PORT),
    ] = contract.ROUTER_METRICS_PORT
    # discovery: "static" (units and/or units_file) or "cloudmap" (namespace + service)
    discovery: Annotated[
        Literal["static", "cloudmap"],
        OneOf(),
        Option(
            "--discovery", "how units are found: static (--units, --units-file) or cloudmap", env=contract.ENV_DISCOVERY
        ),
    ] = "static"
    units: Annotated[
        tuple[str, ...],
        BeforeValidator(_units),
        Option(
            "--units",
            "comma-separated leader base URLs, e.g. http://10.0.1.5:8000, for static discovery",
            env=contract.ENV_UNITS,
            default="none",
        ),
    ] = ()
    units_file: Annotated[
        str | None,
        Option("--units-file", "file with one leader URL per line, re-read every discovery pass, for static discovery"),
    ] = None
    cloudmap_namespace: Annotated[
        str | None,
        Option(
            "--cloudmap-namespace",
            "Cloud Map namespace the units register in, for cloudmap discovery",
            env=contract.ENV_CLOUDMAP_NAMESPACE,
        ),
    ] = None
    cloudmap_services: Annotated[
        tuple[str, ...],
        BeforeValidator(_names),
        Option(
            "--cloudmap-service",
            "comma-separated Cloud Map services the unit members register in (one per cell, "
            "docs/discovery.md), for cloudmap discovery",
            env=contract.ENV_CLOUDMAP_SERVICE,
            default="none",
        ),
    ] = ()
    cloudmap_region: str | None = None  # None: boto3's default region resolution
    discovery_interval_s: Annotated[
        float,
        Number(0.05, 3600, text=True),
        Option(
            "--discovery-interval",
            "seconds between discovery passes",
            default="2 (static), 5 (cloudmap: each pass costs a Cloud Map call per cell)",
        ),
    ] = contract.STATIC_DISCOVERY_INTERVAL_S
    # health and load: leaders are watched (a line on every change, a heartbeat every keepalive when
    # nothing changed), others asked every poll interval when needed
    poll_interval_s: Annotated[
        float,
        Number(0.01, 60, text=True),
        Option(
            "--poll-interval",
            "seconds between polls of a member without the watch (a leader of an older revision; "
            "followers no leader vouches for: 4 x this)",
            env=contract.ENV_POLL_INTERVAL,
        ),
    ] = 0.25
    poll_timeout_s: Annotated[
        float,
        Number(0.01, 60, text=True),
        Option(
            "--poll-timeout",
            "seconds a health poll may take before the unit counts as unreachable",
            default="max(1, 2 x poll interval)",
        ),
    ] = 1.0
    keepalive_s: Annotated[
        float,
        Number(0.01, 10, text=True),  # what the node's watch takes (runtime/node/server.py WATCH_INTERVAL_RANGE_S)
        Option(
            "--keepalive",
            "seconds between a watched leader's lines when nothing changed (a heartbeat: silence "
            "then means a hung host); at most half of --stale-after, so one heartbeat may come a "
            "whole interval late before the leader counts as silent",
            default="1.5 x poll interval, at most half of --stale-after and 10",
        ),
    ] = 0.375
    change_report_s: Annotated[
        float,
        Number(0.01, 10, text=True),
        Option(
            "--change-report",
            "a leader reports a change of its load within this many seconds (watch); many routers "
            "balance well only on fresh load (docs/benchmarks.md, Fleet)",
        ),
    ] = 0.05
    stale_after_s: Annotated[
        float,
        Number(0.02, 600, text=True),
        Option(
            "--stale-after",
            "seconds without a health report (watch line or poll) after which a unit takes no new requests",
            default="3 x poll interval",
        ),
    ] = 0.75
    # proxying. A leader's own queue timeout (FLOTILLA_QUEUE_TIMEOUT_S, 25 s) is shorter than both
    # timeouts below by default, so a request stuck in a unit's queue ends with the unit's 503 or
    # error event, which names the cause, before the router's 504 (docs/node.md, "How a request ends").
    connect_timeout_s: Annotated[float, Number(0.01, 60, text=True)] = 1.0
    first_byte_timeout_s: Annotated[
        float,
        Number(0.01, 3600, text=True),
        Option(
            "--first-byte-timeout",
            "seconds to wait for a unit's first byte: the prefill of a long prompt on a busy unit",
        ),
    ] = 60.0
    idle_stream_timeout_s: Annotated[
        float,
        Number(0.01, 3600, text=True),
        Option("--idle-stream-timeout", "longest silence in seconds between two chunks of a response"),
    ] = 30.0
    # units tried per request while nothing reached the client
    max_attempts: Annotated[int, Integer(1, 16, text=True)] = 3
    max_moves: Annotated[
        int,
        Integer(0, 16, text=True),
        Option(
            "--max-moves",
            "times one stream may continue on another unit after its unit failed, hung or drained (0: never)",
        ),
    ] = 2
    # A stream's silence bound: twice its unit's longest recent step plus 1 s (contract.ready.stall_bound),
    # within these two.
    stream_stall_s: Annotated[
        float,
        Number(0.05, 3600, text=True),
        Option(
            "--stream-stall",
            "silence in seconds after which a stream that already produced tokens counts its unit as hung "
            "and moves, when that unit's steps are short; a unit that reports long steps (a busy one) gets "
            "twice its longest recent step plus 1 s",
        ),
    ] = 5.0
    stream_stall_max_s: Annotated[
        float,
        Number(0.05, 3600, text=True),
        Option(
            "--stream-stall-max",
            "the most seconds a stream's silence bound grows to on a unit that reports long steps, so a busy "
            "unit that then hangs still loses its streams; at least --stream-stall",
        ),
    ] = 30.0
    max_body_bytes: Annotated[int, Integer(1024, 1 << 30, text=True)] = 4 * 1024 * 1024
    # shedding: a unit is saturated when either bound is reached
    max_outstanding_per_unit: Annotated[
        int,
        Integer(1, 100_000, text=True),
        Option(
            "--max-outstanding-per-unit",
            "requests this router keeps in flight to one unit before it counts as saturated",
        ),
    ] = 64
    max_queue_depth: Annotated[
        int,
        Integer(1, 100_000, text=True),
        Option("--max-queue-depth", "a unit reporting this queue depth is saturated"),
    ] = 32
    retry_after_s: Annotated[int, Integer(1, contract.RETRY_AFTER_MAX_S, text=True)] = 1
    # routing: which policy of runtime/router/balance.py picks a unit (docs/routing.md)
    balance: Annotated[
        Literal["cache_aware", "least_work", "least_requests"],
        OneOf(),
        Option(
            "--balance",
            "how a unit is picked: cache_aware (the request's session or prompt prefix keeps it on one unit "
            "unless that unit is busier; docs/routing.md), least_work (the least estimated prefill of 4 "
            "sampled units) or least_requests (the fewest requests of 4 sampled units)",
            env=contract.ENV_BALANCE,
        ),
    ] = "cache_aware"
    access_log: Annotated[
        bool,
        BeforeValidator(_access_log_word),
        Option(
            "--access-log",
            "one JSON line per routed request on stderr (json) or none (off)",
            choices=tuple(ACCESS_LOG_WORDS),
            default="json",
        ),
    ] = True
    ready_units_interval_s: Annotated[
        float,
        Number(0.05, 3600, text=True),
        Option(
            "--ready-units-interval",
            "seconds between ReadyUnits metric lines on stdout: CloudWatch EMF, docs/observability.md",
        ),
    ] = 60.0
    # incident lever: the fleet-wide admission limit `flotilla shed` sets (runtime/router/admission.py)
    admission_parameter: Annotated[
        str | None,
        Option(
            "--admission-parameter",
            "SSM parameter holding the fleet-wide admission limit (`flotilla shed`); unset: no limit is read",
            env=contract.ENV_ADMISSION_PARAMETER,
        ),
    ] = None
    admission_interval_s: Annotated[
        float,
        Number(1, 3600, text=True),
        Option("--admission-interval", "seconds between reads of the admission parameter"),
    ] = 10.0
    # who may call: API keys and per-key limits (runtime/router/access.py); none given: open
    api_keys_secret: Annotated[
        str | None,
        Option(
            "--api-keys-secret",
            "Secrets Manager secret holding the hashed API keys (`flotilla keys`); every /v1 request then "
            "needs Authorization: Bearer <key>",
            env=contract.ENV_API_KEYS_SECRET,
        ),
    ] = None
    api_keys_file: Annotated[
        str | None,
        Option("--api-keys-file", "file holding hashed API keys in the secret's format, re-read like the secret"),
    ] = None
    api_key: Annotated[
        str | None,
        Option(
            "--api-key",
            "the one key every /v1 request must bear (local mode; pass it in the environment, not on a "
            "command line others can read)",
            env=contract.ENV_API_KEY,
        ),
    ] = None
    api_keys_ttl_s: Annotated[
        float,
        Number(1, 3600, text=True),
        Option(
            "--api-keys-ttl",
            "seconds between reads of the keys: a revoked key stops working within this",
            env=contract.ENV_API_KEYS_TTL,
        ),
    ] = float(apikeys.API_KEYS_TTL_S)
    limit_routers: Annotated[
        int,
        Integer(1, 10_000, text=True),
        Option(
            "--limit-routers",
            "routers sharing each key's limits: each admits 1/n of a key's requests/s and tokens/min",
            env=contract.ENV_LIMIT_ROUTERS,
        ),
    ] = 1
    batch_headroom_percent: Annotated[
        int,
        Integer(1, 100, text=True),
        Option(
            "--batch-headroom",
            "batch-class keys are admitted only while some unit is below this percent of its caps "
            "(interactive keys up to 100)",
        ),
    ] = 75
    # SIGTERM drain
    drain_grace_s: Annotated[
        float,
        Number(0, 3600, text=True),
        Option("--drain-grace", "seconds to keep serving after /health turns 503 on SIGTERM, so the ALB notices"),
    ] = 5.0
    drain_timeout_s: Annotated[
        float,
        Number(0, 86400, text=True),
        Option(
            "--drain-timeout", "seconds to wait for in-flight requests after SIGTERM", env=contract.ENV_DRAIN_TIMEOUT
        ),
    ] = 120.0
    # the process
    event_loop: Annotated[
        Literal["auto", "asyncio", "uvloop"],
        OneOf(),
        Option(
            "--event-loop",
            "auto = uvloop (in the image) when it imports, else asyncio; logged at start; uvloop is the faster"
            " (docs/benchmarks.md)",
        ),
    ] = "auto"
    log_level: Annotated[
        Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        BeforeValidator(_upper),
        OneOf(),  # after the upper-casing, so a refusal shows the level as given
        Option("--log-level", "least severe log level written"),
    ] = "INFO"

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            problems = exc.errors(include_url=False)
            raise SettingsError(_one_line(problems, {}), problems=problems) from None

    @model_validator(mode="before")
    @classmethod
    def _poll_timeout_follows_poll_interval(cls, values: Any) -> Any:
        # Unset, a poll may take twice the poll interval, and at least a second.
        if isinstance(values, dict) and values.get("poll_timeout_s") is None:
            poll = cls._given_poll_interval(values)
            if poll is not None:
                values = {**values, "poll_timeout_s": max(1.0, 2 * poll)}
        return values

    @classmethod
    def _given_poll_interval(cls, values: dict) -> float | None:
        """poll_interval_s as given, or its default; None when it does not parse (it gets its own error)."""
        try:
            return float(values.get("poll_interval_s", cls.model_fields["poll_interval_s"].default))
        except (TypeError, ValueError):
            return None

    @staticmethod
    def _default_stale_after(poll: float) -> float:
        # Three reports may go missing before a unit counts as silent: a leader reports every poll
        # interval, so a silent one stops taking requests within 3 intervals (0.75 s by default).
        return 3 * poll

    @model_validator(mode="before")
    @classmethod
    def _discovery_interval_follows_discovery(cls, values: Any) -> Any:
        # Unset: a units file is cheap to re-read every 2 s; a Cloud Map pass is a
        # DiscoverInstancesRevision call per cell (~1.5-2 ms of router CPU each, docs/benchmarks.md,
        # Fleet), and units take minutes to form while a stopping one turns unready on its watch at
        # once, so every 5 s is soon enough.
        if isinstance(values, dict) and values.get("discovery_interval_s") is None:
            cloudmap = values.get("discovery") == "cloudmap"
            values = {
                **values,
                "discovery_interval_s": contract.CLOUDMAP_DISCOVERY_INTERVAL_S
                if cloudmap
                else contract.STATIC_DISCOVERY_INTERVAL_S,
            }
        return values

    @model_validator(mode="before")
    @classmethod
    def _stale_after_follows_poll_interval(cls, values: Any) -> Any:
        if isinstance(values, dict) and values.get("stale_after_s") is None:
            poll = cls._given_poll_interval(values)
            if poll is not None:
                values = {**values, "stale_after_s": cls._default_stale_after(poll)}
        return values

    @model_validator(mode="before")
    @classmethod
    def _keepalive_follows_poll_interval(cls, values: Any) -> Any:
        # Unset, an idle leader's heartbeat comes every 1.5 poll intervals (0.375 s by default), but
        # at least twice per --stale-after: each heartbeat is a socket read for the router (2,500 a
        # second at 625 leaders every 0.25 s) that says only "still alive", and the silence bound
        # (--stale-after) stays what it was (docs/benchmarks.md, Fleet).
        if isinstance(values, dict) and values.get("keepalive_s") is None:
            poll = cls._given_poll_interval(values)
            try:
                stale = values.get("stale_after_s")
                stale = None if poll is None else cls._default_stale_after(poll) if stale is None else float(stale)
            except (TypeError, ValueError):
                stale = None  # stale_after_s gets its own error
            if poll is not None and stale is not None:
                values = {**values, "keepalive_s": min(1.5 * poll, stale / 2, 10.0)}
        return values

    @model_validator(mode="after")
    def _silence_allows_a_late_heartbeat(self) -> RouterSettings:
        if self.keepalive_s > self.stale_after_s / 2:
            raise _bad(
                f"keepalive_s={self.keepalive_s} must be at most half of stale_after_s={self.stale_after_s}: "
                f"a leader's heartbeat may come a whole interval late before it counts as silent "
                f"(lower --keepalive or raise --stale-after)"
            )
        return self

    @model_validator(mode="after")
    def _stale_after_exceeds_the_report_interval(self) -> RouterSettings:
        if self.stale_after_s <= self.poll_interval_s:
            raise _bad(
                f"stale_after_s={self.stale_after_s} must be longer than poll_interval_s={self.poll_interval_s}: "
                f"a leader reports once per poll interval (default: 3 x poll interval)"
            )
        return self

    @model_validator(mode="after")
    def _stall_ceiling_above_its_floor(self) -> RouterSettings:
        if self.stream_stall_max_s < self.stream_stall_s:
            raise _bad(
                f"stream_stall_max_s={self.stream_stall_max_s} is below stream_stall_s={self.stream_stall_s}: "
                f"give a --stream-stall-max of at least --stream-stall"
            )
        return self

    @model_validator(mode="after")
    def _discovery_has_what_it_needs(self) -> RouterSettings:
        if self.discovery == "static" and not self.units and not self.units_file:
            raise _bad(
                f"static discovery needs units: pass --units http://host:port[,...] or set "
                f"{contract.ENV_UNITS}, or pass --units-file"
            )
        if self.discovery == "cloudmap" and not (self.cloudmap_namespace and self.cloudmap_services):
            raise _bad(
                f"cloudmap discovery needs {contract.ENV_CLOUDMAP_NAMESPACE} and "
                f"{contract.ENV_CLOUDMAP_SERVICE} (or --cloudmap-namespace/--cloudmap-service)"
            )
        return self

    @model_validator(mode="after")
    def _one_source_of_keys(self) -> RouterSettings:
        given = [n for n in ("api_keys_secret", "api_keys_file", "api_key") if getattr(self, n)]
        if len(given) > 1:
            raise _bad(f"{' and '.join(given)} are both set: give the keys one way (a secret, a file or one key)")
        return self

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per declared Option. Every flag defaults to None so from_args can tell a flag
        given from one left out (and fall back to the environment, then the declared default)."""
        for name, option in _options().items():
            field = cls.model_fields[name]
            choices = option.choices or (
                get_args(field.annotation) if get_origin(field.annotation) is Literal else None
            )
            shown = _default_text(option, field)
            where = f"; env {option.env}" if option.env else ""
            metavar = "{" + ",".join(choices) + "}" if choices else option.flag.lstrip("-").upper().replace("-", "_")
            parser.add_argument(
                option.flag, dest=name, default=None, metavar=metavar, help=f"{option.help} (default: {shown}{where})"
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str]) -> RouterSettings:
        """Each setting from its flag, else its environment variable (empty counts as unset), else its
        default."""
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for name, option in _options().items():
            given = getattr(args, name, None)
            if given is not None:
                values[name], sources[name] = given, option.flag
            elif option.env and environ.get(option.env):
                values[name], sources[name] = environ[option.env], option.env
        try:
            return cls(**values)
        except SettingsError as exc:
            raise SettingsError(_one_line(exc.problems, sources), problems=exc.problems) from None


def router_command(*, python: str = sys.executable, extra: Sequence[str] = (), **settings: Any) -> list[str]:
    """The argv that starts a router: `python -m runtime router` with each setting given here as the
    flag RouterSettings declares for it (a tuple comma-separated, as its flag takes it; None left
    out), then `extra` flags as written, last so they win. The process checks the values, as it
    checks an operator's; a name that is not a setting with a flag is refused here."""
    options = _options()
    argv = [python, "-m", "runtime", "router"]
    for name, value in settings.items():
        option = options.get(name)
        if option is None:
            fix = f"use one of {', '.join(options)}"
            raise TypeError(bad_input_line(name, NOT_GIVEN, "is not a router setting with a flag", fix))
        if value is not None:
            argv += [option.flag, ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)]
    return [*argv, *extra]


def _options() -> dict[str, Option]:
    """The settings that have a flag, in declaration order."""
    out = {}
    for name, field in RouterSettings.model_fields.items():
        option = next((m for m in field.metadata if isinstance(m, Option)), None)
        if option is not None:
            out[name] = option
    return out


def _default_text(option: Option, field: FieldInfo) -> str:
    return option.default or ("none" if field.default is None else str(field.default))


def _allowed_text(option: Option, field: FieldInfo) -> str:
    if option.choices:
        return " or ".join(option.choices)
    rule = rule_of(field.metadata)
    return rule.allowed if rule is not None else "—"


# -- docs/router.md ----------------------------------------------------------------------------------
DOCS = Path(__file__).resolve().parents[2] / "docs" / "router.md"
DOCS_BEGIN = (
    "<!-- BEGIN settings: rendered from runtime/router/settings.py by "
    "`python -m runtime.router.settings --write-docs`; edit the declarations, not this table -->"
)
DOCS_END = "<!-- END settings -->"


def settings_markdown() -> str:
    """docs/router.md's settings table, rendered from the declarations (as --help is)."""
    rows = ["| flag | environment variable | default | allowed | meaning |", "|---|---|---|---|---|"]
    for name, option in _options().items():
        field = RouterSettings.model_fields[name]
        env = f"`{option.env}`" if option.env else "—"
        cells = (f"`{option.flag}`", env, _default_text(option, field), _allowed_text(option, field), option.help)
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def docs_with_settings(doc: str) -> str:
    """`doc` with the text between DOCS_BEGIN and DOCS_END replaced by settings_markdown()."""
    return spliced(doc, DOCS_BEGIN, DOCS_END, settings_markdown(), DOCS)


def main(argv: Sequence[str] | None = None) -> int:
    if settings_docs_parser("python -m runtime.router.settings", "the router's", DOCS).parse_args(argv).write_docs:
        DOCS.write_text(docs_with_settings(DOCS.read_text()))
    else:
        print(settings_markdown())
    return 0


def _one_line(problems: list[Any], sources: Mapping[str, str]) -> str:
    """pydantic's multi-line report as one line: each problem, the setting named by the flag or
    variable it came from (by its name when given in code)."""
    lines = []
    for err in problems:
        name = str(err["loc"][0]) if err["loc"] else ""
        value = err.get("input")
        if err["type"] == _BAD:  # a rule across settings: its sentence names them
            lines.append(err["msg"])
            continue
        problem_fix = refused(err)
        if problem_fix is not None:
            problem, fix = problem_fix
        elif err["type"] == "extra_forbidden":
            problem, fix = "is not a router setting", "remove it (python -m runtime router --help lists them)"
        else:
            problem, fix = NOT_ALLOWED, err["msg"]
        lines.append(bad_input_line(sources.get(name, name), value, problem, fix, text=name in sources))
    return "; ".join(lines)


if __name__ == "__main__":
    sys.exit(main())

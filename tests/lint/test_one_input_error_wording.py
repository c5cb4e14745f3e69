"""Every place an operator gives a value (deployment config, node and router flags and variables, the
operations CLI) refuses a bad one in the same wording: `<input as given>=<value> <problem>: <fix>`.
The config, node and router settings and the operations CLI's flags declare their rules with one
toolkit (contract/declare.py), so a range is refused in the same words wherever it is given; a layer
with a rule helper of its own, or a CLI flag with a range refusal written by hand, fails here."""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
from pathlib import Path
from typing import get_args

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

import contract
from contract.bad_input import NOT_GIVEN, BadInput, bad_input_line
from contract.declare import OUT_OF_RANGE, Integer, Number, allowed_of, rule_of
from contract.settings import SettingsError
from ops.cli import build_parser
from ops.commands import rehearse
from ops.errors import FlagType, UsageError
from runtime.node.settings import NEURON_FIELD, NEURON_SETTINGS, SETTINGS, NodeSettings, load_settings
from runtime.node.settings import SettingsError as NodeSettingsError
from runtime.router.settings import RouterSettings
from runtime.router.settings import SettingsError as RouterSettingsError
from stacks.config import ConfigError, FlotillaConfig, parse_config
from stacks.scaling_config import section_type


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
        (_config, "units=0 is out of range: give an integer from 1 to 10000"),
        (_node, "--max-running=0 is out of range: give an integer from 1 to 4096"),
        (_router, "--max-queue-depth=0 is out of range: give an integer from 1 to 100000"),
        (_ops, "--clients=0 is out of range: give an integer from 1 to 64"),
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


# --- one toolkit, one wording for every range of the config, node and router settings ---------------
LAYER_MODULES = (
    "stacks/config.py",
    "stacks/config_rules.py",
    "stacks/config_sections.py",
    "stacks/model_config.py",
    "stacks/scaling_config.py",
    "stacks/speculation.py",
    "runtime/node/declared.py",
    "runtime/node/settings.py",
    "runtime/node/neuron_settings.py",
    "runtime/router/settings.py",
)
# The helpers each layer had before contract/declare.py, each with its own words for a refusal.
FORMER_HELPERS = {"within", "between", "one_of", "matches", "refuse", "_bad_value", "Listed", "Rule"}
REPO = Path(__file__).resolve().parents[2]


def _range_rule(field: FieldInfo) -> Integer | Number | None:
    rule = rule_of(field.metadata)
    return rule if isinstance(rule, (Integer, Number)) else None


def _out_of_range(rule: Integer | Number) -> int | float:
    # Above the top when there is one: a value below the bottom can drag settings computed from it
    # (the router's poll timeout from its poll interval) out of range too.
    if rule.hi is not None:
        return rule.hi + 1
    return rule.lo if isinstance(rule, Number) and rule.above else rule.lo - 1


def _config_ranges() -> list[tuple[str, Integer | Number]]:
    def walk(model: type[BaseModel], prefix: str) -> list[tuple[str, Integer | Number]]:
        out = []
        for name, field in model.model_fields.items():
            section = section_type(field.annotation)
            if isinstance(section, type) and issubclass(section, BaseModel):
                out += walk(section, f"{prefix}{name}.")
            elif (rule := _range_rule(field)) is not None:
                out.append((prefix + name, rule))
        return out

    return walk(FlotillaConfig, "")


def _nested(key: str, value: object) -> dict[str, object]:
    *sections, leaf = key.split(".")
    raw: dict[str, object] = {leaf: value}
    for section in reversed(sections):
        raw = {section: raw}
    return raw


def test_every_range_of_the_config_is_refused_in_the_one_wording():
    ranges = _config_ranges()
    assert len(ranges) > 15
    for key, rule in ranges:
        value = _out_of_range(rule)
        with pytest.raises(ConfigError) as e:
            parse_config(_nested(key, value))
        assert str(e.value) == bad_input_line(key, value, OUT_OF_RANGE, rule.fix)


NODE_BASE = {contract.ENV_PEERS: "127.0.0.1:1", contract.ENV_RANK: "0"}
NEURON_BASE = {**NODE_BASE, contract.ENV_ENGINE: "neuron", contract.ENV_MODEL_URI: "s3://bucket/model/"}


def test_every_range_of_the_node_settings_is_refused_in_the_one_wording():
    ranged = [(d, d.rule) for d in SETTINGS + NEURON_SETTINGS if isinstance(d.rule, (Integer, Number))]
    assert len(ranged) > 25
    for d, rule in ranged:
        value = str(_out_of_range(rule))
        with pytest.raises(NodeSettingsError) as e:
            load_settings([d.flag, value], NEURON_BASE if d.path[0] == NEURON_FIELD else NODE_BASE)
        assert str(e.value) == bad_input_line(d.flag, value, OUT_OF_RANGE, rule.fix, text=True)


def test_every_range_of_the_router_settings_is_refused_in_the_one_wording():
    parser = argparse.ArgumentParser()
    RouterSettings.add_arguments(parser)
    flags = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}
    ranged = [(n, r) for n, f in RouterSettings.model_fields.items() if (r := _range_rule(f)) is not None]
    assert len(ranged) > 20
    for name, rule in ranged:
        value = _out_of_range(rule)
        with pytest.raises(RouterSettingsError) as e:
            if name in flags:
                RouterSettings.from_args(
                    parser.parse_args(["--units", "http://127.0.0.1:1", flags[name], str(value)]), {}
                )
            else:
                RouterSettings(units=("http://127.0.0.1:1",), **{name: value})
        given = (flags[name], str(value)) if name in flags else (name, value)
        # A setting computed from this one may be refused beside it, each problem in the same words.
        assert bad_input_line(*given, OUT_OF_RANGE, rule.fix, text=name in flags) in str(e.value).split("; ")


def _fields_of_every_layer() -> list[tuple[str, FieldInfo]]:
    def walk(model: type[BaseModel], prefix: str) -> list[tuple[str, FieldInfo]]:
        out = []
        for name, field in model.model_fields.items():
            section = section_type(field.annotation)
            if isinstance(section, type) and issubclass(section, BaseModel):
                out += walk(section, f"{prefix}{name}.")
            else:
                out.append((prefix + name, field))
        return out

    return [
        *walk(FlotillaConfig, "config "),
        *walk(NodeSettings, "node "),
        *walk(RouterSettings, "router "),
    ]


# Checked by a validator of their own: a node's rank, whose range (0..peers - 1) is known only once the
# peers are (worded with a contract.declare Integer), and the neuron degrees, a number or `auto`.
CHECKED_BY_A_VALIDATOR = {"node rank", "node neuron.cp_degree", "node neuron.attention_dp_degree"}


def test_every_number_setting_declares_its_range_with_the_one_toolkit():
    """A number checked by pydantic's own bounds (Field(ge=...)) or a layer's own helper would be
    refused in other words: each declares an Integer, Number or OneOf (contract/declare.py)."""
    numbers = 0
    for name, field in _fields_of_every_layer():
        assert not any(type(m).__module__ == "annotated_types" for m in field.metadata), (
            f"{name} has pydantic's own bounds: declare them with contract.declare.Integer or Number"
        )
        kinds = {a for a in (field.annotation, *get_args(field.annotation)) if a in (int, float)}
        if kinds and name not in CHECKED_BY_A_VALIDATOR:
            numbers += 1
            assert allowed_of(field.metadata) is not None, f"{name} is a number without a contract.declare rule"
    assert numbers > 60


def test_no_settings_layer_has_a_refusal_helper_of_its_own():
    """The words of a refusal live in contract/declare.py alone: a layer that brings back a helper of
    its own (the router's `within`, the config's `between`, ...) or writes a range refusal itself fails."""
    for path in LAYER_MODULES:
        source = (REPO / path).read_text()
        tree = ast.parse(source)
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        imported = {
            a.asname or a.name
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module != "contract.declare"
            for a in n.names
        }
        assert not (defined | imported) & FORMER_HELPERS, f"{path}: {(defined | imported) & FORMER_HELPERS}"
        assert "WrapValidator" not in imported, f"{path}: a rule's check is a contract.declare rule"
        words = [c.value for c in ast.walk(tree) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        for phrase in ("out of range", "give a value in", "whole number", "an integer from", "a number from"):
            assert not any(phrase in w for w in words), f"{path} words a range refusal itself: {phrase!r}"


# --- the operations CLI: its flags' ranges are contract.declare rules too ------------------------------
OPS_MODULES = sorted(
    {*(REPO / "ops" / "commands").glob("*.py"), REPO / "ops" / "capacity.py", REPO / "ops" / "errors.py"}
)
# The words a range refusal was written in by hand before the CLI's flags took contract.declare rules.
HAND_WORDED_RANGES = (
    "out of range",
    "is not a whole number",
    "an integer from",
    "an integer of",
    "a number from",
    "is not a positive number",
    "is negative",
    "or more",
)
RANGE_WORDS = {"OUT_OF_RANGE", "integer_range", "number_range"}  # contract.bad_input's, for a rule's own use


def _words_outside_docstrings(tree: ast.Module) -> list[str]:
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        c.value
        for c in ast.walk(tree)
        if isinstance(c, ast.Constant) and isinstance(c.value, str) and id(c) not in docstrings
    ]


def test_no_ops_command_words_a_range_refusal_itself():
    """A flag's range is a contract.declare rule (FlagType for argparse, check_arg after parsing), which
    words the refusal: `--clients=0 is out of range: give an integer from 1 to 64`, as the settings do."""
    assert len(OPS_MODULES) > 15
    for path in OPS_MODULES:
        tree = ast.parse(path.read_text())
        imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not imported & RANGE_WORDS, f"{path}: {imported & RANGE_WORDS}: declare a contract.declare rule"
        for words in _words_outside_docstrings(tree):
            for phrase in HAND_WORDED_RANGES:
                assert phrase not in words, f"{path} words a range refusal itself ({phrase!r}): {words!r}"


def _ranged_flags() -> list[tuple[list[str], FlagType]]:
    """(the subcommand's words, the flag's type) for every flag of `flotilla` read by a rule."""
    out = []

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*words, name])
            elif isinstance(action.type, FlagType):
                out.append((words, action.type))

    walk(build_parser(), [])
    return out


def test_every_ranged_flag_of_the_ops_cli_is_refused_in_the_one_wording_with_the_usage_line():
    ranged = _ranged_flags()
    assert len(ranged) > 8
    for words, flag_type in ranged:
        rule = flag_type.rule
        assert isinstance(rule, (Integer, Number)), f"{flag_type.flag}: {rule!r}"
        value = str(_out_of_range(rule))
        err = io.StringIO()
        with pytest.raises(SystemExit) as e, contextlib.redirect_stderr(err):
            build_parser().parse_args([*words, flag_type.flag, value])
        usage, *_, last = err.getvalue().splitlines()
        assert e.value.code == 2 and usage.startswith(f"usage: flotilla {' '.join(words)} ")
        line = bad_input_line(flag_type.flag, value, OUT_OF_RANGE, rule.fix, text=True)
        assert last == f"flotilla {' '.join(words)}: error: {line}"

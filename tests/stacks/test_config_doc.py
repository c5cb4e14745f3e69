"""docs/configuration.md is generated from the typed config (stacks/config_doc.py, `make docs-config`):
the committed file is what the config says now, every key has a meaning, and the allowed column is the
wording the config's own refusal uses."""

from __future__ import annotations

from typing import Annotated

import pytest

from contract.declare import Integer, Items, Rule
from stacks import config_doc
from stacks.config import ConfigError, parse_config
from stacks.config_rules import Section


def test_the_committed_reference_is_the_one_the_config_generates():
    assert config_doc.DOC.read_text() == config_doc.render(), "docs/configuration.md is out of date: make docs-config"


def test_every_key_of_the_config_is_a_row_with_a_meaning():
    keys = [r.key for r in config_doc.rows()]
    for key in ("deployment_name", "node.drain_timeout_s", "front.client_cidrs", "model.shape", "scaling.floor"):
        assert key in keys
    assert len(keys) == len(set(keys))
    assert all(r.meaning and r.allowed for r in config_doc.rows())


def test_a_key_without_a_docstring_stops_the_generator_naming_it():
    class Probe(Section):
        documented: Annotated[int, Integer(1, 2)] = 1
        """Has a meaning."""
        undocumented: Annotated[int, Integer(1, 2)] = 1

    with pytest.raises(ValueError, match="config key probe.undocumented has no description"):
        config_doc.rows(Probe, "probe.")


def _raw(key: str, value: object) -> dict[str, object]:
    *sections, leaf = key.split(".")
    raw: dict[str, object] = {leaf: value}
    for section in reversed(sections):
        raw = {section: raw}
    return raw


def test_the_allowed_column_is_what_the_refusal_of_a_bad_value_says():
    """A key checked by a rule refuses a bad value with the very text the reference prints for it: the
    refusal's fix is "give " + the allowed column."""
    ruled = {key for key, field in _leaf_fields() if any(isinstance(m, Rule) for m in field.metadata)}
    rows = [r for r in config_doc.rows() if r.key in ruled]
    assert len(rows) > 40
    for row in rows:
        with pytest.raises(ConfigError) as refused:
            parse_config(_raw(row.key, {"not": "a value"}))
        assert (refused.value.key, refused.value.fix) == (row.key, f"give {row.allowed}")


def test_a_list_key_states_the_refusal_of_a_bad_list():
    """A list checked as a whole (its kind, its length) before its items states that check's words."""
    listed = {key for key, field in _leaf_fields() if any(isinstance(m, Items) for m in field.metadata)}
    rows = [r for r in config_doc.rows() if r.key in listed]
    assert {"availability_zones", "capacity.availability_zones", "front.client_cidrs", "drained_units"} <= listed
    cases = [(r, "not a list") for r in rows] + [(r, ["us-east-1a"]) for r in rows if r.key == "availability_zones"]
    for row, bad in cases:
        with pytest.raises(ConfigError) as refused:
            parse_config(_raw(row.key, bad))
        assert (refused.value.key, refused.value.fix) == (row.key, f"give {row.allowed}")


def _leaf_fields():
    from stacks.config import FlotillaConfig
    from stacks.scaling_config import section_type

    def walk(model, prefix):
        for name, field in model.model_fields.items():
            if config_doc._is_section(field.annotation):
                yield from walk(section_type(field.annotation), prefix + name + ".")
            else:
                yield prefix + name, field

    return list(walk(FlotillaConfig, ""))


def test_defaults_are_printed_as_yaml_writes_them():
    assert config_doc.default_text(None) == "unset"
    assert config_doc.default_text("") == "unset"
    assert config_doc.default_text(True) == "`true`"
    assert config_doc.default_text(()) == "`[]`"
    assert config_doc.default_text(100) == "`100`"


def test_the_example_refusal_in_the_reference_is_the_configs_own():
    text = config_doc.DOC.read_text()
    assert "`error: units_per_cell=25 is out of range: give an integer from 1 to 20" in text

"""Every name README.md and docs/ cite is the one its declaration gives: FLOTILLA_* environment variables
(the node's and the router's settings declarations, contract/, what the code reads), the value a doc
states beside a setting or a flag (its declared default, or what the stacks set), file paths and links
of this repository, stack ids and names, CloudFormation outputs, the Cloud Map service names, the
configuration's keys and its YAML examples (the typed config of stacks/config.py)."""

from __future__ import annotations

import argparse
import glob
import inspect
import re
from collections import defaultdict
from functools import cache

import doccheck
import pytest
import yaml
from doccheck import ROOT

import contract

DOCS = [p.relative_to(ROOT).as_posix() for p in doccheck.doc_files()]
ENV_NAME = re.compile(r"\bFLOTILLA_[A-Z0-9_]*[A-Z0-9]\b")
# "`NAME` (30 s)", "`--flag`, 0.375 s", "`--flag` (default 64)": a value stated beside a setting.
STATED = re.compile(
    r"`(FLOTILLA_[A-Z0-9_]+|--[a-z][a-z0-9-]*)`\s*(?:\(|,)\s*(?:by default\s+|default\s+)?(\d+(?:\.\d+)?)"
    r"(?![\d.:-])\s*(ms|s\b|%)?"
)


def _text(doc: str) -> str:
    return (ROOT / doc).read_text()


# --- environment variables and the values stated beside settings -----------------------------------


@cache
def declared_values() -> dict[str, set[float]]:
    """Setting (FLOTILLA_* variable or flag) -> the numbers declared for it: the node's settings
    (runtime/node/settings.py), the router's (runtime/router/settings.py), every CLI's argparse defaults,
    and the values the stacks give the containers (the synthesized task definitions)."""
    from pydantic import BaseModel

    import runtime.node.settings as node
    import runtime.router.settings as router

    values: dict[str, set[float]] = defaultdict(set)

    def add(key: str | None, *found: object) -> None:
        for value in found:
            for number in re.findall(r"\d+(?:\.\d+)?", str(value)) if value is not None else ():
                if key:
                    values[key].add(float(number))

    for cls in vars(node).values():
        if inspect.isclass(cls) and issubclass(cls, BaseModel) and cls.__module__ == node.__name__:
            for field in cls.model_fields.values():
                extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
                for key in (extra.get("flag"), extra.get("env")):
                    add(key, field.default, extra.get("neuron_default"), extra.get("shown"))  # type: ignore[arg-type]
    for field in router.RouterSettings.model_fields.values():
        option = next((m for m in field.metadata if isinstance(m, router.Option)), None)
        if option is not None:
            for key in (option.flag, option.env):
                add(key, field.default, option.default)
    for entry in _entries():
        parser = doccheck.cli_parser(entry)
        for action in _actions(parser) if parser is not None else ():
            for flag in action.option_strings:
                add(flag, action.default if isinstance(action.default, (int, float)) else None)
    for template in doccheck.synthesized().templates.values():
        for resource in template["Resources"].values():
            if resource["Type"] == "AWS::ECS::TaskDefinition":
                for container in resource["Properties"]["ContainerDefinitions"]:
                    for env in container.get("Environment", []):
                        add(env["Name"], env["Value"] if isinstance(env.get("Value"), str) else None)
    return values


def _entries() -> list[str]:
    found = {
        m for t in doccheck.make_targets() for m in re.findall(r"\$\(PY\) -m ([\w.]+)", " ".join(doccheck.recipe(t)))
    }
    return [*doccheck.console_scripts().values(), "runtime", "runtime.local", *sorted(found)]


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    out = []
    for action in parser._actions:
        out.append(action)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _actions(sub)
    return out


@cache
def declared_environment() -> frozenset[str]:
    """Every FLOTILLA_* variable the code reads or sets: contract/ and the settings declarations name
    the runtime's; a string constant of the product code (runtime/, stacks/, ops/, contract/) or an
    ENV/ARG of a Dockerfile names the others, and a test or benchmark that reads one from the
    environment names its knob (FLOTILLA_CHAOS_SEED)."""
    names = {v for k, v in vars(contract).items() if k.startswith("ENV_") and isinstance(v, str)}
    names |= {k for k in declared_values() if k.startswith("FLOTILLA_")}
    for literal in doccheck.python_strings("runtime", "stacks", "ops", "contract"):
        names.update(ENV_NAME.findall(literal))
    for path in [*ROOT.glob("tests/**/*.py"), *ROOT.glob("bench/**/*.py")]:  # knobs a test or benchmark reads
        names.update(
            re.findall(r"(?:environ\.get\(|environ\[|getenv\()\s*[\"'](FLOTILLA_[A-Z0-9_]+)", path.read_text())
        )
    for dockerfile in ROOT.glob("runtime/Dockerfile*"):
        names.update(re.findall(r"^(?:ENV|ARG)\s+(FLOTILLA_[A-Z0-9_]+)", dockerfile.read_text(), re.M))
    return frozenset(names)


@pytest.mark.parametrize("doc", DOCS)
def test_every_environment_variable_the_doc_names_is_declared(doc):
    unknown = sorted(set(ENV_NAME.findall(_text(doc))) - declared_environment())
    assert not unknown, f"{doc}: no code reads {unknown}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_value_stated_beside_a_setting_is_its_default_or_what_the_stacks_set(doc):
    wrong = []
    for n, line in enumerate(_text(doc).splitlines(), 1):
        for m in STATED.finditer(line):
            name, number, unit = m.groups()
            stated = float(number) / (1000 if unit == "ms" else 1)
            declared = declared_values().get(name, set())
            if declared and not any(abs(stated - d) < 1e-9 for d in declared):
                wrong.append(f"{doc}:{n}: {m.group(0)!r}: declared {sorted(declared)}")
    assert not wrong, "\n".join(wrong)


# --- paths and links --------------------------------------------------------------------------------

TOP_LEVEL = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")} - {"node_modules", "cdk.out"}


def cited_paths(doc: str) -> list[tuple[int, str]]:
    """Paths into this repository in the doc's inline code and code blocks: a word whose first part is a
    top-level entry of the checkout (`runtime/node/server.py:120` counts as the file; `NXDI:examples/...`,
    another repository's, does not)."""
    out = []
    for span in doccheck.spans(ROOT / doc):
        for word in re.split(r"[\s,;()`'\"=]+", span.text):
            path = re.sub(r"[:#].*$", "", word).rstrip(".")
            first = path.split("/")[0]
            if first in TOP_LEVEL and (path != first or "." in first) and ("/" in path or first != path):
                out.append((span.line, path))
            elif path in TOP_LEVEL and "." in path:
                out.append((span.line, path))
    return out


@pytest.mark.parametrize("doc", DOCS)
def test_every_repository_path_and_link_the_doc_cites_exists(doc):
    missing = []
    for line, path in cited_paths(doc):
        pattern = re.sub(r"<[^>]*>|\.\.\.|…|\{[^}]*\}", "*", path)
        if not glob.glob(str(ROOT / pattern)):
            missing.append(f"{doc}:{line}: {path}")
    for n, line in enumerate(_text(doc).splitlines(), 1):
        for m in re.finditer(r"\]\(([^)\s]+)\)", line):
            target = m.group(1).split("#")[0]
            if target and not re.match(r"^[a-z]+:", target) and not ((ROOT / doc).parent / target).exists():
                missing.append(f"{doc}:{n}: link {m.group(1)}")
    assert not missing, "no such file in the repository:\n" + "\n".join(missing)


# --- stacks, outputs, Cloud Map -------------------------------------------------------------------


def test_stack_names_and_outputs_the_docs_cite_are_the_apps():
    """`--stack-name <deployment>-<id>`, `flotilla-Cell-0`, `out Front Url` (the runbooks' helper around
    describe-stacks) and OutputKey=='Url' name stacks and outputs the synthesized app has."""
    app = doccheck.synthesized()
    ids = doccheck.stack_ids()
    outputs = {sid: set(t.get("Outputs", {})) for sid, t in app.templates.items()}
    generic = {re.sub(r"-\d+$", "-0", sid): names for sid, names in outputs.items()}
    every_output = set().union(*outputs.values())
    for variant in doccheck.FRONT_DOOR_VARIANTS:  # outputs only an internet-facing or PrivateLink door has
        every_output |= set().union(
            *(set(t.get("Outputs", {})) for t in doccheck.synthesized(variant).templates.values())
        )
    placeholder = rf"{doccheck.PLACEHOLDER}\w+{doccheck.PLACEHOLDER}|\$\w+|\$\{{\w+\}}"  # <deployment>, $NAME
    prefix = rf"(?:{re.escape(app.deployment_name)}(?:-[a-z0-9]+)*|{placeholder})"
    wrong = []
    for path in doccheck.doc_files():
        for span in doccheck.spans(path):
            text = re.sub(r"<([^<>\s]+)>", rf"{doccheck.PLACEHOLDER}\1{doccheck.PLACEHOLDER}", span.text)
            for m in re.finditer(r"--stack-name[ =]+[\"']?([^\s\"']+)", text):
                name = m.group(1)
                if not doccheck.is_placeholder(name) or "-" in name:
                    stack = re.fullmatch(rf"{prefix}-(.+)", name)
                    if not stack or not (ids.fullmatch(stack.group(1)) or doccheck.is_placeholder(stack.group(1))):
                        wrong.append(f"{span.where()}: stack name {name}")
            for m in re.finditer(r"\bout ([A-Z][\w-]*) ([A-Z]\w*)", text):
                sid, output = m.groups()
                if output not in generic.get(re.sub(r"-\d+$", "-0", sid), set()):
                    wrong.append(f"{span.where()}: {sid} has no output {output}")
            for m in re.finditer(r"OutputKey==\\?'(\w+)\\?'", text):
                if m.group(1) not in every_output:
                    wrong.append(f"{span.where()}: no stack has the output {m.group(1)}")
    assert not wrong, "\n".join(wrong)


def test_the_infrastructure_doc_names_every_stack_of_the_app():
    text = _text("docs/infrastructure.md")
    missing = [sid for sid in doccheck.synthesized().templates if f"`{re.sub(r'-0$', '-<n>', sid)}`" not in text]
    assert not missing, f"docs/infrastructure.md does not name the stacks {missing}"


def test_cloud_map_service_names_the_docs_cite_are_the_cells_services():
    """Units register in one Cloud Map service per cell, named contract.CLOUDMAP_UNITS_SERVICE_PREFIX +
    the cell id (`units-cell0`)."""
    service = re.compile(rf"{re.escape(contract.CLOUDMAP_UNITS_SERVICE_PREFIX)}cell(\d+|<n>|N|\*|\.\.\.)")
    wrong = []
    for doc in DOCS:
        for n, line in enumerate(_text(doc).splitlines(), 1):
            for m in re.finditer(r"Cloud Map service\s+`([^`]+)`", line):
                if not service.fullmatch(m.group(1)):
                    wrong.append(f"{doc}:{n}: Cloud Map service `{m.group(1)}`")
            for m in re.finditer(r"`(units-[^`\s]*)`", line):
                if not service.fullmatch(m.group(1)):
                    wrong.append(f"{doc}:{n}: `{m.group(1)}`")
    assert not wrong, "the units' Cloud Map services are units-cell<n>:\n" + "\n".join(wrong)


# --- configuration ---------------------------------------------------------------------------------


def _config_sections() -> dict[str, set[str]]:
    from pydantic import BaseModel

    from stacks.config import FlotillaConfig

    out = {}
    for name, field in FlotillaConfig.model_fields.items():
        if inspect.isclass(field.annotation) and issubclass(field.annotation, BaseModel):
            out[name] = set(field.annotation.model_fields)
    return out


@pytest.mark.parametrize("doc", DOCS)
def test_every_configuration_key_the_doc_cites_is_a_key_of_the_config(doc):
    """`section.key` (`node.drain_timeout_s`, `front.client_cidrs`) names a field of stacks/config.py."""
    sections = _config_sections()
    wrong = []
    for span in doccheck.spans(ROOT / doc):
        if span.fenced:
            continue
        m = re.fullmatch(r"([a-z_]+)\.([a-z_]+)(?:\s*[:=].*)?", span.text)
        if m and m.group(1) in sections and m.group(2) not in sections[m.group(1)]:
            wrong.append(f"{span.where()}: `{span.text}`")
    assert not wrong, "not keys of the configuration (stacks/config.py):\n" + "\n".join(wrong)


def yaml_examples() -> list[tuple[str, int, str]]:
    out = []
    for path in doccheck.doc_files():
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() == "```yaml":
                end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
                out.append((path.relative_to(ROOT).as_posix(), i + 1, "\n".join(lines[i + 1 : end])))
    return out


@pytest.mark.parametrize("doc,line,block", yaml_examples(), ids=lambda v: str(v)[:40])
def test_every_key_of_a_yaml_config_example_is_a_key_of_the_config(doc, line, block):
    """The examples are excerpts (placeholders, a layout of their own), so their keys are checked, at
    every level, against the typed config's fields, not their values."""
    from stacks.config import FlotillaConfig

    unknown = _unknown_keys(yaml.safe_load(block) or {}, FlotillaConfig, "")
    assert not unknown, f"{doc}:{line}: not keys of the configuration (stacks/config.py): {unknown}"


def _unknown_keys(data: object, model: type, at: str) -> list[str]:
    from pydantic import BaseModel

    if not isinstance(data, dict):
        return []
    out = []
    for key, value in data.items():
        field = model.model_fields.get(key)  # type: ignore[attr-defined]
        if field is None:
            out.append(f"{at}{key}")
        elif inspect.isclass(field.annotation) and issubclass(field.annotation, BaseModel):
            out += _unknown_keys(value, field.annotation, f"{at}{key}.")
    return out


NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}


@pytest.mark.parametrize("doc", DOCS)
def test_a_heading_that_counts_its_list_counts_it_right(doc):
    """ "## Six validation layers" over a numbered list of six: the number follows the list."""
    wrong = []
    lines = _text(doc).splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^#+ (\w+) ", line)
        if not m or m.group(1).lower() not in NUMBERS:
            continue
        section = []
        for later in lines[i + 1 :]:
            if later.startswith("#"):
                break
            section.append(later)
        items = [s for s in section if re.match(r"^\d+\. ", s)]
        if items and len(items) != NUMBERS[m.group(1).lower()]:
            wrong.append(f"{doc}:{i + 1}: {line!r} heads a list of {len(items)}")
    assert not wrong, "\n".join(wrong)

"""The deployment config's `model` section, and the checks that join the model to its units: which
engine runs on which instance type, and whether the unit's layout can serve the model's shape at all.

The layout check is the node's own (contract/layout.py check_layout, which the node runs at start):
a layout the node would refuse is refused at synth, in one line naming the config key, the model and
the unit sizes that would serve. No aws_cdk here: config-only tests import it fast.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BeforeValidator, model_validator

from contract import Engine
from contract.bad_input import NOT_GIVEN, Allowed
from contract.declare import Matches, OneOf
from contract.layout import LayoutError, check_layout
from contract.llama import FIELDS, PRESETS, LlamaShape, ShapeError, load_config_json, preset, preset_names
from stacks.config_rules import S3_URI_ALLOWED, S3_URI_RE, ConfigError, Section, split_s3_uri
from stacks.hosts import is_trainium

if TYPE_CHECKING:
    from stacks.config import FlotillaConfig

# The reference engine's built-in models ('' = none: the node's default, tiny), and the x86 type the
# staging fleet runs on (stacks/hosts.py says why it takes a cluster placement group).
BUILTIN_MODELS = ("", "tiny", "smollm2")
NODE_DEFAULT_MODEL = "tiny"  # FLOTILLA_MODEL's default (runtime/node/settings.py): what runs without model.builtin
STAGING_INSTANCE_TYPE = "m6i.large"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
_PATH_RE = re.compile(r"^\S.{0,1023}$")
# The config keys the layout check's refusals name (contract/layout.py Names).
CONFIG_NAMES: Mapping[str, str] = MappingProxyType(
    {
        "instance_type": "instance_type",
        "nodes": "nodes_per_unit",
        "seq_len": "node.neuron_seq_len",
        "batch_size": "node.neuron_batch_size",
        "prefix_caching_block": "node.neuron_prefix_caching_block",
        "speculation": "speculation.method",
    }
)
SHAPE_ALLOWED = (
    f"a known model ({', '.join(preset_names())}) or a mapping of the model's config.json fields "
    f"({', '.join(FIELDS[:7])}, ...)"
)


def _shape_value(value: Any) -> str | LlamaShape | None:
    """model.shape as given: a preset's name, kept as written, or an inline shape, checked here."""
    if value is None or isinstance(value, LlamaShape):
        return value
    if isinstance(value, str):
        if preset(value) is None:
            raise ConfigError("model.shape", value, SHAPE_ALLOWED, problem="is not a known model")
        return value
    if not isinstance(value, Mapping):
        raise ConfigError("model.shape", value, SHAPE_ALLOWED)
    unknown = sorted(str(k) for k in value if k not in FIELDS)
    if unknown:
        raise ConfigError(
            f"model.shape.{unknown[0]}",
            value[unknown[0]],
            f"use one of {', '.join(FIELDS)}",
            problem="is not a known key",
        )
    try:
        return LlamaShape.from_config(dict(value), source="model.shape")
    except ShapeError as err:
        raise ConfigError(
            "model.shape", NOT_GIVEN, str(err).removeprefix("model.shape: "), problem="does not describe a Llama model"
        ) from None


class ModelConfig(Section):
    """Where the compiled/sharded model artifacts live, the name clients ask for, and the model's shape
    (what synth checks the unit's layout against)."""

    s3_uri: Annotated[str, Matches(S3_URI_RE, S3_URI_ALLOWED)] = "s3://flotilla-models-example/llama-3.1-8b-instruct/"
    """Where the model is published (`python -m runtime artifacts publish`, which writes the
    `flotilla-manifest.json` the nodes verify against); nodes may read only this prefix."""
    name: Annotated[str, Matches(_NAME_RE, "1-128 characters: letters, digits, . _ : / -")] = "llama-3.1-8b-instruct"
    """The name clients send as `model`."""
    shape: Annotated[Any, BeforeValidator(_shape_value), Allowed(SHAPE_ALLOWED)] = None
    """The model's shape, which synth checks the unit's layout and memory against: a known model's name
    (`contract/llama.py` presets) or its `config.json` fields inline. Unset: the preset `model.name` names
    (`llama-3.1-8b-instruct` is `llama-3.1-8b`), else `model.config_json`; a config that names neither a
    known model nor a shape is refused ([model-layout.md](model-layout.md))."""
    config_json: Annotated[str | None, Matches(_PATH_RE, "the path of the model's config.json", optional=True)] = None
    """The path of the model's `config.json` instead of `model.shape`, relative to the YAML file it is
    written in (to the project directory in `cdk.json`)."""
    compile_cache_uri: Annotated[
        str,
        Matches(f"^$|{S3_URI_RE.pattern}", S3_URI_ALLOWED),
        BeforeValidator(lambda v: v or ""),
    ] = ""
    """`neuron` engine: where nodes cache NxD Inference's compiled artifacts, the one prefix they may write
    (the model stays read-only); unset: `s3://<model bucket>/neuron-compile-cache/`."""
    builtin: Annotated[
        str,
        OneOf(*BUILTIN_MODELS, allowed="tiny or smollm2 (the reference engine's built-in models), or omit it"),
    ] = ""
    """`reference` engine only: the built-in model baked into the unit image at build (`runtime/Dockerfile`,
    `BUILTIN_MODEL`), so a staging fleet needs no model bucket; unset: the node's default."""

    @model_validator(mode="after")
    def _one_description(self) -> ModelConfig:
        if self.shape is not None and self.config_json:
            raise ConfigError(
                "model.config_json", self.config_json, "unset when model.shape is set (describe the model once)"
            )
        return self

    @property
    def compile_cache(self) -> str:
        return self.compile_cache_uri or f"s3://{self.bucket}/neuron-compile-cache/"

    @property
    def compile_cache_bucket(self) -> str:
        return split_s3_uri(self.compile_cache)[0]

    @property
    def compile_cache_prefix(self) -> str:
        return split_s3_uri(self.compile_cache)[1]

    @property
    def bucket(self) -> str:
        return split_s3_uri(self.s3_uri)[0]

    @property
    def prefix(self) -> str:
        """Key prefix inside the bucket, no leading slash; '' means the whole bucket."""
        return split_s3_uri(self.s3_uri)[1]


def model_shape(cfg: FlotillaConfig) -> tuple[LlamaShape, str] | None:
    """The shape the units run and the name a refusal calls the model by; None for the echo engine,
    which runs no model. Raises ConfigError when the config does not say which shape."""
    m, engine = cfg.model, cfg.node.engine
    if engine == Engine.ECHO:
        return None
    if engine == Engine.REFERENCE:
        # The reference engine runs its built-in model (FLOTILLA_MODEL), tiny when none is set.
        if m.shape is not None or m.config_json:
            key = "model.shape" if m.shape is not None else "model.config_json"
            raise ConfigError(key, m.config_json or m.shape, "unset with node.engine reference (it runs model.builtin)")
        name = m.builtin or NODE_DEFAULT_MODEL
        return PRESETS[name], name
    named = preset(m.name)
    if isinstance(m.shape, LlamaShape):
        return m.shape, m.name
    if isinstance(m.shape, str):
        given = preset(m.shape)
        assert given is not None  # _shape_value refused unknown names
        if named is not None and named != given:
            raise ConfigError(
                "model.shape",
                m.shape,
                f"the shape of the model model.name names, or a model.name that is not {m.name}",
                problem=f"disagrees with model.name {m.name}, a known model of another shape",
            )
        return given, m.name
    if m.config_json:
        try:
            return load_config_json(m.config_json), m.name
        except ShapeError as err:
            raise ConfigError(
                "model.config_json", m.config_json, str(err), problem="is not a usable config.json"
            ) from None
    if named is not None:
        return named, m.name
    raise ConfigError(
        "model.shape",
        NOT_GIVEN,
        f"give {SHAPE_ALLOWED}, or model.config_json: the path of its config.json",
        problem=f"is needed: model.name {m.name} is not a known model, and synth checks the units' layout against "
        "the model's shape",
    )


def check_model_layout(cfg: FlotillaConfig) -> None:
    """Refuse a layout the node would refuse at start: the node's own check (contract/layout.py), on the
    model's shape, at the settings the stacks give the node."""
    resolved = model_shape(cfg)
    if resolved is None:
        return
    shape, name = resolved
    try:
        check_layout(
            shape,
            engine=cfg.node.engine,
            instance_type=cfg.instance_type,
            nodes=cfg.nodes_per_unit,
            seq_len=cfg.node.neuron_seq_len,
            batch_size=cfg.node.neuron_batch_size,
            prefix_caching_block=cfg.node.neuron_prefix_caching_block,
            model=name,
            names=CONFIG_NAMES,
            speculation=cfg.speculation.method,  # an EAGLE draft's memory, estimated (contract/sizing.py)
        )
    except LayoutError as err:
        raise ConfigError(err.name, err.value, err.fix, problem=err.problem) from None


def check_engine_fits_instance(cfg: FlotillaConfig) -> None:
    """The neuron engine needs Trainium's Neuron devices; the CPU engines (reference, echo) belong on
    the x86 staging types, where they cost cents, not on Trainium, where they would leave every
    NeuronCore idle. A built-in model is the reference engine's only."""
    engine, trainium = cfg.node.engine, is_trainium(cfg.instance_type)
    if engine == Engine.NEURON and not trainium:
        raise ConfigError(
            "node.engine",
            engine,
            f"reference with instance_type {cfg.instance_type} (the neuron engine needs Trainium; "
            "or set instance_type to a trn type)",
        )
    if engine != Engine.NEURON and trainium:
        raise ConfigError(
            "node.engine",
            engine,
            f"neuron with instance_type {cfg.instance_type} (the {engine} engine runs on CPU: stage it on an x86 "
            f"type such as {STAGING_INSTANCE_TYPE}, examples/staging.yaml)",
        )
    block = cfg.node.neuron_prefix_caching_block
    if block and (engine != Engine.NEURON or cfg.nodes_per_unit > 1):
        raise ConfigError(
            "node.neuron_prefix_caching_block",
            block,
            f"0 with node.engine {engine} and nodes_per_unit {cfg.nodes_per_unit} (prefix caching runs on "
            "one-node neuron units only: set nodes_per_unit 1 and node.engine neuron, or 0)",
        )
    if cfg.model.builtin and engine != Engine.REFERENCE:
        raise ConfigError(
            "model.builtin",
            cfg.model.builtin,
            "unset with node.engine neuron or echo (built-in models are the reference engine's)",
        )

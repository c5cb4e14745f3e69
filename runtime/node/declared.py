"""How a node setting is declared once (flag, environment variable, default, rule, help) and read
back for the parser, the error messages and docs/node.md (runtime/node/settings.py declares them).
The rule is contract.declare's, the one toolkit of the node, router and deployment config settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

from contract.declare import OneOf, Rule, number_text, rule_of
from runtime.artifacts.manifest import ManifestError, parse_s3_uri


class Misplaced(ValueError):
    """A rule checked while validating one field that the operator must fix on another (`at`)."""

    def __init__(self, at: tuple[str, ...], why: str) -> None:
        super().__init__(why)
        self.at = at


def setting(
    default: Any,
    flag: str,
    env: str,
    help: str,
    *,
    shown: str | None = None,
    neuron_default: Any = None,
    rule: Rule | None = None,
) -> Any:
    """Declare one setting. `help` is both the --help text and the docs' meaning; `shown` replaces
    the default in both when it is computed; `rule` (contract.declare) checks the value, words its
    refusal and states the docs' allowed values. A node reads every value as text (a flag, a
    variable), so the rule parses text."""
    field: FieldInfo = Field(
        default,
        description=help,
        json_schema_extra={"flag": flag, "env": env, "shown": shown, "neuron_default": neuron_default},
    )
    if rule is not None:
        # A field's metadata is the Annotated metadata pydantic applies to its type
        # (https://docs.pydantic.dev/latest/concepts/fields/, "Using Annotated"): the rule runs as
        # it would written as Annotated[int, rule].
        field.metadata.append(rule.reading_text())
    return field


class DeclaredSettings(BaseModel):
    """The base of a group of declared settings: frozen, every default validated, unknown keys refused."""

    # A rule that needs other settings is a field validator reading `info.data` (the fields declared
    # before it that validated: https://docs.pydantic.dev/latest/concepts/validators/, "Validation is
    # done in the order fields are defined"), not a model validator, because it also computes the
    # field (world_size from the peers, api_port, model_name) and a frozen model cannot change after
    # validation. validate_default: those validators must run when the field was not given too.
    model_config = ConfigDict(frozen=True, validate_default=True, str_strip_whitespace=True, extra="forbid")


def extra_of(f: FieldInfo) -> dict[str, Any]:
    return f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}


@dataclass(frozen=True)
class Declared:
    """One declared setting, as the parser, the error messages and the docs read it."""

    path: tuple[str, ...]  # ("seq_len",) is NodeSettings.seq_len; ("neuron", "seq_len") its group's
    flag: str
    env: str
    help: str
    default: Any
    shown: str | None
    neuron_default: Any
    rule: Rule | None

    @property
    def dest(self) -> str:
        return ".".join(self.path)

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(map(str, self.rule.choices)) if isinstance(self.rule, OneOf) else ()

    def default_text(self) -> str:
        text = self.shown if self.shown is not None else "—" if self.default is None else _num(self.default)
        return text if self.neuron_default is None else f"{text} (neuron: {_num(self.neuron_default)})"

    def allowed(self) -> str:
        """The docs' allowed values: the rule's words, or — when a validator of the setting checks it."""
        return self.rule.allowed if self.rule is not None else "—"


def _num(v: Any) -> str:
    return number_text(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def declared(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> tuple[Declared, ...]:
    out = []
    for name, f in model.model_fields.items():
        x = extra_of(f)
        if "flag" not in x:
            continue
        out.append(
            Declared(
                path=(*prefix, name),
                flag=x["flag"],
                env=x["env"],
                help=f.description or "",
                default=f.default,
                shown=x["shown"],
                neuron_default=x["neuron_default"],
                rule=rule_of(f.metadata),
            )
        )
    return tuple(out)


def s3_uri(raw: str) -> str:
    uri = raw.strip()
    try:
        parse_s3_uri(uri)  # the same rule fetch and publish apply
    except ManifestError:
        raise ValueError("is not an S3 URI: give s3://bucket/prefix") from None
    return uri

"""How a node setting is declared once (flag, environment variable, default, rule, help) and read
back for the parser, the error messages and docs/node.md (runtime/node/settings.py declares them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic.fields import FieldInfo

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
    choices: Sequence[str] = (),
    empty_fix: str | None = None,
    **rules: Any,
) -> Any:
    """Declare one setting. `help` is both the --help text and the docs' meaning; `shown` replaces
    the default in both when it is computed; `rules` are pydantic's constraints (ge, le, ...)."""
    return Field(
        default,
        description=help,
        json_schema_extra={
            "flag": flag,
            "env": env,
            "shown": shown,
            "neuron_default": neuron_default,
            "choices": list(choices),
            "empty_fix": empty_fix,
        },
        **rules,
    )


class DeclaredSettings(BaseModel):
    """The base of a group of declared settings: frozen, every default validated, unknown keys refused."""

    # A rule that needs other settings is a field validator reading `info.data` (the fields declared
    # before it that validated: https://docs.pydantic.dev/latest/concepts/validators/, "Validation is
    # done in the order fields are defined"), not a model validator, because it also computes the
    # field (world_size from the peers, api_port, model_name) and a frozen model cannot change after
    # validation. validate_default: those validators must run when the field was not given too.
    model_config = ConfigDict(frozen=True, validate_default=True, str_strip_whitespace=True, extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _declared_rules(cls, v: Any, info: ValidationInfo) -> Any:
        extra = extra_of(cls.model_fields[info.field_name or ""])
        if extra.get("empty_fix") and v == "":
            raise ValueError(f"is empty: {extra['empty_fix']}")
        if extra.get("choices") and v not in extra["choices"]:
            raise ValueError(f"is not known: use one of {', '.join(extra['choices'])}")
        return v


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
    choices: tuple[str, ...]
    lo: float | None
    hi: float | None

    @property
    def dest(self) -> str:
        return ".".join(self.path)

    def default_text(self) -> str:
        text = self.shown if self.shown is not None else "—" if self.default is None else _num(self.default)
        return text if self.neuron_default is None else f"{text} (neuron: {_num(self.neuron_default)})"

    def meaning(self) -> str:
        """The docs' text: the help and, for a choice, the values (which --help shows as the metavar)."""
        if not self.choices:
            return self.help
        values = [f"`{c}`" for c in self.choices]
        return f"{self.help}: {', '.join(values[:-1])} or {values[-1]}" if len(values) > 1 else self.help

    def allowed(self) -> str:
        """' in 1..64', ' >= 0' or '': what a number may be."""
        if self.lo is not None and self.hi is not None:
            return f" in {_num(self.lo)}..{_num(self.hi)}"
        return f" >= {_num(self.lo)}" if self.lo is not None else ""


def _num(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def declared(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> tuple[Declared, ...]:
    out = []
    for name, f in model.model_fields.items():
        x = extra_of(f)
        if "flag" not in x:
            continue
        lo = next((m.ge for m in f.metadata if hasattr(m, "ge")), None)
        hi = next((m.le for m in f.metadata if hasattr(m, "le")), None)
        out.append(
            Declared(
                path=(*prefix, name),
                flag=x["flag"],
                env=x["env"],
                help=f.description or "",
                default=f.default,
                shown=x["shown"],
                neuron_default=x["neuron_default"],
                choices=tuple(x["choices"]),
                lo=lo,
                hi=hi,
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

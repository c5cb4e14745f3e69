"""How the deployment config words a refusal and declares a field's rule: the pieces every section of
the config (stacks/config.py, stacks/model_config.py) is built from.

A rejected value raises ConfigError, one line in contract.bad_input's wording: the key, the bad value,
what is allowed. No aws_cdk here: config-only tests import it fast.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError, core_schema

from contract.bad_input import Allowed as Allowed  # re-exported: the sections import it from here
from contract.bad_input import BadInput
from contract.settings import SettingsError

S3_URI_RE = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/[^\s]*)?$")
S3_URI_ALLOWED = "an S3 URI like s3://bucket/prefix/"


class ConfigError(BadInput, SettingsError):
    """A configuration value the user must fix: one line naming key, value and what is allowed (the
    settings error of every layer, contract/settings.py)."""

    def __init__(self, key: str, value: Any, allowed: str, *, problem: str = "is not allowed"):
        self.key, self.allowed = key, allowed
        super().__init__(key, value, problem, allowed)


# --- Field rules: pydantic does the checking, the rule words the refusal ------------------------
REFUSED = "flotilla_refused"  # error type whose context carries the `allowed` text


def refuse(allowed: str) -> PydanticCustomError:
    return PydanticCustomError(REFUSED, "{allowed}", {"allowed": allowed})


class Rule:
    """Annotated metadata: validate with a pydantic-core schema; on any failure report `allowed`.

    It supplies the field's whole schema, so it comes first in Annotated[...]; a BeforeValidator
    after it runs before it.
    """

    def __init__(self, schema: core_schema.CoreSchema, allowed: str):
        self.schema, self.allowed = schema, allowed

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        def check(value: Any, validate: Callable[[Any], Any]) -> Any:
            try:
                return validate(value)
            except ValidationError:
                raise refuse(self.allowed) from None

        return core_schema.no_info_wrap_validator_function(check, self.schema)


class Listed:
    """Annotated metadata for a list field: a list (or tuple) of `sizes` items, else a refusal in the
    words `allowed` gives; each item is then checked by its own rule. Comes after the tuple type."""

    def __init__(self, allowed: str, sizes: Callable[[int], bool] = lambda n: True):
        self.allowed, self.sizes = allowed, sizes

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        def check(value: Any) -> Any:
            if isinstance(value, (list, tuple)) and self.sizes(len(value)):
                return value
            raise refuse(self.allowed)

        return core_schema.no_info_before_validator_function(check, handler(source))


def between(lo: int, hi: int, why: str = "") -> Rule:
    """An int (not a bool, not a numeric string) from lo to hi."""
    return Rule(
        core_schema.int_schema(ge=lo, le=hi, strict=True),
        f"an integer from {lo} to {hi}" + (f" ({why})" if why else ""),
    )


def one_of(choices: tuple[Any, ...]) -> Rule:
    schema: core_schema.CoreSchema = core_schema.literal_schema(list(choices))
    if all(isinstance(c, int) for c in choices):
        # A literal 1 also takes True (True == 1): demand a real int first.
        schema = core_schema.chain_schema([core_schema.int_schema(strict=True), schema])
    return Rule(schema, "one of " + ", ".join(map(str, choices)))


def matches(pattern: re.Pattern[str], allowed: str, *, optional: bool = False) -> Rule:
    """A string matching pattern; with optional, None (the key left out) too."""
    # pydantic-core matches with Rust's regex crate (ConfigDict.regex_engine defaults to
    # 'rust-regex', docs.pydantic.dev/latest/api/config/): the patterns above mean the same there,
    # except that `$` is the end of the text only, where Python's also allows a final newline.
    schema: core_schema.CoreSchema = core_schema.str_schema(pattern=pattern.pattern, strict=True)
    if optional:
        return Rule(core_schema.nullable_schema(schema), allowed + " (or omit it)")
    return Rule(schema, allowed)


def split_s3_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/some/prefix/ -> ("bucket", "some/prefix/"); the prefix is '' for a bare bucket."""
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    return bucket, prefix


class Section(BaseModel):
    # Unknown keys are typos: refuse them rather than ignore a setting the operator meant.
    # A field's docstring is its description: its meaning in docs/configuration.md (stacks/config_doc.py).
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

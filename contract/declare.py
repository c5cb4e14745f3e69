"""How a setting's rule is declared once, wherever an operator gives the value: the deployment config
(stacks/), a node's flags and variables (runtime/node/settings.py), a router's
(runtime/router/settings.py) and the operations CLI's flags (ops/errors.py FlagType, check_arg). A
rule is pydantic Annotated metadata holding three things: the check, its one refusal (`<input as
given>=<value> <problem>: give <allowed>`, contract.bad_input's line; the layer names the input: a
config key, a flag or a variable) and the allowed values the docs show.
"""

from __future__ import annotations

import argparse
import copy
import math
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import GetCoreSchemaHandler, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError, core_schema

from contract.bad_input import EMPTY, NOT_A_NUMBER, NOT_FINITE, Allowed, BadInput, integer_range, number_range
from contract.bad_input import NOT_ALLOWED as NOT_ALLOWED  # re-exported: the layers' validators word with them
from contract.bad_input import NOT_AN_INTEGER as NOT_AN_INTEGER
from contract.bad_input import OUT_OF_RANGE as OUT_OF_RANGE
from contract.bad_input import number_text as number_text  # the docs' tables show numbers so too

REFUSED = "flotilla_refused"  # the pydantic error type of every refusal: ctx holds its problem and fix


def refusal(problem: str, fix: str) -> PydanticCustomError:
    """Raise it from a validator; the layer shows it as `<input as given>=<value> <problem>: <fix>`."""
    return PydanticCustomError(REFUSED, "{problem}: {fix}", {"problem": problem, "fix": fix})


def refused(error: Mapping[str, Any]) -> tuple[str, str] | None:
    """(problem, fix) of one of pydantic's error dicts that a refusal raised, else None."""
    if error.get("type") != REFUSED:
        return None
    ctx = error.get("ctx") or {}
    return str(ctx["problem"]), str(ctx["fix"])


class Rule:
    """A check with its one wording. A subclass sets `allowed` (the docs' text; the refusal's fix is
    "give " + it) and may override `schema` (the type check, run first: a failure there is
    `type_problem`) and `problem` (what is wrong with a value of the right type, or None)."""

    allowed: str = ""
    text = False  # the value may be text to parse: see Integer

    @property
    def fix(self) -> str:
        return f"give {self.allowed}"

    def reading_text(self) -> Rule:
        """This rule for a layer that reads every value as text (a node's flags and variables)."""
        rule = copy.copy(self)
        rule.text = True
        return rule

    def schema(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return handler(source)

    def type_problem(self, value: Any) -> str:
        return NOT_ALLOWED

    def problem(self, value: Any) -> str | None:
        return None

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def check(value: Any, validate: Callable[[Any], Any]) -> Any:
            try:
                out = validate(value)
            except ValidationError as exc:
                if any(e["type"] == REFUSED for e in exc.errors()):
                    raise  # a rule inside this one (a list's item) already worded it
                raise refusal(self.type_problem(value), self.fix) from None
            problem = None if out is None else self.problem(out)
            if problem is not None:
                raise refusal(problem, self.fix)
            return out

        return core_schema.no_info_wrap_validator_function(check, self.schema(source, handler))


def _optional(schema: core_schema.CoreSchema, optional: bool) -> core_schema.CoreSchema:
    return core_schema.nullable_schema(schema) if optional else schema


def _why(text: str, why: str, optional: bool) -> str:
    return text + (f" ({why})" if why else "") + (" (or omit it)" if optional else "")


class Integer(Rule):
    """An integer from lo to hi (hi None: no upper bound). `text`: the layer reads text (a flag, an
    environment variable), so '64' is 64; otherwise only an int (not a bool) is one, so a quoted YAML
    value is refused rather than guessed. `optional`: None (the key left out) too."""

    def __init__(
        self, lo: int, hi: int | None = None, why: str = "", *, text: bool = False, optional: bool = False
    ) -> None:
        self.lo, self.hi, self.text, self.optional = lo, hi, text, optional
        self.allowed = _why(integer_range(lo, hi), why, optional)

    def schema(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return _optional(core_schema.int_schema(strict=not self.text), self.optional)

    def type_problem(self, value: Any) -> str:
        return NOT_AN_INTEGER

    def problem(self, value: Any) -> str | None:
        return OUT_OF_RANGE if value < self.lo or (self.hi is not None and value > self.hi) else None


class Number(Rule):
    """A finite number from lo to hi (`above`: greater than lo; `below`: less than hi); an int counts.
    `text` as for Integer."""

    def __init__(
        self,
        lo: float,
        hi: float | None = None,
        why: str = "",
        *,
        above: bool = False,
        below: bool = False,
        text: bool = False,
    ) -> None:
        self.lo, self.hi, self.above, self.below, self.text = lo, hi, above, below, text
        self.allowed = _why(number_range(lo, hi, above=above, below=below), why, False)

    def schema(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.float_schema(allow_inf_nan=False, strict=not self.text)

    def type_problem(self, value: Any) -> str:
        try:
            return NOT_A_NUMBER if math.isfinite(float(value)) else NOT_FINITE
        except (TypeError, ValueError):
            return NOT_A_NUMBER

    def problem(self, value: Any) -> str | None:
        low = value <= self.lo if self.above else value < self.lo
        high = self.hi is not None and (value >= self.hi if self.below else value > self.hi)
        return OUT_OF_RANGE if low or high else None


class OneOf(Rule):
    """One of `choices` (none given: the field's Literal values), shown as `allowed` or "one of ...".
    Integer choices take only an int (not a bool, which equals 0 or 1) unless `text`."""

    def __init__(self, *choices: Any, why: str = "", allowed: str = "", text: bool = False) -> None:
        self.choices, self.why, self.text, self.said = tuple(choices), why, text, allowed
        self.allowed = self._words() if choices else ""

    def _words(self) -> str:
        """`allowed` when given (choices that need explaining), else "one of a, b, c"."""
        return self.said or _why("one of " + ", ".join(map(str, self.choices)), self.why, False)

    def schema(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        if not self.choices:
            if get_origin(source) is not Literal:
                raise TypeError(f"OneOf() without choices needs a Literal field, not {source!r}")
            self.choices = get_args(source)
            self.allowed = self._words()
        if all(isinstance(c, int) and not isinstance(c, bool) for c in self.choices):
            return core_schema.int_schema(strict=not self.text)
        return handler(source)

    def problem(self, value: Any) -> str | None:
        return None if value in self.choices else NOT_ALLOWED


class Matches(Rule):
    """A string matching `pattern`, described by `allowed`; `optional`: None (the key left out) too."""

    def __init__(self, pattern: re.Pattern[str] | str, allowed: str, *, optional: bool = False) -> None:
        self.pattern = pattern if isinstance(pattern, str) else pattern.pattern
        self.optional = optional
        self.allowed = _why(allowed, "", optional)

    def schema(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        # pydantic-core matches with Rust's regex crate (ConfigDict.regex_engine defaults to
        # 'rust-regex', docs.pydantic.dev/latest/api/config/): the patterns flotilla declares mean the
        # same there, except that `$` is the end of the text only, where Python's also allows a final
        # newline.
        return _optional(core_schema.str_schema(pattern=self.pattern, strict=True), self.optional)


class Bool(Rule):
    """true or false, and nothing that merely converts to one ('yes', 1)."""

    allowed = "true or false"

    def schema(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.bool_schema(strict=True)


class NonEmpty(Rule):
    """Any text but the empty one; `allowed` says what to give."""

    def __init__(self, allowed: str) -> None:
        self.allowed = allowed

    def problem(self, value: Any) -> str | None:
        return EMPTY if value == "" else None


class Items(Rule):
    """A list (or tuple) whose length `sizes` accepts; each item is then checked by its own rule, whose
    refusal names the item. Comes after the tuple type in Annotated."""

    def __init__(self, allowed: str, sizes: Callable[[int], bool] = lambda n: True) -> None:
        self.allowed, self.sizes = allowed, sizes

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def check(value: Any) -> Any:
            if isinstance(value, (list, tuple)) and self.sizes(len(value)):
                return value
            raise refusal(NOT_ALLOWED, self.fix)

        return core_schema.no_info_before_validator_function(check, handler(source))


def checked(name: str, value: Any, rule: Rule, *, text: bool = False) -> Any:
    """`value` as `rule` takes it, for an input checked on its own rather than in a settings model (an
    operations CLI flag); else BadInput in the rule's words, naming the input. `text`: the value is
    text to read (a flag's), as a node's flags are read."""
    try:
        return TypeAdapter(Annotated[Any, rule.reading_text() if text else rule]).validate_python(value)
    except ValidationError as exc:
        words = refused(exc.errors()[0])
        if words is None:  # every error a Rule raises is a refusal: anything else is a bug here
            raise
        raise BadInput(name, value, *words, text=text) from None


def rule_of(metadata: Iterable[Any]) -> Rule | None:
    """A field's rule among its Annotated metadata (pydantic's FieldInfo.metadata)."""
    return next((m for m in metadata if isinstance(m, Rule)), None)


def allowed_of(metadata: Iterable[Any]) -> str | None:
    """The allowed values the docs show for a field: its rule's, or an Allowed(...) when a validator
    function checks it."""
    return next((m.allowed for m in metadata if isinstance(m, (Rule, Allowed))), None)


# --- the settings tables in the docs -----------------------------------------------------------------
# The node's and the router's settings tables (docs/node.md, docs/router.md) are rendered from their
# declarations and kept between two marker lines; one piece of code rewrites them and prints them.


def spliced(doc: str, begin: str, end: str, table: str, where: object) -> str:
    """`doc` with the text between the lines `begin` and `end` replaced by `table`; `where` names the
    doc in the error when a marker is missing."""
    head, found_begin, rest = doc.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not found_begin or not found_end:
        raise ValueError(f"{where} lacks the lines {begin!r} and {end!r}: put them around the settings table")
    return f"{head}{begin}\n{table}\n{end}{tail}"


def settings_docs_parser(prog: str, whose: str, docs: Path) -> argparse.ArgumentParser:
    """The parser of `python -m <prog> [--write-docs]`: print `whose` settings table, or rewrite it in `docs`."""
    p = argparse.ArgumentParser(prog=prog, description=f"Print {whose} settings table, or rewrite it in {docs.name}.")
    p.add_argument("--write-docs", action="store_true", help=f"rewrite the table in {docs}")
    return p

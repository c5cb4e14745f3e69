"""One wording for a value an operator gave wrongly, wherever it was given (a deployment config key,
a node or router flag or environment variable, an operations CLI argument):

    <the input as given>=<the value> <what is wrong>: <the fix>

one line, so that a log line, a CI failure and a terminal all show the whole of it.
"""

from __future__ import annotations

import re
from typing import Any

_PLAIN = re.compile(r"[\w.:/,@+\-]+")  # text shown as is: no quotes needed to see where it ends
_NEWLINES = re.compile(r"\s*\n\s*")


def shown(value: Any, *, text: bool = False) -> str:
    """The value as the operator wrote it. `text`: it came from a flag, an environment variable or a
    command line, where every value is a string, so quotes would only add noise; a plain token is
    shown bare there. A typed value (YAML, a Python call) is shown as repr, so '2' differs from 2."""
    if text and isinstance(value, str) and _PLAIN.fullmatch(value):
        return value
    return repr(value)


class _NotGiven:
    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Any = _NotGiven()  # the value of an input the operator left out (a required one, say)


def bad_input_line(name: str, value: Any, problem: str, fix: str, *, text: bool = False) -> str:
    """`<name>=<value> <problem>: <fix>` (`<name> <problem>: <fix>` for a value NOT_GIVEN); problem
    such as "is out of range", fix such as "give an integer from 1 to 64" (contract.declare words
    each rule's). Newlines in any part are folded, so the result is always one line."""
    given = "" if value is NOT_GIVEN else f"={shown(value, text=text)}"
    return _NEWLINES.sub(" ", f"{name}{given} {problem}: {fix}")


class BadInput(ValueError):
    """A value the operator must fix; str() is bad_input_line's one line."""

    def __init__(self, name: str, value: Any, problem: str, fix: str, *, text: bool = False) -> None:
        self.name, self.value, self.problem, self.fix = name, value, problem, fix
        super().__init__(bad_input_line(name, value, problem, fix, text=text))


# What is wrong with a value: one phrase per kind of mistake, the same wherever it is given. The
# words of a range live here, with the standard library only, so that code shipped without pydantic
# (the scaler's Lambda function, contract/scaling.py) words a range as contract.declare's rules do.
OUT_OF_RANGE = "is out of range"
NOT_AN_INTEGER = "is not an integer"
NOT_A_NUMBER = "is not a number"
NOT_FINITE = "is not a finite number"
NOT_ALLOWED = "is not allowed"
EMPTY = "is empty"


def number_text(value: float) -> str:
    """1, 0.25, 1e+06: a bound as the docs and the refusals show it."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _span(lo: float, hi: float | None, above: bool, below: bool = False) -> str:
    low = f"above {number_text(lo)}" if above else f"of at least {number_text(lo)}"
    if hi is None:
        return low
    if not (above or below):
        return f"from {number_text(lo)} to {number_text(hi)}"
    return f"{low}, {'below' if below else 'at most'} {number_text(hi)}"


def integer_range(lo: int, hi: int | None = None) -> str:
    """'an integer from 1 to 64', 'an integer of at least 1': what a range allows, in every layer's words."""
    return f"an integer {_span(lo, hi, False)}"


def number_range(lo: float, hi: float | None = None, *, above: bool = False, below: bool = False) -> str:
    """'a number from 0.01 to 60', 'a number above 0', 'a number above 0, at most 1', 'a number of at
    least 0, below 1' (`above`: greater than lo; `below`: less than hi)."""
    return f"a number {_span(lo, hi, above, below)}"


class Allowed:
    """Annotated metadata for a field whose checking lives elsewhere (a validator function): the values
    it takes, in its refusal's words, for the configuration reference (stacks/config_doc.py). Here, not
    in stacks/, so a section the node shares (contract.speculation.Speculation) can state them too."""

    def __init__(self, allowed: str):
        self.allowed = allowed

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


class Allowed:
    """Annotated metadata for a field whose checking lives elsewhere (a validator function): the values
    it takes, in its refusal's words, for the configuration reference (stacks/config_doc.py). Here, not
    in stacks/, so a section the node shares (contract.speculation.Speculation) can state them too."""

    def __init__(self, allowed: str):
        self.allowed = allowed

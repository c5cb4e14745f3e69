"""The one error every settings layer raises for a value an operator gave wrongly: the deployment
config (stacks/config_rules.py ConfigError), a node's settings (runtime/node/settings.py) and a
router's (runtime/router/settings.py). Its message is one line in contract.bad_input's wording,
`<input as given>=<value> <problem>: <fix>`, several joined with "; "; each value's problem and fix
come from its rule, declared with contract.declare."""

from __future__ import annotations

from typing import Any


class SettingsError(ValueError):
    """A setting the operator gave is wrong; the message names it as given, its value and the fix."""

    def __init__(self, message: str, *, problems: list[Any] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []  # pydantic's error dicts, to name where each value came from

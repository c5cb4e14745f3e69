"""The deployment config as `cdk synth` reads it (the `flotilla` context of ./cdk.json, overridden by
`-c config=PATH`), validated by the CDK app's own loader, for the commands that take --config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ops.errors import UsageError

if TYPE_CHECKING:
    from stacks.config import FlotillaConfig


def read_config(path: str | None) -> FlotillaConfig:
    """The config the CDK app would build from `-c config=PATH` in this directory (PATH None: from
    cdk.json alone, as `make synth` without CONFIG), validated by the app's own loader
    (stacks/config.py, which imports no aws_cdk); its errors become exit status 2."""
    shown = path or "cdk.json"
    try:
        # Imported here: the operations CLI installs without stacks/ (pyproject's packages), and only
        # the commands that read a config need it.
        from stacks.config import ConfigError, load_config  # noqa: PLC0415
    except ImportError as err:
        raise UsageError(
            f"--config {shown}: reading a flotilla config needs a flotilla checkout with its requirements "
            f"(stacks/config.py): run from the repository root ({err})"
        ) from None
    context: Any = None
    cdk_json = Path("cdk.json")
    if cdk_json.is_file():
        try:
            context = json.loads(cdk_json.read_text()).get("context", {}).get("flotilla")
        except (ValueError, AttributeError):
            raise UsageError(f"{cdk_json.resolve()}: not a cdk.json (a JSON object with a `context` object)") from None
    try:
        return load_config(context, path)
    except ConfigError as err:
        raise UsageError(f"--config {shown}: {err}") from None

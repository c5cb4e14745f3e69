"""The deployment config as `cdk synth` reads it (the `flotilla` context of ./cdk.json, overridden by
`-c config=PATH`), validated by the CDK app's own loader, for the commands that take --config or
write a config."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ops.errors import UsageError

if TYPE_CHECKING:
    from stacks.config import FlotillaConfig


def _loader(what: str) -> Any:
    try:
        # Imported here: the operations CLI installs without stacks/ (pyproject's packages), and only
        # the commands that read or write a config need it.
        import stacks.config  # noqa: PLC0415
    except ImportError as err:
        raise UsageError(
            f"{what}: reading a flotilla config needs a flotilla checkout with its requirements "
            f"(stacks/config.py): run from the repository root ({err})"
        ) from None
    return stacks.config


def _context() -> Any:
    cdk_json = Path("cdk.json")
    if not cdk_json.is_file():
        return None
    try:
        return json.loads(cdk_json.read_text()).get("context", {}).get("flotilla")
    except (ValueError, AttributeError):
        raise UsageError(f"{cdk_json.resolve()}: not a cdk.json (a JSON object with a `context` object)") from None


def read_config(path: str | None) -> FlotillaConfig:
    """The config the CDK app would build from `-c config=PATH` in this directory (PATH None: from
    cdk.json alone, as `make synth` without CONFIG), validated by the app's own loader
    (stacks/config.py, which imports no aws_cdk); its errors become exit status 2."""
    shown = path or "cdk.json"
    config = _loader(f"--config {shown}")
    try:
        cfg: FlotillaConfig = config.load_config(_context(), path)
    except config.ConfigError as err:
        raise UsageError(f"--config {shown}: {err}") from None
    return cfg


def config_error(text: str) -> str | None:
    """What `cdk synth -c config=<a file holding text>` would refuse in this directory, or None."""
    config = _loader("--write")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "flotilla.yaml"
        path.write_text(text)
        try:
            config.load_config(_context(), str(path))
        except config.ConfigError as err:
            return str(err)
    return None

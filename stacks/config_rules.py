"""The deployment config's refusal and the base of its sections: the pieces every section of the config
(stacks/config.py, stacks/config_sections.py, stacks/model_config.py) is built from. A field's rule is
declared with contract.declare (the one toolkit of the config, node and router settings).

A rejected value raises ConfigError, one line in contract.bad_input's wording: the key, the bad value,
what is wrong and what to give. No aws_cdk here: config-only tests import it fast.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from contract.bad_input import BadInput
from contract.declare import NOT_ALLOWED
from contract.settings import SettingsError

S3_URI_RE = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/[^\s]*)?$")
S3_URI_ALLOWED = "an S3 URI like s3://bucket/prefix/"


class ConfigError(BadInput, SettingsError):
    """A configuration value the user must fix: one line naming key, value and what is allowed (the
    settings error of every layer, contract/settings.py)."""

    def __init__(self, key: str, value: Any, allowed: str, *, problem: str = NOT_ALLOWED):
        self.key, self.allowed = key, allowed
        super().__init__(key, value, problem, allowed)


def split_s3_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/some/prefix/ -> ("bucket", "some/prefix/"); the prefix is '' for a bare bucket."""
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    return bucket, prefix


class Section(BaseModel):
    # Unknown keys are typos: refuse them rather than ignore a setting the operator meant.
    # A field's docstring is its description: its meaning in docs/configuration.md (stacks/config_doc.py).
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

"""node.ami_ids, the config's per-region AMI pins that replace the pinned ECS AMI release's SSM
parameter: their form, checked at synth (this module imports no aws_cdk: stacks/config.py uses it).
`flotilla node-boot check` (and preflight, through ops/ami.py) checks that each resolves in the account.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BeforeValidator

from contract.node_boot import AMI_ID_RE, REGION_RE, node_ami

if TYPE_CHECKING:
    from stacks.config import FlotillaConfig

AMI_IDS_KEY = "node.ami_ids"
AMI_IDS_ALLOWED = "a mapping of region to AMI id, like {us-east-1: ami-0123456789abcdef0}, or omit it"


def _ami_ids(value: Any) -> Any:
    """The YAML mapping -> sorted (region, AMI id) pairs; a refusal names the key and the form."""
    from stacks.config import ConfigError  # noqa: PLC0415 - stacks.config imports this module

    if value is None:
        return ()
    if isinstance(value, tuple):  # already parsed (a config built from a config)
        value = dict(value)
    if not isinstance(value, Mapping):
        raise ConfigError(AMI_IDS_KEY, value, AMI_IDS_ALLOWED)
    for region, ami in value.items():
        if not isinstance(region, str) or not REGION_RE.match(region):
            raise ConfigError(AMI_IDS_KEY, region, "region names like us-east-1 as keys", problem="has a bad key")
        if not isinstance(ami, str) or not AMI_ID_RE.match(ami):
            raise ConfigError(f"{AMI_IDS_KEY}.{region}", ami, "an AMI id: ami- and 8 or 17 hexadecimal digits")
    return tuple(sorted(value.items()))


# (region, AMI id) pairs: a tuple, so the frozen config stays hashable.
AmiIds = Annotated[tuple[tuple[str, str], ...], BeforeValidator(_ami_ids)]


def check_node_ami(cfg: FlotillaConfig) -> None:
    """With a region in the config, the pins must cover it: else the launch template's lookup of
    the region in the map fails at deploy (an environment-agnostic stack defers it to
    CloudFormation's Fn::FindInMap, which fails the change set)."""
    from stacks.config import ConfigError  # noqa: PLC0415

    pins = dict(cfg.node.ami_ids)
    if pins and cfg.region and cfg.region not in pins:
        ami = node_ami(trainium=bool(cfg.shape.chips))
        raise ConfigError(
            AMI_IDS_KEY,
            pins,
            f"an AMI for region {cfg.region} too: the id of {ami.name} there (aws ec2 describe-images --owners "
            f"amazon --filters Name=name,Values={ami.name} --region {cfg.region})",
            problem="has no AMI for the config's region",
        )

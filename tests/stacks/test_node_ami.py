"""node.ami_ids: per-region AMI pins instead of the pinned release's SSM parameter. Synth refuses a
malformed pin (one line naming the key) and a config region the pins do not cover; a pinned
deployment's launch template looks its image up by region in a CloudFormation mapping."""

from __future__ import annotations

import pytest
from synth_helpers import config_with, synthesize

from contract.node_boot import NEURON_AMI_PARAMETER
from stacks.config import ConfigError

PINS = {"us-east-1": "ami-0123456789abcdef0", "ap-southeast-4": "ami-0fedcba9876543210"}


@pytest.mark.parametrize(
    "ami_ids, line",
    [
        (["ami-0123456789abcdef0"], "node.ami_ids=['ami-0123456789abcdef0'] is not allowed: a mapping of region"),
        ({"us-east": "ami-0123456789abcdef0"}, "node.ami_ids='us-east' has a bad key: region names like us-east-1"),
        ({"us-east-1": "ami-123"}, "node.ami_ids.us-east-1='ami-123' is not allowed: an AMI id: ami- and 8 or 17"),
        ({"us-east-1": "i-0123456789abcdef0"}, "node.ami_ids.us-east-1='i-0123456789abcdef0' is not allowed"),
    ],
)
def test_a_malformed_pin_is_refused_with_one_line_naming_the_key(ami_ids, line):
    with pytest.raises(ConfigError) as err:
        config_with(node={"ami_ids": ami_ids})
    assert str(err.value).startswith(line)
    assert "\n" not in str(err.value)


def test_pins_that_miss_the_configs_region_are_refused_with_the_command_that_finds_the_id():
    with pytest.raises(ConfigError) as err:
        config_with(
            region="us-west-2",
            availability_zones=["us-west-2a", "us-west-2b"],
            node={"ami_ids": {"us-east-1": PINS["us-east-1"]}},
        )
    message = str(err.value)
    assert message.startswith("node.ami_ids=") and "has no AMI for the config's region" in message
    assert "aws ec2 describe-images --owners amazon --filters Name=name,Values=al2023-ami-ecs-neuron-hvm-" in message


def test_without_pins_the_launch_template_takes_the_pinned_release_from_ssm(default_synth):
    assert default_synth.deployment.config.node.ami_ids == ()
    (lt,) = default_synth.resources("Cell-0", "AWS::EC2::LaunchTemplate").values()
    ref = lt["Properties"]["LaunchTemplateData"]["ImageId"]["Ref"]
    assert default_synth.template("Cell-0")["Parameters"][ref]["Default"] == NEURON_AMI_PARAMETER


def test_pinned_ids_replace_the_ssm_parameter_with_a_mapping_looked_up_by_region(tmp_path):
    synth = synthesize(config_with(node={"ami_ids": PINS}), tmp_path)
    template = synth.template("Cell-0")
    (lt,) = synth.resources("Cell-0", "AWS::EC2::LaunchTemplate").values()
    mapping, region, attribute = lt["Properties"]["LaunchTemplateData"]["ImageId"]["Fn::FindInMap"]
    assert region == {"Ref": "AWS::Region"}
    assert {r: v[attribute] for r, v in template["Mappings"][mapping].items()} == PINS
    assert not any(NEURON_AMI_PARAMETER == p.get("Default") for p in template.get("Parameters", {}).values())

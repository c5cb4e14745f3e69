"""The moto harness itself: it must fail loudly rather than let moto skip a resource."""

from __future__ import annotations

import pytest
from moto_cfn import MotoCloudFormation


def test_resource_type_without_moto_model_or_stand_in_fails_the_deploy():
    template = {"Resources": {"Thing": {"Type": "AWS::Unknown::Thing", "Properties": {}}}}
    with MotoCloudFormation() as cfn, pytest.raises(AssertionError, match="moto skipped"):
        cfn.create_stack("unknown-type", template)


def test_stand_in_with_unresolved_required_property_fails_the_stack():
    template = {"Resources": {"Pg": {"Type": "AWS::EC2::PlacementGroup", "Properties": {}}}}
    with MotoCloudFormation() as cfn, pytest.raises(Exception):
        cfn.create_stack("pg-without-strategy", template)


def test_stand_in_answers_ref_and_getatt_for_dependent_resources():
    template = {
        "Resources": {
            "Pg": {"Type": "AWS::EC2::PlacementGroup", "Properties": {"Strategy": "cluster"}},
            "Lt": {
                "Type": "AWS::EC2::LaunchTemplate",
                "Properties": {"LaunchTemplateData": {"Placement": {"GroupName": {"Ref": "Pg"}}}},
            },
            "Sg": {
                "Type": "AWS::EC2::SecurityGroup",
                "Properties": {"GroupDescription": {"Fn::GetAtt": ["Pg", "GroupId"]}},
            },
        }
    }
    with MotoCloudFormation() as cfn:
        cfn.create_stack("pg-refs", template)
        created = cfn.created_resources("pg-refs")
        assert set(created) == {"Pg", "Lt", "Sg"}
        ec2 = cfn.client("ec2")
        data = ec2.describe_launch_template_versions(LaunchTemplateId=created["Lt"]["PhysicalResourceId"])[
            "LaunchTemplateVersions"
        ][0]["LaunchTemplateData"]
        assert data["Placement"] == {"GroupName": created["Pg"]["PhysicalResourceId"]}
        sg = ec2.describe_security_groups(GroupIds=[created["Sg"]["PhysicalResourceId"]])["SecurityGroups"][0]
        assert sg["Description"].startswith("placementgroup-")

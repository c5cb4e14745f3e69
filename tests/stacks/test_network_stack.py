"""Network stack: a 3-AZ VPC with private node subnets, flow logs and the endpoints that keep
image pulls, logs and model reads off the NAT gateways."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Match, Template
from synth_helpers import config_with, synthesize


@pytest.fixture(scope="module")
def network(default_synth) -> Template:
    return Template.from_json(default_synth.template("Network"))


def test_vpc_has_public_and_private_subnets_in_three_azs(default_synth):
    subnets = default_synth.resources("Network", "AWS::EC2::Subnet").values()
    azs = {str(s["Properties"]["AvailabilityZone"]) for s in subnets}
    assert len(subnets) == 6 and len(azs) == 3
    private = [
        s["Properties"]
        for s in subnets
        if {"Key": "aws-cdk:subnet-type", "Value": "Private"} in s["Properties"]["Tags"]
    ]
    assert len(private) == 3
    assert all(p["CidrBlock"].endswith("/18") for p in private)
    assert all(s["Properties"]["MapPublicIpOnLaunch"] is False for s in subnets)


def test_each_az_has_its_own_nat_gateway(network):
    network.resource_count_is("AWS::EC2::NatGateway", 3)


def test_vpc_flow_logs_capture_all_traffic_to_cloudwatch_logs(network):
    network.has_resource_properties(
        "AWS::EC2::FlowLog", {"ResourceType": "VPC", "TrafficType": "ALL", "LogDestinationType": "cloud-watch-logs"}
    )
    network.has_resource_properties("AWS::Logs::LogGroup", {"RetentionInDays": 30})


@pytest.mark.parametrize("service", ["ecr.api", "ecr.dkr", "logs"])
def test_interface_endpoints_for_ecr_and_logs_with_private_dns(network, service):
    network.has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {
            "VpcEndpointType": "Interface",
            "PrivateDnsEnabled": True,
            "ServiceName": {"Fn::Join": ["", ["com.amazonaws.", {"Ref": "AWS::Region"}, f".{service}"]]},
        },
    )


def test_gateway_endpoint_for_s3(network):
    network.has_resource_properties(
        "AWS::EC2::VPCEndpoint",
        {
            "VpcEndpointType": "Gateway",
            "ServiceName": {"Fn::Join": ["", ["com.amazonaws.", {"Ref": "AWS::Region"}, ".s3"]]},
        },
    )


def test_endpoint_security_group_admits_only_https_from_the_vpc(network):
    network.has_resource_properties(
        "AWS::EC2::SecurityGroup",
        {
            "GroupDescription": "Interface endpoints: HTTPS from inside the VPC",
            "SecurityGroupIngress": [
                Match.object_like({"IpProtocol": "tcp", "FromPort": 443, "ToPort": 443, "CidrIp": "10.0.0.0/16"})
            ],
        },
    )
    network.has_resource_properties("AWS::EC2::VPC", {"CidrBlock": "10.0.0.0/16"})


def test_no_custom_resources_so_synth_and_moto_stay_offline(default_synth):
    for stack_id in default_synth.templates:
        types = {r["Type"] for r in default_synth.resources(stack_id).values()}
        assert not any(t.startswith("Custom::") or t == "AWS::Lambda::Function" for t in types)


def test_explicit_availability_zones_are_used_in_order(tmp_path):
    azs = ["us-west-2b", "us-west-2c", "us-west-2d"]
    synth = synthesize(config_with(availability_zones=azs, region="us-west-2", account="123456789012"), tmp_path)
    subnets = synth.resources("Network", "AWS::EC2::Subnet").values()
    private = [
        s["Properties"]["AvailabilityZone"]
        for s in subnets
        if {"Key": "aws-cdk:subnet-type", "Value": "Private"} in s["Properties"]["Tags"]
    ]
    assert private == azs


def test_router_security_group_may_only_reach_the_node_port_in_the_vpc_and_https(network):
    network.has_resource_properties(
        "AWS::EC2::SecurityGroup",
        {
            "GroupDescription": "flotilla router tasks: to unit leaders and AWS APIs only",
            "SecurityGroupEgress": [
                {
                    "CidrIp": "10.0.0.0/16",
                    "IpProtocol": "tcp",
                    "FromPort": 8000,
                    "ToPort": 8000,
                    "Description": "Router to the API port of unit members",
                },
                {
                    "CidrIp": "0.0.0.0/0",
                    "IpProtocol": "tcp",
                    "FromPort": 443,
                    "ToPort": 443,
                    "Description": "AWS APIs (service discovery, logs, image pulls) over HTTPS",
                },
            ],
        },
    )

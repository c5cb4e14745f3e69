"""Front door, router service and discovery: what the synthesized templates must say.

The deployment's front-door stacks, with and without a certificate, also go through moto,
cfn-lint and cdk-nag in test_moto_deploy.py, test_cfn_lint.py and test_cdk_nag.py.
"""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_servicediscovery as cloudmap
from aws_cdk.assertions import Annotations, Match, Template
from front_app import (
    ADMISSION_PARAMETER,
    API_KEYS_SECRET,
    CERTIFICATE_ARN,
    CLIENT_CIDR,
    NAMESPACE,
    front_app,
    synthesizer,
    template,
)

import contract
from stacks.discovery import DiscoveryStack, register_unit_members
from stacks.front import PARKED_PORT, FrontProps
from stacks.network import VPC_CIDR
from stacks.router import RouterProps


def resources(stack: str, type_: str, **variant) -> dict[str, dict]:
    return {k: v for k, v in template(stack, **variant)["Resources"].items() if v["Type"] == type_}


def only(stack: str, type_: str, **variant) -> dict:
    found = resources(stack, type_, **variant)
    assert len(found) == 1, f"{stack}: expected one {type_}, found {sorted(found)}"
    return next(iter(found.values()))


def logical_id(stack: str, type_: str, prefix: str) -> str:
    ids = [k for k in resources(stack, type_) if k.startswith(prefix)]
    assert len(ids) == 1, (prefix, ids)
    return ids[0]


def router_service() -> dict:
    return only("Router", "AWS::ECS::Service")["Properties"]


# --- router service: ECS native blue/green -----------------------------------------------------


def test_router_service_deploys_blue_green_with_bake_time_and_circuit_breaker_rollback():
    config = router_service()["DeploymentConfiguration"]
    assert config["Strategy"] == "BLUE_GREEN"
    assert config["BakeTimeInMinutes"] == 10
    assert config["DeploymentCircuitBreaker"] == {"Enable": True, "Rollback": True}
    assert (config["MinimumHealthyPercent"], config["MaximumPercent"]) == (100, 200)
    # The ECS deployment controller (the default when the property is absent) runs blue/green.
    assert router_service().get("DeploymentController", {"Type": "ECS"}) == {"Type": "ECS"}


def test_router_service_rolls_back_on_every_observability_deployment_alarm():
    alarms = router_service()["DeploymentConfiguration"]["Alarms"]
    assert alarms["Enable"] is True and alarms["Rollback"] is True
    imported = sorted(a["Fn::ImportValue"] for a in alarms["AlarmNames"])
    # Not FleetReadyUnits: units loading on a first deploy or rolling out would roll back a
    # healthy router (test_aws_rules.py checks what each deployment alarm measures).
    expected_ids = [
        logical_id("Observability", "AWS::CloudWatch::Alarm", p)
        for p in ("RouterFiveXxRate", "RouterAddedLatency", "UnhealthyRouterTargets")
    ]
    assert len(imported) == 3
    for logical in expected_ids:
        assert any(f"ExportsOutputRef{logical}" in name for name in imported), logical


def test_router_service_targets_blue_with_green_as_alternate_on_the_production_rule_and_no_test_rule():
    (lb,) = router_service()["LoadBalancers"]
    assert lb["ContainerName"] == "router" and lb["ContainerPort"] == contract.ROUTER_PORT
    blue = logical_id("Front", "AWS::ElasticLoadBalancingV2::TargetGroup", "Blue")
    green = logical_id("Front", "AWS::ElasticLoadBalancingV2::TargetGroup", "Green")
    prod = logical_id("Front", "AWS::ElasticLoadBalancingV2::ListenerRule", "ProductionRule")
    assert f"Ref{blue}" in lb["TargetGroupArn"]["Fn::ImportValue"]
    advanced = lb["AdvancedConfiguration"]
    assert f"Ref{green}" in advanced["AlternateTargetGroupArn"]["Fn::ImportValue"]
    assert f"Ref{prod}" in advanced["ProductionListenerRule"]["Fn::ImportValue"]
    # No lifecycle hook reads test traffic, so no test listener (TestListenerRule is optional).
    assert "TestListenerRule" not in advanced
    role = resources("Router", "AWS::IAM::Role")[advanced["RoleArn"]["Fn::GetAtt"][0]]
    assert role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {
        "Service": "ecs.amazonaws.com"
    }


def test_router_runs_in_private_subnets_without_public_ip_in_the_router_security_group():
    network = router_service()["NetworkConfiguration"]["AwsvpcConfiguration"]
    assert network["AssignPublicIp"] == "DISABLED"
    assert all("PrivateSubnet" in s["Fn::ImportValue"] for s in network["Subnets"])
    (sg,) = network["SecurityGroups"]
    assert "GetAttRouterSg" in sg["Fn::ImportValue"]  # Network's router security group
    assert router_service()["LaunchType"] == "FARGATE"


def test_router_container_runs_the_router_command_with_cloudmap_discovery_and_a_health_check():
    (container,) = only("Router", "AWS::ECS::TaskDefinition")["Properties"]["ContainerDefinitions"]
    assert container["Command"] == contract.ROUTER_COMMAND
    env = {e["Name"]: e["Value"] for e in container["Environment"]}
    assert env == {
        contract.ENV_ROLE: "router",
        contract.ENV_PORT: str(contract.ROUTER_PORT),
        contract.ENV_DISCOVERY: "cloudmap",
        contract.ENV_CLOUDMAP_NAMESPACE: NAMESPACE,
        contract.ENV_CLOUDMAP_SERVICE: "units-cell0,units-cell1",
        contract.ENV_DRAIN_TIMEOUT: "60",
        contract.ENV_ADMISSION_PARAMETER: ADMISSION_PARAMETER,
        contract.ENV_BALANCE: "cache_aware",
        # API keys: the secret's name (never a key), how often it is re-read, and how many routers
        # share each key's limits (each admits 1/n)
        contract.ENV_API_KEYS_SECRET: API_KEYS_SECRET,
        contract.ENV_API_KEYS_TTL: "30",
        contract.ENV_LIMIT_ROUTERS: "2",
    }
    assert container["PortMappings"] == [{"ContainerPort": contract.ROUTER_PORT, "Protocol": "tcp"}]
    check = container["HealthCheck"]
    assert check["Command"][:2] == ["CMD", "python3"]
    assert f"127.0.0.1:{contract.ROUTER_PORT}{contract.ROUTER_HEALTH_PATH}" in check["Command"][-1]
    assert container["StopTimeout"] == 70  # drain (60 s) + 10 s before SIGKILL
    assert container["LogConfiguration"]["LogDriver"] == "awslogs"
    assert container["ReadonlyRootFilesystem"] is True
    assert container["MountPoints"] == [{"ContainerPath": "/tmp", "ReadOnly": False, "SourceVolume": "tmp"}]


def test_router_task_role_may_only_discover_its_cell_services_read_the_admission_limit_and_its_keys():
    task_role = logical_id("Router", "AWS::IAM::Role", "TaskDefinitionTaskRole")
    policies = [
        p["Properties"]
        for p in resources("Router", "AWS::IAM::Policy").values()
        if {"Ref": task_role} in p["Properties"]["Roles"]
    ]
    (policy,) = policies
    assert policy["PolicyDocument"]["Statement"] == [
        {
            "Action": ["servicediscovery:DiscoverInstances", "servicediscovery:DiscoverInstancesRevision"],
            "Condition": {
                "StringEquals": {"servicediscovery:NamespaceName": NAMESPACE},
                "StringLike": {"servicediscovery:ServiceName": "units-*"},
            },
            "Effect": "Allow",
            "Resource": "*",
            "Sid": "DiscoverUnitMembers",
        },
        {
            # `flotilla shed`'s parameter, exactly: GetParameter only, no wildcard, no path.
            "Action": "ssm:GetParameter",
            "Effect": "Allow",
            "Resource": {
                "Fn::Join": [
                    "",
                    [
                        "arn:",
                        {"Ref": "AWS::Partition"},
                        ":ssm:",
                        {"Ref": "AWS::Region"},
                        ":",
                        {"Ref": "AWS::AccountId"},
                        ":parameter/flotilla/flotilla/admission",
                    ],
                ]
            },
            "Sid": "ReadAdmissionLimit",
        },
        {
            # The API keys' secret, exactly: `flotilla keys` creates it, so its ARN ends in the six
            # random characters Secrets Manager appends; no other secret matches.
            "Action": "secretsmanager:GetSecretValue",
            "Effect": "Allow",
            "Resource": {
                "Fn::Join": [
                    "",
                    [
                        "arn:",
                        {"Ref": "AWS::Partition"},
                        ":secretsmanager:",
                        {"Ref": "AWS::Region"},
                        ":",
                        {"Ref": "AWS::AccountId"},
                        f":secret:{API_KEYS_SECRET}-??????",
                    ],
                ]
            },
            "Sid": "ReadApiKeys",
        },
    ]
    role = resources("Router", "AWS::IAM::Role")[task_role]["Properties"]
    assert "ManagedPolicyArns" not in role


def test_router_execution_role_only_writes_its_own_log_group():
    execution_role = logical_id("Router", "AWS::IAM::Role", "TaskDefinitionExecutionRole")
    (policy,) = [
        p["Properties"]
        for p in resources("Router", "AWS::IAM::Policy").values()
        if {"Ref": execution_role} in p["Properties"]["Roles"]
    ]
    actions = {
        a
        for s in policy["PolicyDocument"]["Statement"]
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    # A public registry image needs no ECR permissions; an asset image adds the ECR pull actions.
    assert actions == {"logs:CreateLogStream", "logs:PutLogEvents"}


def test_router_autoscaling_tracks_requests_per_healthy_target_over_both_target_groups():
    target = only("Router", "AWS::ApplicationAutoScaling::ScalableTarget")["Properties"]
    assert (target["MinCapacity"], target["MaxCapacity"]) == (2, 10)
    policy = only("Router", "AWS::ApplicationAutoScaling::ScalingPolicy")["Properties"]
    assert policy["PolicyType"] == "TargetTrackingScaling"
    config = policy["TargetTrackingScalingPolicyConfiguration"]
    assert config["TargetValue"] == 600
    metrics = {m["Id"]: m for m in config["CustomizedMetricSpecification"]["Metrics"]}
    assert set(metrics) == {"rb", "rg", "hb", "hg", "perTarget"}
    assert metrics["perTarget"]["ReturnData"] is True
    assert "FILL(rb, 0) + FILL(rg, 0)" in metrics["perTarget"]["Expression"]
    tg_dims = {q: json.dumps(metrics[q]["MetricStat"]["Metric"]["Dimensions"]) for q in ("rb", "rg")}
    assert "BlueTargetGroup" in tg_dims["rb"] and "GreenTargetGroup" in tg_dims["rg"]


def test_router_refuses_an_autoscaling_floor_above_its_ceiling_naming_both_counts():
    fa = front_app()
    with pytest.raises(ValueError, match=r"desired_count=3, max_count=2: need 1 <= desired_count <= max_count"):
        RouterProps(
            vpc=fa.network.vpc,
            router_security_group=fa.network.router_security_group,
            image_uri=None,
            blue_target_group=fa.front.blue_target_group,
            green_target_group=fa.front.green_target_group,
            production_rule=fa.front.production_rule,
            deployment_alarms=fa.observability.deployment_alarms,
            cloudmap_namespace_name=NAMESPACE,
            cloudmap_service_names=fa.discovery.service_names,
            admission_parameter_name=ADMISSION_PARAMETER,
            desired_count=3,
            max_count=2,
        )


# --- Front: ALB, listeners, target groups -------------------------------------------------------


def test_alb_is_internal_in_private_subnets_by_default_and_logs_to_an_ssl_only_encrypted_bucket():
    alb = only("Front", "AWS::ElasticLoadBalancingV2::LoadBalancer")["Properties"]
    assert alb["Scheme"] == "internal"
    assert all("PrivateSubnet" in s["Fn::ImportValue"] for s in alb["Subnets"])
    assert resources("Front", "AWS::WAFv2::WebACL") == {}  # WAF guards the internet-facing door
    attributes = {a["Key"]: a["Value"] for a in alb["LoadBalancerAttributes"]}
    assert attributes["access_logs.s3.enabled"] == "true"
    assert attributes["access_logs.s3.prefix"] == "alb"
    assert attributes["routing.http.drop_invalid_header_fields.enabled"] == "true"
    t = Template.from_json(template("Front"))
    t.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "BucketEncryption": {
                "ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
            },
            "PublicAccessBlockConfiguration": {
                "BlockPublicAcls": True,
                "BlockPublicPolicy": True,
                "IgnorePublicAcls": True,
                "RestrictPublicBuckets": True,
            },
        },
    )
    t.has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Effect": "Deny",
                                "Action": "s3:*",
                                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                            }
                        ),
                    ]
                )
            }
        },
    )


def test_https_listener_uses_the_certificate_and_http_redirects_to_it():
    listeners = {
        v["Properties"]["Port"]: v["Properties"]
        for v in resources("Front", "AWS::ElasticLoadBalancingV2::Listener").values()
    }
    assert set(listeners) == {443, 80}
    https = listeners[443]
    assert https["Protocol"] == "HTTPS"
    assert https["Certificates"] == [{"CertificateArn": CERTIFICATE_ARN}]
    assert https["SslPolicy"].startswith("ELBSecurityPolicy-TLS13")
    assert listeners[80]["DefaultActions"] == [
        {"Type": "redirect", "RedirectConfig": {"Port": "443", "Protocol": "HTTPS", "StatusCode": "HTTP_301"}}
    ]


def test_without_certificate_the_alb_serves_http_only_and_synth_warns():
    fa = front_app(certificate_arn=None)
    listeners = {
        v["Properties"]["Port"]: v["Properties"]
        for v in template("Front", certificate_arn=None)["Resources"].values()
        if v["Type"] == "AWS::ElasticLoadBalancingV2::Listener"
    }
    assert set(listeners) == {80, PARKED_PORT}
    assert listeners[80]["Protocol"] == "HTTP"
    # The redirect listener waits on a port the ALB security group does not admit (it exists so
    # that adding and removing a certificate are updates: test_aws_rules.py, test_updates.py).
    assert listeners[PARKED_PORT]["DefaultActions"][0]["Type"] == "fixed-response"
    Annotations.from_stack(fa.front).has_warning(
        "/Front", Match.string_like_regexp("No certificate_arn configured: the ALB serves plain HTTP")
    )


def test_with_a_certificate_synth_does_not_warn_about_plain_http():
    Annotations.from_stack(front_app().front).has_no_warning("*", Match.string_like_regexp("No certificate_arn"))


def test_target_groups_health_check_the_router_and_deregister_quickly():
    groups = resources("Front", "AWS::ElasticLoadBalancingV2::TargetGroup")
    assert len(groups) == 2
    for group in groups.values():
        p = group["Properties"]
        assert (p["Port"], p["Protocol"], p["TargetType"]) == (contract.ROUTER_PORT, "HTTP", "ip")
        assert p["HealthCheckPath"] == contract.ROUTER_HEALTH_PATH
        assert p["HealthCheckPort"] == str(contract.ROUTER_PORT)
        assert (p["HealthCheckIntervalSeconds"], p["HealthCheckTimeoutSeconds"]) == (10, 5)
        assert (p["HealthyThresholdCount"], p["UnhealthyThresholdCount"]) == (2, 3)
        assert p["Matcher"] == {"HttpCode": "200"}
        attributes = {a["Key"]: a["Value"] for a in p["TargetGroupAttributes"]}
        assert attributes["deregistration_delay.timeout_seconds"] == "60"


def _rule_weights(stack_template: dict) -> dict[str, dict[str, int]]:
    out = {}
    for logical, res in stack_template["Resources"].items():
        if res["Type"] != "AWS::ElasticLoadBalancingV2::ListenerRule":
            continue
        (action,) = res["Properties"]["Actions"]
        out[logical] = {
            tg["TargetGroupArn"]["Ref"].split("TargetGroup")[0]: tg["Weight"]
            for tg in action["ForwardConfig"]["TargetGroups"]
        }
    return out


def test_the_production_rule_forwards_the_api_and_the_health_check_to_the_live_target_group():
    weights = _rule_weights(template("Front"))
    assert sorted(k.rstrip("0123456789ABCDEF") for k in weights) == ["ProductionRule"]
    assert all(w == {"Blue": 100, "Green": 0} for w in weights.values())
    (rule,) = resources("Front", "AWS::ElasticLoadBalancingV2::ListenerRule").values()
    assert rule["Properties"]["ListenerArn"]["Ref"].startswith("AlbProduction")
    # What reaches the routers through the front door: tests/stacks/test_front_paths.py.


def test_live_target_group_green_makes_the_template_match_traffic_after_a_swap():
    weights = _rule_weights(template("Front", live_target_group="green"))
    assert all(w == {"Blue": 0, "Green": 100} for w in weights.values())


def test_unknown_live_target_group_is_rejected_with_the_allowed_values():
    app = cdk.App(builtin_cloud_formation_validation=False)
    vpc = ec2.Vpc(cdk.Stack(app, "V"), "Vpc", max_azs=2)
    sg = ec2.SecurityGroup(cdk.Stack(app, "S"), "Sg", vpc=vpc)
    with pytest.raises(ValueError, match=r"live_target_group='purple'.*blue.*green"):
        FrontProps(vpc=vpc, alb_security_group=sg, certificate_arn=None, live_target_group="purple")


# --- security groups: exactly the request path ---------------------------------------------------


def _sg_name(value: dict) -> str:
    """The construct name of a security group referenced by GetAtt or by a cross-stack import."""
    if "Fn::GetAtt" in value:
        return value["Fn::GetAtt"][0][:-8]
    export = value["Fn::ImportValue"]  # e.g. Network:ExportsOutputFnGetAttRouterSg...GroupId...
    for name in ("RouterSg", "AlbSecurityGroup"):
        if f"GetAtt{name}" in export:
            return name
    raise AssertionError(export)


def _rules(stack: str, **variant) -> set[tuple]:
    """(direction, group, peer, from, to) for every SG rule, inline or standalone."""
    t = template(stack, **variant)["Resources"]

    def peer(rule: dict) -> str:
        for key in ("CidrIp", "SourcePrefixListId", "SourceSecurityGroupId", "DestinationSecurityGroupId"):
            if key in rule:
                value = rule[key]
                return "sg:" + _sg_name(value) if isinstance(value, dict) else value
        raise AssertionError(rule)

    def cidr(value) -> str:
        return "vpc-cidr" if isinstance(value, dict) else value

    out = set()
    for logical, res in t.items():
        p = res["Properties"]
        if res["Type"] == "AWS::EC2::SecurityGroup":
            name = logical[:-8]
            for r in p.get("SecurityGroupIngress", []):
                out.add(("in", name, cidr(r["CidrIp"]) if "CidrIp" in r else peer(r), r["FromPort"], r["ToPort"]))
            for r in p.get("SecurityGroupEgress", []):
                out.add(
                    ("out", name, cidr(r["CidrIp"]) if "CidrIp" in r else peer(r), r.get("FromPort"), r.get("ToPort"))
                )
        elif res["Type"] in ("AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress"):
            group = "sg:" + _sg_name(p["GroupId"])
            direction = "in" if res["Type"].endswith("Ingress") else "out"
            out.add((direction, group[3:], peer(p), p["FromPort"], p["ToPort"]))
    return out


def test_security_groups_allow_exactly_the_request_path_and_nothing_wider():
    assert _rules("Discovery") == {
        ("in", "AlbSecurityGroup", VPC_CIDR, 443, 443),
        ("in", "AlbSecurityGroup", VPC_CIDR, 80, 80),
        ("out", "AlbSecurityGroup", "sg:RouterSg", contract.ROUTER_PORT, contract.ROUTER_PORT),
        ("in", "RouterSg", "sg:AlbSecurityGroup", contract.ROUTER_PORT, contract.ROUTER_PORT),
    }
    router_sg = {r for r in _rules("Network") if r[1] == "RouterSg"}
    assert router_sg == {
        ("out", "RouterSg", VPC_CIDR, contract.NODE_API_PORT, contract.NODE_API_PORT),
        ("out", "RouterSg", "0.0.0.0/0", 443, 443),
    }
    for stack in ("Front", "Observability", "Router"):
        assert _rules(stack) == set(), f"{stack} must not add security-group rules"


def test_without_certificate_clients_may_reach_both_client_ports_but_only_80_listens():
    """The security group does not change with the certificate (removing one must not close 443
    before Front moves the production listener back to 80, test_aws_rules.py); nothing listens on
    443 without a certificate."""
    t = template("Discovery", certificate_arn=None)["Resources"]
    alb = next(v for k, v in t.items() if k.startswith("AlbSecurityGroup") and v["Type"] == "AWS::EC2::SecurityGroup")
    clients = sorted(r["FromPort"] for r in alb["Properties"]["SecurityGroupIngress"] if r["CidrIp"] == VPC_CIDR)
    assert clients == [80, 443]
    ports = {
        v["Properties"]["Port"]
        for v in template("Front", certificate_arn=None)["Resources"].values()
        if v["Type"] == "AWS::ElasticLoadBalancingV2::Listener"
    }
    assert 443 not in ports


def test_internet_facing_alb_admits_only_the_configured_clients():
    assert _rules("Discovery", internet_facing=True) == {
        ("in", "AlbSecurityGroup", CLIENT_CIDR, 443, 443),
        ("in", "AlbSecurityGroup", CLIENT_CIDR, 80, 80),
        ("out", "AlbSecurityGroup", "sg:RouterSg", contract.ROUTER_PORT, contract.ROUTER_PORT),
        ("in", "RouterSg", "sg:AlbSecurityGroup", contract.ROUTER_PORT, contract.ROUTER_PORT),
    }
    alb = only("Front", "AWS::ElasticLoadBalancingV2::LoadBalancer", internet_facing=True)["Properties"]
    assert alb["Scheme"] == "internet-facing"
    assert all("PublicSubnet" in s["Fn::ImportValue"] for s in alb["Subnets"])


def test_managed_prefix_lists_are_admitted_on_the_client_ports():
    app = cdk.App()
    network = cdk.Stack(app, "N")
    vpc = ec2.Vpc(network, "Vpc", nat_gateways=1, max_azs=2)
    discovery = DiscoveryStack(
        app,
        "D",
        vpc=vpc,
        router_security_group=ec2.SecurityGroup(network, "R", vpc=vpc),
        namespace_name="x.internal",
        internet_facing=True,
        client_prefix_lists=("pl-0123456789abcdef0",),
    )
    t = Template.from_stack(discovery)
    (sg,) = t.find_resources("AWS::EC2::SecurityGroup").values()
    # CDK writes prefix-list rules as their own resources, address rules inline.
    rules = sg["Properties"].get("SecurityGroupIngress", []) + [
        r["Properties"] for r in t.find_resources("AWS::EC2::SecurityGroupIngress").values()
    ]
    assert sorted((r.get("SourcePrefixListId", ""), r["FromPort"]) for r in rules) == [
        ("", contract.ROUTER_PORT),  # ALB -> router, on the router's group
        ("pl-0123456789abcdef0", 80),
        ("pl-0123456789abcdef0", 443),
    ]


def test_internet_facing_alb_sits_behind_a_waf_rate_rule_and_aws_managed_rule_groups():
    acl = only("Front", "AWS::WAFv2::WebACL", internet_facing=True)["Properties"]
    assert acl["Scope"] == "REGIONAL" and acl["DefaultAction"] == {"Allow": {}}
    rules = {r["Name"]: r for r in acl["Rules"]}
    assert rules["RequestsPerClientIp"]["Action"] == {"Block": {}}
    assert rules["RequestsPerClientIp"]["Statement"]["RateBasedStatement"] == {
        "AggregateKeyType": "IP",
        "EvaluationWindowSec": 300,
        "Limit": 3000,
    }
    managed = {
        name: r["Statement"]["ManagedRuleGroupStatement"] for name, r in rules.items() if name.startswith("AWSManaged")
    }
    assert set(managed) == {
        "AWSManagedRulesAmazonIpReputationList",
        "AWSManagedRulesKnownBadInputsRuleSet",
        "AWSManagedRulesCommonRuleSet",
    }
    assert all(m["VendorName"] == "AWS" for m in managed.values())
    # Which body rules only count, and the WAF logs: test_front_waf.py.
    assert sorted(r["Priority"] for r in rules.values()) == [0, 1, 2, 3]
    association = only("Front", "AWS::WAFv2::WebACLAssociation", internet_facing=True)["Properties"]
    alb_id = logical_id("Front", "AWS::ElasticLoadBalancingV2::LoadBalancer", "Alb")
    assert association["ResourceArn"] == {"Ref": alb_id}
    assert association["WebACLArn"]["Fn::GetAtt"][1] == "Arn"


# --- discovery --------------------------------------------------------------------------------


def test_cloud_map_http_namespace_holds_one_service_per_cell_with_ecs_reported_health():
    t = Template.from_json(template("Discovery"))
    t.has_resource_properties("AWS::ServiceDiscovery::HttpNamespace", {"Name": NAMESPACE})
    services = t.find_resources("AWS::ServiceDiscovery::Service")
    assert sorted(s["Properties"]["Name"] for s in services.values()) == ["units-cell0", "units-cell1"]
    for service in services.values():
        assert service["Properties"]["HealthCheckCustomConfig"] == {"FailureThreshold": 1}
        ref, attr = service["Properties"]["NamespaceId"]["Fn::GetAtt"]
        assert ref.startswith("Namespace") and attr == "Id"


def test_register_unit_members_associates_the_unit_service_with_the_units_registry():
    app = cdk.App(builtin_cloud_formation_validation=False)
    cell = cdk.Stack(app, "Cell", synthesizer=synthesizer())
    units = cloudmap.HttpNamespace(cell, "Ns", name="n").create_service("Units", name="units")
    cluster = ecs.Cluster(cell, "Cluster", vpc=ec2.Vpc(cell, "Vpc", max_azs=2))
    cluster.add_capacity("Hosts", instance_type=ec2.InstanceType("t3.small"), max_capacity=1)
    task = ecs.Ec2TaskDefinition(cell, "Task", network_mode=ecs.NetworkMode.HOST)
    task.add_container(
        "node",
        image=ecs.ContainerImage.from_registry("x"),
        memory_limit_mib=512,
        port_mappings=[ecs.PortMapping(container_port=contract.NODE_API_PORT)],
    )
    service = ecs.Ec2Service(cell, "Unit", cluster=cluster, task_definition=task)
    register_unit_members(service, units_service=units)
    Template.from_stack(cell).has_resource_properties(
        "AWS::ECS::Service",
        {"ServiceRegistries": [{"RegistryArn": {"Fn::GetAtt": [Match.string_like_regexp("NsUnits"), "Arn"]}}]},
    )


# --- ordering ------------------------------------------------------------------------------------


def test_alarms_exist_before_the_router_service_and_after_the_alb():
    fa = front_app()
    assert fa.observability in fa.router.dependencies
    assert fa.front in fa.observability.dependencies
    assert fa.router not in fa.front.dependencies and fa.router not in fa.observability.dependencies


def test_routine_router_deploys_cannot_touch_listener_rules_or_target_groups():
    """aws/aws-cdk#36649: CloudFormation resets a listener rule's weights when it updates the rule.
    The rules live in Front, the service in Router, so an image or task change never updates them."""
    router_types = {r["Type"] for r in template("Router")["Resources"].values()}
    assert not {t for t in router_types if t.startswith("AWS::ElasticLoadBalancingV2::")}
    front_types = {r["Type"] for r in template("Front")["Resources"].values()}
    assert not {t for t in front_types if t.startswith("AWS::ECS::")}

"""Who may reach the fleet, as the deployment's templates say it: an internal front door by default with
no 0.0.0.0/0 ingress anywhere, internet-facing only with named clients (refused at synth otherwise,
in one line), and inside the VPC unit members reachable only from the routers and their own unit."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Annotations, Match
from synth_helpers import CERTIFICATE_ARN, config_with, run_app, synthesize

import contract
from stacks.config import ConfigError
from stacks.network import VPC_CIDR


def _ingress(synth) -> list[tuple[str, str, dict]]:
    """(stack, group logical id or GroupId, rule) for every ingress rule of the deployment."""
    out = []
    for stack, template in synth.templates.items():
        for logical, res in template["Resources"].items():
            p = res["Properties"]
            if res["Type"] == "AWS::EC2::SecurityGroup":
                out += [(stack, logical, r) for r in p.get("SecurityGroupIngress", [])]
            elif res["Type"] == "AWS::EC2::SecurityGroupIngress":
                out.append((stack, json.dumps(p["GroupId"]), p))
    return out


@pytest.fixture(scope="module")
def two_units(tmp_path_factory):
    """Two units of one cell: enough to see that one unit's members cannot reach the other's."""
    return synthesize(config_with(units=2), tmp_path_factory.mktemp("cdk-two-units"))


def test_default_synth_has_an_internal_alb_and_no_ingress_from_anywhere(default_synth):
    (alb,) = default_synth.resources("Front", "AWS::ElasticLoadBalancingV2::LoadBalancer").values()
    assert alb["Properties"]["Scheme"] == "internal"
    rules = _ingress(default_synth)
    assert rules, "the deployment has ingress rules to check"
    assert [r for r in rules if r[2].get("CidrIp") in ("0.0.0.0/0",) or r[2].get("CidrIpv6") == "::/0"] == []
    # The ALB's clients are the VPC: every CIDR rule of the deployment names it.
    assert {r[2]["CidrIp"] for r in rules if "CidrIp" in r[2]} == {VPC_CIDR}
    assert default_synth.resources("Front", "AWS::WAFv2::WebACL") == {}


def test_internet_facing_without_client_cidrs_is_refused_at_synth_with_one_line(tmp_path):
    proc = run_app("front:\n  scheme: internet-facing\n", tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: front.scheme='internet-facing' is not allowed: internet-facing needs "
        "front.client_cidrs or front.client_prefix_lists (the clients the ALB admits; there is no "
        "0.0.0.0/0 default), or use internal"
    ]


@pytest.mark.parametrize(
    "front, key, fragment",
    [
        ({"scheme": "public"}, "front.scheme", "one of internal, internet-facing"),
        ({"client_cidrs": ["10.0.0.0/33"]}, "front.client_cidrs", "IPv4 CIDRs like 203.0.113.0/24"),
        ({"client_cidrs": "10.0.0.0/8"}, "front.client_cidrs", "a list of IPv4 CIDRs"),
        ({"client_prefix_lists": ["pl-xyz"]}, "front.client_prefix_lists", "managed prefix list ids"),
        ({"waf_requests_per_5_min": 5}, "front.waf_requests_per_5_min", "from 10 to 2000000000"),
        ({"api_keys_ttl_s": 0}, "front.api_keys_ttl_s", "a revoked key works at most this long"),
    ],
)
def test_bad_front_settings_are_refused_naming_the_key_and_what_is_allowed(front, key, fragment):
    with pytest.raises(ConfigError) as err:
        config_with(front=front)
    assert err.value.key == key and fragment in str(err.value) and "\n" not in str(err.value)


def test_unit_members_accept_the_api_port_only_from_routers_and_everything_else_only_from_their_unit(
    two_units,
):
    """A unit's members share one security group: which member leads is decided at run time
    (rendezvous), so the group cannot tell the leader from its followers. The router may reach every
    member's API port (it routes to leaders and asks followers for health while no leader vouches
    for them); everything else comes only from the unit's own members."""
    cell = two_units.templates["Cell-0"]["Resources"]
    groups = {k for k, v in cell.items() if v["Type"] == "AWS::EC2::SecurityGroup"}
    assert len(groups) == 2  # one per unit
    for group in groups:
        assert cell[group]["Properties"].get("SecurityGroupIngress", []) == []  # no inline (CIDR) rules
        rules = [
            v["Properties"]
            for v in cell.values()
            if v["Type"] == "AWS::EC2::SecurityGroupIngress" and v["Properties"]["GroupId"]["Fn::GetAtt"][0] == group
        ]

        def source(rule: dict) -> str:
            src = json.dumps(rule["SourceSecurityGroupId"])
            return "router" if "RouterSg" in src else ("own unit" if group in src else src)

        assert {(source(r), r["IpProtocol"], r.get("FromPort"), r.get("ToPort")) for r in rules} == {
            ("router", "tcp", contract.NODE_API_PORT, contract.NODE_API_PORT),
            ("own unit", "-1", None, None),  # EFA and collectives: every protocol, its own members only
        }


def test_the_router_reaches_units_only_on_the_api_port_and_the_alb_only_the_router_port(default_synth):
    network = default_synth.templates["Network"]["Resources"]
    (router_sg,) = [
        v for k, v in network.items() if k.startswith("RouterSg") and v["Type"] == "AWS::EC2::SecurityGroup"
    ]
    assert router_sg["Properties"].get("SecurityGroupIngress", []) == []
    discovery = default_synth.templates["Discovery"]["Resources"]
    (router_from_alb,) = [v["Properties"] for v in discovery.values() if v["Type"] == "AWS::EC2::SecurityGroupIngress"]
    assert (router_from_alb["FromPort"], router_from_alb["ToPort"]) == (contract.ROUTER_PORT, contract.ROUTER_PORT)
    assert "AlbSecurityGroup" in json.dumps(router_from_alb["SourceSecurityGroupId"])


def test_the_alb_admits_nothing_but_the_client_ports(default_synth, https_front_door_synth):
    """The ALB has no test listener: no port beside the two client ports is admitted."""
    for synth in (default_synth, https_front_door_synth):
        (alb_sg,) = [
            v
            for k, v in synth.templates["Discovery"]["Resources"].items()
            if k.startswith("AlbSecurityGroup") and v["Type"] == "AWS::EC2::SecurityGroup"
        ]
        assert {(r["FromPort"], r["ToPort"]) for r in alb_sg["Properties"]["SecurityGroupIngress"]} == {
            (443, 443),
            (80, 80),
        }


PRINCIPAL = "arn:aws:iam::210987654321:root"


@pytest.fixture(scope="module")
def privatelink(tmp_path_factory):
    from cdk_nag import AwsSolutionsChecks

    synth = synthesize(
        config_with(front={"privatelink_principals": [PRINCIPAL]}),
        tmp_path_factory.mktemp("cdk-privatelink"),
        plugins=[AwsSolutionsChecks()],
    )
    report = json.loads((synth.outdir / "validation-report.json").read_text())
    (plugin,) = [p for p in report["pluginReports"] if p["pluginName"] == "AwsSolutions"]
    return synth, plugin


def test_privatelink_offers_the_internal_alb_through_an_nlb_to_the_named_principals_with_acceptance(privatelink):
    synth, plugin = privatelink
    assert plugin["violations"] == []
    acknowledged = {
        (f["ruleName"], c["constructPath"])
        for f in plugin["suppressedViolations"]
        for c in f["violatingConstructs"]
        if "PrivateLink" in c["constructPath"] or "EndpointService" in c["constructPath"]
    }
    assert acknowledged == {("AwsSolutions-ELB2", "Front/PrivateLinkNlb/Resource")}
    from test_cfn_lint import assert_lints_clean

    assert_lints_clean("Front", synth.templates["Front"])
    front = synth.templates["Front"]["Resources"]

    def only(type_: str) -> tuple[str, dict]:
        (item,) = [(k, v["Properties"]) for k, v in front.items() if v["Type"] == type_]
        return item

    lbs = {k: v["Properties"] for k, v in front.items() if v["Type"] == "AWS::ElasticLoadBalancingV2::LoadBalancer"}
    nlb_id = next(k for k in lbs if k.startswith("PrivateLinkNlb"))
    alb_id = next(k for k in lbs if k.startswith("Alb"))
    assert lbs[nlb_id]["Type"] == "network" and lbs[nlb_id]["Scheme"] == "internal"
    attributes = {a["Key"]: a["Value"] for a in lbs[nlb_id]["LoadBalancerAttributes"]}
    assert attributes["load_balancing.cross_zone.enabled"] == "true"
    assert lbs[nlb_id]["EnforceSecurityGroupInboundRulesOnPrivateLinkTraffic"] == "off"
    # TCP 80 (no certificate) on to the ALB's production listener, an `alb` target group.
    nlb_listeners = [
        v["Properties"]
        for v in front.values()
        if v["Type"] == "AWS::ElasticLoadBalancingV2::Listener"
        and v["Properties"]["LoadBalancerArn"] == {"Ref": nlb_id}
    ]
    assert [(li["Port"], li["Protocol"]) for li in nlb_listeners] == [(80, "TCP")]
    groups = [v["Properties"] for v in front.values() if v["Type"] == "AWS::ElasticLoadBalancingV2::TargetGroup"]
    (alb_group,) = [g for g in groups if g.get("TargetType") == "alb"]
    assert alb_group["Port"] == 80 and alb_group["Protocol"] == "TCP"
    assert alb_group["Targets"] == [{"Id": {"Ref": alb_id}, "Port": 80}]
    assert alb_group["HealthCheckPath"] == contract.ROUTER_HEALTH_PATH
    _, service = only("AWS::EC2::VPCEndpointService")
    assert service["AcceptanceRequired"] is True
    assert service["NetworkLoadBalancerArns"] == [{"Ref": nlb_id}]
    _, permissions = only("AWS::EC2::VPCEndpointServicePermissions")
    assert permissions["AllowedPrincipals"] == [PRINCIPAL]
    # The NLB's group only sends to the ALB's client port inside the VPC.
    nlb_sg = [
        v["Properties"]
        for k, v in front.items()
        if v["Type"] == "AWS::EC2::SecurityGroup" and k.startswith("PrivateLinkSg")
    ]
    assert [(r["CidrIp"], r["FromPort"]) for r in nlb_sg[0]["SecurityGroupEgress"]] == [(VPC_CIDR, 80)]
    assert nlb_sg[0].get("SecurityGroupIngress", []) == []


def test_privatelink_with_an_internet_facing_alb_is_refused():
    with pytest.raises(ConfigError) as err:
        config_with(
            front={
                "scheme": "internet-facing",
                "client_cidrs": ["203.0.113.0/24"],
                "privatelink_principals": [PRINCIPAL],
            }
        )
    assert err.value.key == "front.privatelink_principals" and "only with front.scheme internal" in str(err.value)


def test_a_private_dns_name_goes_on_the_endpoint_service_so_https_consumers_match_the_certificate(tmp_path):
    """TLS ends at the ALB: a consumer calling vpce-...amazonaws.com would check the certificate
    against that name. The endpoint service's PrivateDnsName (AWS::EC2::VPCEndpointService) makes a
    consumer's endpoint answer to the certificate's name once the domain is verified."""
    synth = synthesize(
        config_with(
            certificate_arn=CERTIFICATE_ARN,
            front={"privatelink_principals": [PRINCIPAL], "privatelink_private_dns_name": "api.example.com"},
        ),
        tmp_path,
    )
    (service,) = synth.resources("Front", "AWS::EC2::VPCEndpointService").values()
    assert service["Properties"]["PrivateDnsName"] == "api.example.com"
    outputs = synth.templates["Front"]["Outputs"]
    assert "EndpointServiceId" in outputs  # what the verification commands take
    Annotations.from_stack(synth.deployment.front).has_no_warning("*", Match.string_like_regexp("certificate mismatch"))


def test_https_privatelink_without_a_private_dns_name_warns_of_the_certificate_mismatch(tmp_path):
    synth = synthesize(
        config_with(certificate_arn=CERTIFICATE_ARN, front={"privatelink_principals": [PRINCIPAL]}), tmp_path
    )
    (service,) = synth.resources("Front", "AWS::EC2::VPCEndpointService").values()
    assert "PrivateDnsName" not in service["Properties"]
    Annotations.from_stack(synth.deployment.front).has_warning(
        "/Front", Match.string_like_regexp("certificate mismatch.*front.privatelink_private_dns_name")
    )


@pytest.mark.parametrize(
    "front, fragment",
    [
        ({"privatelink_private_dns_name": "api.example.com"}, "only with front.privatelink_principals"),
        ({"privatelink_principals": [PRINCIPAL], "privatelink_private_dns_name": "API.Example"}, "a DNS name"),
    ],
)
def test_a_private_dns_name_without_privatelink_or_not_a_dns_name_is_refused(front, fragment):
    with pytest.raises(ConfigError) as err:
        config_with(front=front)
    assert err.value.key == "front.privatelink_private_dns_name" and fragment in str(err.value)

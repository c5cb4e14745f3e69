"""A unit's security group read the way EC2 applies it: EFA's OS-bypass traffic between the unit's
nodes passes only where a rule *references the group itself*, in both directions.

The EC2 user guide's EFA setup ("Prepare an EFA-enabled security group") asks for a group that
"allows all inbound and outbound traffic to and from the security group itself"; the EKS
security-group requirements list the same egress as "Outbound All All Self (for EFA traffic)". A
CIDR rule, even 0.0.0.0/0, does not carry that traffic, so a group with only 0.0.0.0/0 egress drops
every collective between two nodes of a multi-node unit (field symptom: "Error 4126: Unresponsive
receiver", gardener/gardener-extension-provider-aws#1832).

EC2's reading of a rule (AuthorizeSecurityGroupEgress, EC2 API reference): IpProtocol "-1" is every
protocol, and then every port whatever FromPort/ToPort say; a rule with a security-group destination
matches traffic to members of that group; the rules of a group are a union (any rule allows).
"""

from __future__ import annotations

import pytest

ALL_PROTOCOLS = "-1"


def _group_ref(value) -> str | None:
    """The logical id a GroupId / DestinationSecurityGroupId / SourceSecurityGroupId points at."""
    if isinstance(value, dict) and "Fn::GetAtt" in value and value["Fn::GetAtt"][1] == "GroupId":
        return value["Fn::GetAtt"][0]
    if isinstance(value, dict) and "Ref" in value:
        return value["Ref"]
    return None


def rules(resources: dict, group: str, direction: str) -> list[dict]:
    """Every rule EC2 holds for `group` in one direction: the group's inline rules plus the standalone
    AWS::EC2::SecurityGroupIngress/Egress resources attached to it (CDK writes a rule that references
    its own group as a standalone resource, since a resource cannot reference itself)."""
    inline = "SecurityGroupIngress" if direction == "in" else "SecurityGroupEgress"
    standalone = f"AWS::EC2::{inline}"
    found = list(resources[group]["Properties"].get(inline, []))
    found += [
        r["Properties"]
        for r in resources.values()
        if r["Type"] == standalone and _group_ref(r["Properties"]["GroupId"]) == group
    ]
    return found


def allows_all_traffic_with_itself(resources: dict, group: str, direction: str) -> bool:
    peer_key = "SourceSecurityGroupId" if direction == "in" else "DestinationSecurityGroupId"
    return any(
        r.get("IpProtocol") == ALL_PROTOCOLS and _group_ref(r.get(peer_key)) == group
        for r in rules(resources, group, direction)
    )


def unit_groups(synth, stack: str = "Cell-0") -> tuple[dict, list[str]]:
    resources = synth.resources(stack)
    groups = [k for k, v in resources.items() if v["Type"] == "AWS::EC2::SecurityGroup" and "Sg" in k]
    assert groups, "no unit security group in the cell"
    return resources, groups


@pytest.mark.parametrize("synth_name", ["default_synth", "trn1n_synth", "staging_synth"])
def test_each_unit_group_admits_all_traffic_to_and_from_itself_as_efa_requires(synth_name, request):
    resources, groups = unit_groups(request.getfixturevalue(synth_name))
    for group in groups:
        assert allows_all_traffic_with_itself(resources, group, "in"), f"{group}: no self inbound rule"
        assert allows_all_traffic_with_itself(resources, group, "out"), (
            f"{group}: no self outbound rule for all protocols: EFA traffic between the unit's nodes is dropped"
        )


def test_every_other_outbound_rule_is_stated_https_only(default_synth):
    """Nothing implicit: EC2 gives a new group an allow-all egress rule unless the template states
    its egress, and the unit's members need only HTTPS beyond their own group."""
    resources, groups = unit_groups(default_synth)
    for group in groups:
        others = [r for r in rules(resources, group, "out") if _group_ref(r.get("DestinationSecurityGroupId")) != group]
        assert [(r.get("CidrIp"), r["IpProtocol"], r.get("FromPort"), r.get("ToPort")) for r in others] == [
            ("0.0.0.0/0", "tcp", 443, 443)
        ]

"""Deploy synthesized flotilla templates into moto's CloudFormation, with every resource created.

moto (5.2.5) provisions most of what flotilla uses but silently skips some resource types: a
`Ref` to a skipped resource becomes nothing and an `Fn::GetAtt` on one fails the stack. Rather
than deleting resources from the templates, this harness registers small *stand-in* models for
the missing types. Where moto has a backend for the service (ECS capacity providers, cluster
associations, CloudWatch alarms) the stand-in calls it, so boto3 reads the resource back.

Use (any stack test, e.g. the Front and Observability stacks):

    from moto_cfn import MotoCloudFormation

    with MotoCloudFormation() as cfn:                # us-east-1, moto started, SSM seeded
        cfn.deploy(synth)                            # every stack of a Synthesized, in order
        cfn.assert_every_resource_created(synth)     # CREATE_COMPLETE, created == template
        ec2 = cfn.client("ec2")                      # boto3 clients bound to the mock

To support another missing type, subclass StandIn (set TYPE, ATTRIBUTES, optionally `create`)
and add it to STAND_INS, or pass `extra_stand_ins=[...]` to MotoCloudFormation.
"""

from __future__ import annotations

import json
import uuid
import warnings
from typing import Any, ClassVar
from unittest import mock

import boto3
from moto import mock_aws
from moto.cloudformation import parsing

REGION = "us-east-1"  # moto's Fn::GetAZs always yields us-east-1 zones
ACCOUNT = "123456789012"  # moto's default account
BOOTSTRAP_VERSION_PARAMETER = "/cdk-bootstrap/hnb659fds/version"
NEURON_AMI_PARAMETER = (  # stacks/unit.py pins this Neuron ECS AMI release (docs/hardware.md)
    "/aws/service/ecs/optimized-ami/amazon-linux-2023/neuron/al2023-ami-ecs-neuron-hvm-2023.0.20260403-kernel-6.1-x86_64/image_id"
)


class StandIn:
    """A minimal moto CloudFormation model for a resource type moto does not provision.

    It keeps the resolved Properties (Refs/GetAtts already replaced by moto), fails loudly if a
    required property resolved to nothing (a Ref to a skipped resource), and answers Ref and
    Fn::GetAtt like the real resource would.
    """

    TYPE: ClassVar[str] = ""
    REQUIRED: ClassVar[tuple[str, ...]] = ()
    ATTRIBUTES: ClassVar[tuple[str, ...]] = ()
    created: ClassVar[list["StandIn"]] = []  # every stand-in created, for tests to inspect

    def __init__(self, *, name: str, logical_id: str, properties: dict, account_id: str, region_name: str):
        self.name, self.logical_id = name, logical_id
        self.properties, self.account_id, self.region_name = properties, account_id, region_name
        self.id = f"{self.TYPE.split('::')[-1].lower()}-{uuid.uuid4().hex[:17]}"

    # --- moto's CloudFormationModel protocol ------------------------------------------------
    @classmethod
    def cloudformation_type(cls) -> str:
        return cls.TYPE

    @staticmethod
    def cloudformation_name_type() -> str:
        return ""

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return attr in cls.ATTRIBUTES

    @classmethod
    def create_from_cloudformation_json(
        cls, resource_name: str, cloudformation_json: dict, account_id: str, region_name: str, **kwargs: Any
    ):
        props = cloudformation_json.get("Properties", {})
        missing = [k for k in cls.REQUIRED if props.get(k) in (None, "", [])]
        if missing:
            raise ValueError(
                f"stand-in {cls.TYPE} {kwargs.get('LogicalId')}: required "
                f"properties {missing} resolved to nothing (a Ref to a skipped "
                "resource?)"
            )
        inst = cls(
            name=resource_name,
            logical_id=kwargs.get("LogicalId", resource_name),
            properties=props,
            account_id=account_id,
            region_name=region_name,
        )
        inst.create()
        StandIn.created.append(inst)
        return inst

    @classmethod
    def update_from_cloudformation_json(
        cls, original_resource, new_resource_name, cloudformation_json, account_id, region_name
    ):
        return cls.create_from_cloudformation_json(
            new_resource_name, cloudformation_json, account_id, region_name, LogicalId=original_resource.logical_id
        )

    @classmethod
    def delete_from_cloudformation_json(cls, resource_name, cloudformation_json, account_id, region_name):
        return None

    def is_created(self) -> bool:
        return True

    @property
    def physical_resource_id(self) -> str:
        return self.name

    def get_cfn_attribute(self, attr: str) -> Any:
        if attr not in self.ATTRIBUTES:
            raise ValueError(f"stand-in {self.TYPE} has no attribute {attr}; add it to ATTRIBUTES")
        return self.attribute(attr)

    # --- what subclasses override -----------------------------------------------------------
    def create(self) -> None:
        """Call a moto backend here when moto has one for this service."""

    def attribute(self, attr: str) -> Any:
        if attr == "Arn":
            service = self.TYPE.split("::")[1].lower()
            return f"arn:aws:{service}:{self.region_name}:{self.account_id}:{self.id}"
        if attr in ("Id", "GroupId"):
            return self.id
        if attr == "Name":
            return self.name
        return f"{self.id}-{attr}"


def _ecs_backend(account_id: str, region_name: str):
    from moto.ecs.models import ecs_backends

    return ecs_backends[account_id][region_name]


class PlacementGroup(StandIn):
    TYPE = "AWS::EC2::PlacementGroup"
    REQUIRED = ("Strategy",)
    ATTRIBUTES = ("GroupName", "GroupId")

    def create(self) -> None:
        if self.properties["Strategy"] not in ("cluster", "spread", "partition"):
            raise ValueError(f"placement group strategy {self.properties['Strategy']!r}")

    def attribute(self, attr: str) -> Any:
        return self.name if attr == "GroupName" else self.id


class CapacityProvider(StandIn):
    """Registers a real capacity provider in moto's ECS backend (describe_capacity_providers)."""

    TYPE = "AWS::ECS::CapacityProvider"
    REQUIRED = ("AutoScalingGroupProvider",)

    def create(self) -> None:
        from moto.autoscaling.models import autoscaling_backends

        asg_provider = dict(self.properties["AutoScalingGroupProvider"])
        asg_name = asg_provider["AutoScalingGroupArn"]
        groups = autoscaling_backends[self.account_id][self.region_name].autoscaling_groups
        if asg_name not in groups:  # CloudFormation's Ref to an ASG is its name
            raise ValueError(f"capacity provider {self.logical_id}: no ASG {asg_name!r}")
        asg_provider["AutoScalingGroupArn"] = groups[asg_name].arn
        self.name = self.properties.get("Name") or self.name
        asg_details = {
            "autoScalingGroupArn": asg_provider["AutoScalingGroupArn"],
            "managedScaling": {k[0].lower() + k[1:]: v for k, v in asg_provider.get("ManagedScaling", {}).items()},
            "managedTerminationProtection": asg_provider.get("ManagedTerminationProtection"),
        }
        _ecs_backend(self.account_id, self.region_name).create_capacity_provider(self.name, asg_details, tags=None)


class ClusterCapacityProviderAssociations(StandIn):
    """Calls moto's put_cluster_capacity_providers (describe_clusters shows the providers)."""

    TYPE = "AWS::ECS::ClusterCapacityProviderAssociations"
    REQUIRED = ("Cluster", "CapacityProviders")

    def create(self) -> None:
        backend = _ecs_backend(self.account_id, self.region_name)
        for name in self.properties["CapacityProviders"]:
            if name not in ("FARGATE", "FARGATE_SPOT") and name not in backend.capacity_providers:
                raise ValueError(f"association {self.logical_id}: unknown provider {name!r}")
        strategy = [
            {k[0].lower() + k[1:]: v for k, v in s.items()}
            for s in self.properties.get("DefaultCapacityProviderStrategy", [])
        ]
        backend.put_cluster_capacity_providers(
            self.properties["Cluster"], self.properties["CapacityProviders"], strategy
        )


class CloudWatchAlarm(StandIn):
    """Creates the alarm, metric-math queries included, in moto's CloudWatch backend
    (describe_alarms sees it)."""

    TYPE = "AWS::CloudWatch::Alarm"
    REQUIRED = ("ComparisonOperator", "EvaluationPeriods", "Threshold")
    ATTRIBUTES = ("Arn",)

    def create(self) -> None:
        from moto.cloudwatch.models import Dimension, Metric, MetricDataQuery, MetricStat, cloudwatch_backends

        p = self.properties

        def query(q: dict) -> MetricDataQuery:
            stat = q.get("MetricStat")
            return MetricDataQuery(
                query_id=q["Id"],
                label=q.get("Label"),
                period=None,
                return_data=q.get("ReturnData", True),
                expression=q.get("Expression"),
                metric_stat=MetricStat(
                    metric=Metric(
                        stat["Metric"]["MetricName"],
                        stat["Metric"]["Namespace"],
                        [Dimension(d["Name"], d["Value"]) for d in stat["Metric"].get("Dimensions", [])],
                    ),
                    period=stat["Period"],
                    stat=stat["Stat"],
                    unit=None,
                )
                if stat
                else None,
            )

        self.name = p.get("AlarmName") or self.name
        alarm = cloudwatch_backends[self.account_id][self.region_name].put_metric_alarm(
            name=self.name,
            namespace=p.get("Namespace"),
            metric_name=p.get("MetricName"),
            metric_data_queries=[query(q) for q in p.get("Metrics", [])] or None,
            comparison_operator=p["ComparisonOperator"],
            evaluation_periods=int(p["EvaluationPeriods"]),
            datapoints_to_alarm=p.get("DatapointsToAlarm"),
            period=p.get("Period"),
            threshold=p["Threshold"],
            statistic=p.get("Statistic"),
            extended_statistic=p.get("ExtendedStatistic"),
            description=p.get("AlarmDescription"),
            # moto's backend takes CloudFormation-shaped {"Name", "Value"} dimensions.
            dimensions=p.get("Dimensions", []),
            alarm_actions=p.get("AlarmActions", []),
            ok_actions=p.get("OKActions", []),
            insufficient_data_actions=p.get("InsufficientDataActions", []),
            unit=p.get("Unit"),
            actions_enabled=p.get("ActionsEnabled", True),
            treat_missing_data=p.get("TreatMissingData"),
            evaluate_low_sample_count_percentile=None,
            threshold_metric_id=None,
            rule=None,
            tags=[],
        )
        self._arn = alarm.alarm_arn

    def attribute(self, attr: str) -> Any:
        return self._arn


def _servicediscovery(account_id: str, region_name: str):
    from moto.servicediscovery.models import servicediscovery_backends

    return servicediscovery_backends[account_id][region_name]


class HttpNamespace(StandIn):
    """Creates the namespace in moto's Cloud Map backend (list_namespaces sees it)."""

    TYPE = "AWS::ServiceDiscovery::HttpNamespace"
    REQUIRED = ("Name",)
    ATTRIBUTES = ("Id", "Arn")

    def create(self) -> None:
        backend = _servicediscovery(self.account_id, self.region_name)
        backend.create_http_namespace(
            name=self.properties["Name"],
            creator_request_id=self.name,
            description=self.properties.get("Description", ""),
            tags=[],
        )
        (self.namespace,) = [n for n in backend.list_namespaces() if n.name == self.properties["Name"]]

    @property
    def physical_resource_id(self) -> str:
        return self.namespace.id

    def attribute(self, attr: str) -> Any:
        return self.namespace.id if attr == "Id" else self.namespace.arn


class CloudMapService(StandIn):
    """Creates the service in moto's Cloud Map backend, in the namespace it names."""

    TYPE = "AWS::ServiceDiscovery::Service"
    REQUIRED = ("Name", "NamespaceId")
    ATTRIBUTES = ("Id", "Arn", "Name")

    def create(self) -> None:
        p = self.properties
        backend = _servicediscovery(self.account_id, self.region_name)
        backend.get_namespace(p["NamespaceId"])  # raises if the namespace does not exist
        custom = p.get("HealthCheckCustomConfig")
        self.service = backend.create_service(
            name=p["Name"],
            namespace_id=p["NamespaceId"],
            creator_request_id=self.name,
            description=p.get("Description", ""),
            dns_config=p.get("DnsConfig"),
            health_check_config=p.get("HealthCheckConfig"),
            health_check_custom_config=dict(custom) if custom else None,
            tags=[],
            service_type="HTTP" if "DnsConfig" not in p else "DNS_HTTP",
        )

    @property
    def physical_resource_id(self) -> str:
        return self.service.id

    def attribute(self, attr: str) -> Any:
        return {"Id": self.service.id, "Arn": self.service.arn, "Name": self.service.name}[attr]


class SecurityGroupEgress(StandIn):
    """Authorizes the rule in moto's EC2 backend (describe_security_groups shows it)."""

    TYPE = "AWS::EC2::SecurityGroupEgress"
    REQUIRED = ("GroupId", "IpProtocol")

    def create(self) -> None:
        p = self.properties
        # IpProtocol -1 (every protocol) carries no ports: CloudFormation leaves them out.
        permission = {"IpProtocol": p["IpProtocol"], **{k: p[k] for k in ("FromPort", "ToPort") if k in p}}
        if "DestinationSecurityGroupId" in p:
            permission["UserIdGroupPairs"] = [{"GroupId": p["DestinationSecurityGroupId"]}]
        else:
            permission["IpRanges"] = [{"CidrIp": p["CidrIp"]}]
        boto3.client(
            "ec2", region_name=self.region_name, aws_access_key_id="testing", aws_secret_access_key="testing"
        ).authorize_security_group_egress(GroupId=p["GroupId"], IpPermissions=[permission])


def _generic(type_: str, attributes: tuple[str, ...] = (), required: tuple[str, ...] = ()):
    return type(type_.replace("::", ""), (StandIn,), {"TYPE": type_, "ATTRIBUTES": attributes, "REQUIRED": required})


STAND_INS: list[type[StandIn]] = [
    PlacementGroup,
    CapacityProvider,
    ClusterCapacityProviderAssociations,
    CloudWatchAlarm,
    _generic("AWS::ServiceDiscovery::PrivateDnsNamespace", ("Id", "Arn", "HostedZoneId"), ("Name",)),
    HttpNamespace,
    CloudMapService,
    SecurityGroupEgress,
    _generic("AWS::S3::BucketPolicy", (), ("Bucket", "PolicyDocument")),
    _generic("AWS::SNS::TopicPolicy", (), ("Topics", "PolicyDocument")),
    _generic("AWS::SNS::Subscription", (), ("TopicArn", "Protocol", "Endpoint")),
    _generic(
        "AWS::ApplicationAutoScaling::ScalableTarget",
        ("Id",),
        ("MaxCapacity", "MinCapacity", "ResourceId", "ScalableDimension"),
    ),
    _generic("AWS::ApplicationAutoScaling::ScalingPolicy", ("Arn",), ("PolicyName",)),
    _generic("AWS::CodeDeploy::Application", ("Name",)),
    _generic("AWS::CodeDeploy::DeploymentGroup", ("Name",), ("ApplicationName",)),
    _generic("AWS::CloudWatch::Dashboard", ("Name",)),
    _generic("AWS::WAFv2::WebACL", ("Arn", "Id", "LabelNamespace"), ("Scope", "DefaultAction", "VisibilityConfig")),
    _generic("AWS::WAFv2::WebACLAssociation", (), ("ResourceArn", "WebACLArn")),
    _generic("AWS::WAFv2::LoggingConfiguration", (), ("ResourceArn", "LogDestinationConfigs")),
]


def _model_fixes() -> list:
    """Patches for moto 5.2.5 CloudFormation models that the front-door stacks hit.

    ELBv2: moto answers neither Fn::GetAtt LoadBalancerFullName nor any target-group attribute;
    the router's autoscaling metric dimensions need both (derived from the ARN, as AWS does)."""
    from moto.elbv2.models import FakeLoadBalancer, FakeTargetGroup

    lb_get = FakeLoadBalancer.get_cfn_attribute

    def lb_attribute(self, name):
        if name == "LoadBalancerFullName":
            return self.arn.split(":loadbalancer/", 1)[1]
        return lb_get(self, name)

    def tg_attribute(self, name):
        return {
            "TargetGroupFullName": "targetgroup/" + self.arn.split(":targetgroup/", 1)[1],
            "TargetGroupName": self.name,
            "TargetGroupArn": self.arn,
        }[name]

    tg_attrs = ("TargetGroupFullName", "TargetGroupName", "TargetGroupArn")

    # moto's KMS key model hands CloudFormation's {"Key", "Value"} tags to a tagger that expects
    # {"TagKey", "TagValue"}: the key silently fails to create and every GetAtt on it fails.
    from moto.kms.models import Key

    key_create = Key.create_from_cloudformation_json.__func__

    def key_from_cloudformation(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):
        props = dict(cloudformation_json.get("Properties", {}))
        props["Tags"] = [{"TagKey": t["Key"], "TagValue": t["Value"]} for t in props.get("Tags", [])]
        return key_create(
            cls, resource_name, {**cloudformation_json, "Properties": props}, account_id, region_name, **kwargs
        )

    return [
        mock.patch.object(Key, "create_from_cloudformation_json", classmethod(key_from_cloudformation)),
        mock.patch.object(FakeLoadBalancer, "get_cfn_attribute", lb_attribute),
        mock.patch.object(FakeTargetGroup, "get_cfn_attribute", tg_attribute, create=True),
        mock.patch.object(
            FakeTargetGroup, "has_cfn_attr", classmethod(lambda cls, attr: attr in tg_attrs), create=True
        ),
    ]


class MotoCloudFormation:
    """moto started for REGION, stand-ins registered, the SSM parameters CDK templates read."""

    def __init__(self, *, extra_stand_ins: list[type[StandIn]] = ()):
        self._stand_ins = {m.TYPE: m for m in [*STAND_INS, *extra_stand_ins]}
        self._mock = mock_aws()
        self._patch = None
        self.ami_id: str | None = None
        self.certificate_arn: str | None = None  # the one deploy() issued in moto's ACM
        self.stack_ids: dict[str, str] = {}  # stack name -> stack id

    def __enter__(self) -> "MotoCloudFormation":
        self._mock.start()
        original = parsing.get_model_map
        # Only types moto lacks: never shadow a real moto model.
        missing = {t: m for t, m in self._stand_ins.items() if t not in original()}
        self._patch = mock.patch.object(parsing, "get_model_map", lambda: {**original(), **missing})
        self._patch.start()
        self._elbv2_patches = _model_fixes()
        for patch in self._elbv2_patches:
            patch.start()
        StandIn.created.clear()
        ssm = self.client("ssm")
        # CDK's default synthesizer adds a rule that checks the bootstrap stack's version.
        ssm.put_parameter(Name=BOOTSTRAP_VERSION_PARAMETER, Value="30", Type="String")
        # moto ships AWS's public /aws/service/... parameters: the Neuron ECS AMI parameter the
        # launch templates name must be one of them (a wrong path fails the stack here).
        self.ami_id = ssm.get_parameter(Name=NEURON_AMI_PARAMETER)["Parameter"]["Value"]
        return self

    def __exit__(self, *exc) -> None:
        for patch in self._elbv2_patches:
            patch.stop()
        self._patch.stop()
        self._mock.stop()

    def client(self, service: str):
        return boto3.client(service, region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")

    def deploy(self, synth) -> None:
        """Create every stack of a synth_helpers.Synthesized in dependency order.

        A configured certificate_arn is first issued in moto's ACM and that ARN put in its place:
        moto's ELB, like AWS, refuses an HTTPS listener whose certificate ACM does not hold
        (moto 5.2.5: moto/elbv2/models.py:1431 create_listener -> moto/elb/models.py:728
        register_certificate raises CertificateNotFoundException), and moto
        chooses the ARN of a certificate it issues."""
        configured = synth.deployment.config.certificate_arn
        if configured:
            self.certificate_arn = self.client("acm").request_certificate(DomainName="llm.example.com")[
                "CertificateArn"
            ]
        for stack in synth.stacks:
            template = synth.template(stack.node.id)
            if configured:
                template = json.loads(json.dumps(template).replace(configured, self.certificate_arn))
            self.create_stack(stack.stack_name, template)

    def create_stack(self, stack_name: str, template: dict) -> None:
        cfn = self.client("cloudformation")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            stack_id = cfn.create_stack(
                StackName=stack_name,
                TemplateBody=json.dumps(template),
                Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM"],
            )["StackId"]
        skipped = [str(w.message) for w in caught if "not supported by moto" in str(w.message)]
        if skipped:
            raise AssertionError(f"{stack_name}: moto skipped resources (add a stand-in): {skipped}")
        status = cfn.describe_stacks(StackName=stack_id)["Stacks"][0]["StackStatus"]
        if status != "CREATE_COMPLETE":
            raise AssertionError(f"{stack_name}: {status}")
        self.stack_ids[stack_name] = stack_id

    def created_resources(self, stack_name: str) -> dict[str, dict]:
        """logical id -> {PhysicalResourceId, ResourceType} of the resources moto created."""
        cfn = self.client("cloudformation")
        summaries = cfn.list_stack_resources(StackName=stack_name)["StackResourceSummaries"]
        # moto lists a skipped resource as an entry without a logical id: keep only created ones.
        # (Some moto models, e.g. AWS::EC2::SecurityGroupIngress, are created but carry no
        # physical id; read those back through their service instead.)
        return {s["LogicalResourceId"]: s for s in summaries if s.get("LogicalResourceId")}

    def assert_every_resource_created(self, synth) -> None:
        """Every stack CREATE_COMPLETE and its created resources == its template's resources."""
        cfn = self.client("cloudformation")
        for stack in synth.stacks:
            status = cfn.describe_stacks(StackName=stack.stack_name)["Stacks"][0]["StackStatus"]
            assert status == "CREATE_COMPLETE", (stack.stack_name, status)
            template = synth.template(stack.node.id)["Resources"]
            created = self.created_resources(stack.stack_name)
            assert set(created) == set(template), (stack.stack_name, sorted(set(template) - set(created)))
            for logical_id, summary in created.items():
                assert summary["ResourceType"] == template[logical_id]["Type"], logical_id

    def physical_id(self, stack_name: str, logical_id: str) -> str:
        return self.created_resources(stack_name)[logical_id]["PhysicalResourceId"]

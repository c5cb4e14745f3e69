"""Cloud Map as its documentation says it behaves, laid over moto's: quotas, DiscoverInstances' cap and
order, and revisions that move on every registration. Used by the tests and the fleet benchmark, which
also serves it over HTTP on 127.0.0.1 to a real router process (serve_http).

moto 5.2.5 (moto/servicediscovery) registers without limits, returns every instance in registration
order with no default cap, appends a second copy when an instance id is registered again, and sums
per-instance counters into InstancesRevision (a register plus a deregister can leave it unchanged).
The real service, per its documentation:
- "Instances per service ... 1,000 ... No" (not adjustable) and "Instances per namespace ... 2,000 ...
  Yes" (adjustable): https://docs.aws.amazon.com/cloud-map/latest/dg/cloud-map-limits.html; past a
  quota RegisterInstance fails with ResourceLimitExceeded ("The resource can't be created because
  you've reached the quota on the number of resources", API reference, RegisterInstance errors).
- DiscoverInstances "returns a randomized list of instances"; "If you don't specify a value for
  MaxResults, Cloud Map returns up to 100 instances"; MaxResults is 1..1000; the response has no
  pagination token (API reference, DiscoverInstances).
- "If a new instance is registered or deregistered, the InstancesRevision updates. The health status
  updates don't update InstancesRevision." (API reference, DiscoverInstancesRevision).
- RegisterInstance with an existing InstanceId updates that instance ("You can use this value to
  update an existing instance", RegisterInstanceRequest.InstanceId).
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from unittest import mock

from botocore.awsrequest import AWSPreparedRequest, HTTPHeaders
from moto.core.exceptions import JsonRESTError
from moto.core.models import botocore_stubber
from moto.servicediscovery.models import ServiceDiscoveryBackend, ServiceInstance
from moto.servicediscovery.responses import ServiceDiscoveryResponse

INSTANCES_PER_SERVICE = 1000  # not adjustable
INSTANCES_PER_NAMESPACE = 2000  # default; adjustable in Service Quotas
DISCOVER_DEFAULT_MAX_RESULTS = 100
DISCOVER_MAX_RESULTS = 1000


class ResourceLimitExceeded(JsonRESTError):
    def __init__(self, message: str) -> None:
        super().__init__("ResourceLimitExceeded", message)


class InvalidInput(JsonRESTError):
    def __init__(self, message: str) -> None:
        super().__init__("InvalidInput", message)


def _revision(service: Any) -> int:
    return int(getattr(service, "documented_revision", 0))


def _bump(service: Any) -> None:
    service.documented_revision = _revision(service) + 1


@contextlib.contextmanager
def documented_cloud_map(
    *, instances_per_namespace: int = INSTANCES_PER_NAMESPACE, seed: int | None = None
) -> Iterator[None]:
    """Patch moto's Cloud Map (in this process, so also a ThreadedMotoServer started here) to behave as
    documented while the context lasts. instances_per_namespace: the account's quota (default 2,000)."""
    rng = random.Random(seed)
    original_register = ServiceDiscoveryBackend.register_instance
    original_deregister = ServiceDiscoveryBackend.deregister_instance

    def register_instance(
        self: ServiceDiscoveryBackend,
        service_id: str,
        instance_id: str,
        creator_request_id: str,
        attributes: dict[str, str],
    ) -> str:
        service = self.get_service(service_id)
        for existing in service.instances:
            if existing.instance_id == instance_id:  # an update, not a new instance
                existing.attributes = attributes
                return self._create_operation("REGISTER_INSTANCE", targets={"INSTANCE": instance_id})
        if len(service.instances) >= INSTANCES_PER_SERVICE:
            raise ResourceLimitExceeded(
                f"service {service.name} already holds {INSTANCES_PER_SERVICE} instances (quota: instances per service)"
            )
        in_namespace = sum(len(s.instances) for s in self.services.values() if s.namespace_id == service.namespace_id)
        if in_namespace >= instances_per_namespace:
            raise ResourceLimitExceeded(
                f"namespace {service.namespace_id} already holds {instances_per_namespace} instances "
                "(quota: instances per namespace)"
            )
        op = original_register(self, service_id, instance_id, creator_request_id, attributes)
        _bump(service)
        return op

    def deregister_instance(self: ServiceDiscoveryBackend, service_id: str, instance_id: str) -> str:
        op = original_deregister(self, service_id, instance_id)
        _bump(self.get_service(service_id))
        return op

    def _service(backend: ServiceDiscoveryBackend, namespace_name: str, service_name: str) -> Any:
        backend.discover_instances(namespace_name, service_name)  # raises NamespaceNotFound / ServiceNotFound
        ns_ids = {ns.id for ns in backend.list_namespaces() if ns.name == namespace_name}
        return next(s for s in backend.list_services() if s.name == service_name and s.namespace_id in ns_ids)

    def discover_instances(self: ServiceDiscoveryResponse) -> str:
        params = json.loads(self.body)
        max_results = params.get("MaxResults", DISCOVER_DEFAULT_MAX_RESULTS)
        if not 1 <= int(max_results) <= DISCOVER_MAX_RESULTS:
            raise InvalidInput(f"MaxResults {max_results}: 1 to {DISCOVER_MAX_RESULTS}")
        backend = self.servicediscovery_backend
        instances, _ = backend.discover_instances(
            namespace_name=params["NamespaceName"],
            service_name=params["ServiceName"],
            query_parameters=params.get("QueryParameters"),
            optional_parameters=params.get("OptionalParameters"),
            health_status=params.get("HealthStatus"),
        )
        service = _service(backend, params["NamespaceName"], params["ServiceName"])
        chosen: list[ServiceInstance] = rng.sample(instances, min(len(instances), int(max_results)))
        return json.dumps(
            {
                "Instances": [
                    {
                        "InstanceId": i.instance_id,
                        "NamespaceName": params["NamespaceName"],
                        "ServiceName": params["ServiceName"],
                        "Attributes": i.attributes,
                        "HealthStatus": i.health_status,
                    }
                    for i in chosen
                ],
                "InstancesRevision": _revision(service),
            }
        )

    def discover_instances_revision(self: ServiceDiscoveryResponse) -> str:
        params = json.loads(self.body)
        service = _service(self.servicediscovery_backend, params["NamespaceName"], params["ServiceName"])
        return json.dumps({"InstancesRevision": _revision(service)})

    with (
        mock.patch.object(ServiceDiscoveryBackend, "register_instance", register_instance),
        mock.patch.object(ServiceDiscoveryBackend, "deregister_instance", deregister_instance),
        mock.patch.object(ServiceDiscoveryResponse, "discover_instances", discover_instances),
        mock.patch.object(ServiceDiscoveryResponse, "discover_instances_revision", discover_instances_revision),
    ):
        yield


def ecs_attributes(
    *, ip: str, port: int | None, ecs_service: str, cluster: str, task_family: str, instance_id: str, az: str
) -> dict[str, str]:
    """The attributes ECS writes when it registers a task of a host-networking service, and no others
    (ECS developer guide, service discovery: AWS_INSTANCE_IPV4, AWS_INSTANCE_PORT, AVAILABILITY_ZONE,
    REGION, ECS_SERVICE_NAME, ECS_CLUSTER_NAME, EC2_INSTANCE_ID, ECS_TASK_DEFINITION_FAMILY). No
    role: ECS cannot know which member leads."""
    attrs = {
        "AWS_INSTANCE_IPV4": ip,
        "AVAILABILITY_ZONE": az,
        "REGION": az[:-1],
        "ECS_SERVICE_NAME": ecs_service,
        "ECS_CLUSTER_NAME": cluster,
        "EC2_INSTANCE_ID": instance_id,
        "ECS_TASK_DEFINITION_FAMILY": task_family,
    }
    if port is not None:
        attrs["AWS_INSTANCE_PORT"] = str(port)
    return attrs


# The router's client sends here when started with AWS_ENDPOINT_URL_SERVICEDISCOVERY=http://127.0.0.1:PORT
# and AWS_DISABLE_HOST_PREFIX_INJECTION=true (DiscoverInstances otherwise goes to "data-<host>", the
# API's endpoint host prefix: botocore/data/servicediscovery/2017-03-14/service-2.json).
AWS_URL = "https://servicediscovery.us-east-1.amazonaws.com/"


def serve_http(port: int = 0) -> tuple[ThreadingHTTPServer, int]:
    """Serve moto's Cloud Map (as patched by documented_cloud_map, within mock_aws) on 127.0.0.1 in a
    thread: each POST is handed to moto as the same request to the real endpoint would be."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            headers = HTTPHeaders()
            for k, v in self.headers.items():
                headers[k] = v
            request = AWSPreparedRequest(method="POST", url=AWS_URL, headers=headers, body=body, stream_output=False)
            answer = botocore_stubber.process_request(request)
            status, out_headers, out = answer or (500, {}, b'{"message": "not a Cloud Map request"}')
            data = out if isinstance(out, bytes) else str(out).encode()
            self.send_response(status)
            for k, v in out_headers.items():
                if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(k, str(v))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    return server, server.server_address[1]

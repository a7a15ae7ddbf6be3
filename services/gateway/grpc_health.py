"""The standard gRPC health service, grpc.health.v1.Health, beside the protocol's on the gateway's gRPC port.

Why: Kubernetes' `grpc:` probes (deploy/k8s/gateway.yaml's readiness), grpc_health_probe and gRPC load
balancers ask this service, not the protocol's ServerReady. Check answers SERVING while the gateway is
ready (the upstream answered and a model is ready: ServerReady's and /v2/health/ready's rule, as Triton's
Check answers) and NOT_SERVING otherwise, for the whole server ("") and for inference.GRPCInferenceService;
any other name is NOT_FOUND, as the health protocol says. Watch is not served: it answers UNIMPLEMENTED,
which the protocol's clients fall back from, since each watcher would hold one of the --max-connections
RPCs for as long as it likes.

Why by hand: the two messages of health.proto (beside this file) are built here from their descriptor, in a
pool of their own as grpc_predict_v2_pb2's are, rather than taken from grpcio-health-checking: nothing more
to install in the image, and no clash with that package's health_pb2 where a user's process imports it.
"""

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SERVICE = "grpc.health.v1.Health"
INFERENCE_SERVICE = "inference.GRPCInferenceService"
SERVING, NOT_SERVING = 1, 2   # HealthCheckResponse.ServingStatus


def _messages():
    """(HealthCheckRequest, HealthCheckResponse): health.proto's messages, from their descriptor."""
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="grpc/health/v1/health.proto", package="grpc.health.v1",
                                               syntax="proto3")
    proto.message_type.add(name="HealthCheckRequest").field.add(name="service", number=1, type=field.TYPE_STRING,
                                                                label=field.LABEL_OPTIONAL)
    response = proto.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        status.value.add(name=name, number=number)
    response.field.add(name="status", number=1, type=field.TYPE_ENUM, label=field.LABEL_OPTIONAL,
                       type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"grpc.health.v1.{name}"))
                 for name in ("HealthCheckRequest", "HealthCheckResponse"))


HealthCheckRequest, HealthCheckResponse = _messages()


def add_health_service(server, ready):
    """Serve grpc.health.v1.Health's Check on `server` (a grpc.aio server): SERVING while `ready()` is true."""

    async def check(request, context):
        if request.service not in ("", INFERENCE_SERVICE):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r:.80}: ask for the "
                                                           f"server's health (\"\") or {INFERENCE_SERVICE!r}'s")
        return HealthCheckResponse(status=SERVING if ready() else NOT_SERVING)

    check_handler = grpc.unary_unary_rpc_method_handler(check, request_deserializer=HealthCheckRequest.FromString,
                                                        response_serializer=HealthCheckResponse.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Check": check_handler}),))

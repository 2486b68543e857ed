"""What guards the ingest's gRPC endpoint: bind-address checks, the bearer-token interceptor
(required off loopback) and the standard grpc.health.v1 service (open to probes)."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

import grpc

from horizonrl.protos import health_pb2, health_pb2_grpc

_HEALTH_PREFIX = "/grpc.health.v1.Health/"
_Serving = health_pb2.HealthCheckResponse.ServingStatus


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and localhost: addresses no other machine can reach."""
    import ipaddress

    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class TokenCheck(grpc.ServerInterceptor):
    """Refuses calls without `authorization: Bearer <token>` (UNAUTHENTICATED); health is open."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if handler is None or details.method.startswith(_HEALTH_PREFIX):
            return handler
        sent = dict(details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(str(sent).encode(), self._expected):
            return handler
        return _refusal(handler)


def _refusal(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same streaming kind as `handler` that answers UNAUTHENTICATED."""

    def refuse(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong ingest token")

    kinds = {(False, False): grpc.unary_unary_rpc_method_handler,
             (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler,
             (True, True): grpc.stream_stream_rpc_method_handler}
    return kinds[(handler.request_streaming, handler.response_streaming)](refuse)


class Health(health_pb2_grpc.HealthServicer):
    """grpc.health.v1 Check for "" and the trajectory service; Watch stays UNIMPLEMENTED."""

    def __init__(self, service: str, serving: Callable[[], bool]) -> None:
        self._service, self._serving = service, serving

    def Check(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.service not in ("", self._service):
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        status = _Serving.SERVING if self._serving() else _Serving.NOT_SERVING
        return health_pb2.HealthCheckResponse(status=status)

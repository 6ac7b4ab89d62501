"""KServe v2 / Triton gRPC transport (inference.GRPCInferenceService)."""

from transports.grpc.transport import GrpcOptions, GrpcTransport

__all__ = ["GrpcOptions", "GrpcTransport"]

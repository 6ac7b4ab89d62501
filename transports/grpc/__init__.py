"""KServe v2 / Triton gRPC transport (inference.GRPCInferenceService)."""

from kernel.transports.grpc.transport import GrpcOptions, GrpcTransport

__all__ = ["GrpcOptions", "GrpcTransport"]

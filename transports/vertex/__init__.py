"""The Vertex AI prediction endpoint (AIP_HEALTH_ROUTE, AIP_PREDICT_ROUTE, X-Vertex-Ai-Triton-Redirect)."""

from kernel.transports.vertex.transport import VertexAiTransport

__all__ = ["VertexAiTransport"]

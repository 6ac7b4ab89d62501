"""The SageMaker hosting endpoint (/ping, /invocations, multi-model /models) and its `serve` entry point."""

from kernel.transports.sagemaker.transport import SageMakerTransport

__all__ = ["SageMakerTransport"]

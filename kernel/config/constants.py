"""Names and values shared by the config stages, and the error they raise."""

from __future__ import annotations



from kernel.core.errors import ErrorCode, KernelError
from kernel.protos.model_config_pb2 import (
    ModelInstanceGroup,
    ModelSequenceBatching,
)



PYTHON_BACKEND = "python"
PYTHON_FILENAME = "model.py"
ENSEMBLE_PLATFORM = "ensemble"
WILDCARD_DIM = -1
SEQUENCE_IDLE_DEFAULT_US = 1_000_000

KIND = ModelInstanceGroup.Kind
CONTROL = ModelSequenceBatching.Control


def invalid(msg: str) -> KernelError:
    """A config error with Triton's code for it (INVALID_ARG)."""
    return KernelError(ErrorCode.INVALID_ARG, msg)

# Backends whose platform must agree with the backend (Triton's "known" backends).
PLATFORMS_FOR_BACKEND = {
    "tensorflow": {"tensorflow_savedmodel", "tensorflow_graphdef"},
    "tensorrt": {"tensorrt_plan"},
    "onnxruntime": {"onnxruntime_onnx"},
    "pytorch": {"pytorch_libtorch", "torch_aoti"},
}

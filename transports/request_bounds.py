"""What one inference request may name, on every front: bounds far above any real model.

Why: a request naming millions of tensors, dimensions or parameters made the front build a Python
object for each on its event loop or under its interpreter lock (issue 31: 600 000 HTTP inputs
froze it 1.0 s, 2 million gRPC outputs 3.5 s, a 12-million-entry shape 143 ms and 96 MB). Each
bound is checked before that work, from a count the front already has, and refused with a 400
(gRPC INVALID_ARGUMENT) that names it; tritonserver has none of these bounds.
"""

from __future__ import annotations

from kernel.core.errors import ErrorCode, KernelError

# Inputs, and outputs, a request may name.
MAX_TENSORS = 4096
# Dimensions of a tensor's shape: numpy's own limit, so no Python-backend model can take more.
MAX_DIMS = 64
# Parameters of a gRPC request, its own and its tensors' together (each a protobuf message read on
# the event loop); an HTTP request's are bounded with the rest of its JSON (large_json).
MAX_PARAMETERS = 16384


def _bad(message: str) -> KernelError:
    return KernelError(ErrorCode.INVALID_ARG, f"Unable to parse inference request: {message}")


def check_tensors(inputs: int, outputs: int) -> None:
    for count, field in ((inputs, "inputs"), (outputs, "outputs")):
        if count > MAX_TENSORS:
            raise _bad(f"{count} {field}, more than the {MAX_TENSORS} a request may have")


def too_many_dims(name: str, dims: int) -> KernelError:
    return _bad(f"the shape of input '{name}' has {dims} dimensions, more than the {MAX_DIMS} a tensor may have")


def check_parameters(count: int) -> None:
    if count > MAX_PARAMETERS:
        raise _bad(f"{count} parameters, more than the {MAX_PARAMETERS} a request may have (its tensors' included)")

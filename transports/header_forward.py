"""--http-header-forward-pattern: request headers whose names match become request parameters.

As in tritonserver, a header is forwarded when the regular expression matches
anywhere in its name; its value becomes a string parameter the model reads
(pb_utils `request.parameters()`, PyTriton `Request.parameters`). Names Triton
reserves for itself are refused with INVALID_ARG rather than forwarded.
"""

from __future__ import annotations

import re
from typing import Iterable

from kernel.errors import ErrorCode, KernelError
from kernel.request import InferRequest

RESERVED_PARAMETERS = frozenset({
    "sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers", "binary_data_output",
})


class HeaderForwarder:
    def __init__(self, pattern: str):
        try:
            self.regex = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"invalid header forward pattern '{pattern}': {exc}") from None

    def apply(self, request: InferRequest, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """Copy the matching headers (ASGI (name, value) byte pairs) into request.parameters."""
        search = self.regex.search
        for raw_name, raw_value in headers:
            name = raw_name.decode("latin-1")
            if not search(name):
                continue
            if name in RESERVED_PARAMETERS or name.startswith("triton_"):
                raise KernelError(
                    ErrorCode.INVALID_ARG,
                    f"Header '{name}' is reserved for Triton usage and cannot be forwarded.",
                )
            request.parameters[name] = raw_value.decode("latin-1")

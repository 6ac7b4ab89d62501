"""--http/--grpc-header-forward-pattern: headers whose names match become request parameters.

As in tritonserver, a header (HTTP) or metadata entry (gRPC) is forwarded when
the regular expression matches anywhere in its name, ignoring case unless the
pattern starts with `(?-i)`; its value becomes a string parameter the model
reads (pb_utils `request.parameters()`, PyTriton `Request.parameters`) and
replaces an explicit parameter of the same name. Names Triton reserves for
itself are refused with INVALID_ARG rather than forwarded.
"""

from __future__ import annotations

import re
from typing import Iterable

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest

RESERVED_PARAMETERS = frozenset({
    "sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers", "binary_data_output",
})


# tritonserver puts RE2's `(?i)` in front of the pattern (header names are
# case-insensitive), so a pattern can only turn that off with a leading `(?-i)`;
# Python's re has no unscoped `(?-i)`, hence the prefix is read here.
CASE_SENSITIVE_PREFIX = "(?-i)"


class HeaderForwarder:
    def __init__(self, pattern: str):
        flags = re.IGNORECASE
        body = pattern
        if body.startswith(CASE_SENSITIVE_PREFIX):
            flags = 0
            body = body[len(CASE_SENSITIVE_PREFIX):]
        try:
            self.regex = re.compile(body, flags)
        except re.error as exc:
            raise ValueError(f"invalid header forward pattern '{pattern}': {exc}") from None

    def apply(self, request: InferRequest, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """Copy the matching headers (ASGI (name, value) byte pairs) into request.parameters."""
        search = self.regex.search
        for raw_name, raw_value in headers:
            name = raw_name.decode("latin-1")
            if not search(name):
                continue
            _check_not_reserved(name)
            request.parameters[name] = raw_value.decode("latin-1")

    def apply_metadata(self, request: InferRequest, metadata: Iterable[tuple[str, str | bytes]]) -> None:
        """Copy the matching gRPC metadata entries into request.parameters.

        `metadata`: (key, value) pairs as the client sent them, without the
        HTTP/2 and gRPC protocol headers; `-bin` entries carry decoded bytes.
        """
        search = self.regex.search
        # In key order, as gRPC C++ servers (tritonserver) hold metadata in a sorted multimap.
        for name, value in sorted(metadata, key=_key):
            if not search(name):
                continue
            _check_not_reserved(name)
            request.parameters[name] = value if isinstance(value, str) else value.decode("utf-8", "replace")


def _key(entry: tuple) -> str:
    return entry[0]


def _check_not_reserved(name: str) -> None:
    if name in RESERVED_PARAMETERS or name.startswith("triton_"):
        raise KernelError(
            ErrorCode.INVALID_ARG,
            f"Header '{name}' is reserved for Triton usage and cannot be forwarded.",
        )

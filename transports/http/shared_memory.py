"""HTTP routes of the shared-memory extensions, over the core's region registry.

    GET  /v2/{system,cuda}sharedmemory[/region/<name>]/status
    POST /v2/{system,cuda}sharedmemory/region/<name>/register
    POST /v2/{system,cuda}sharedmemory[/region/<name>]/unregister
"""

from __future__ import annotations

import base64
import re
from typing import Any, Optional

import msgspec

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.cuda_shared_memory import IPC_HANDLE_SIZE
from kernel.core.shared_memory import RegionChange, SharedMemoryManager
from kernel.transports.asgi import send_error, send_json, send_status

SYSTEM_PREFIX = "/v2/systemsharedmemory"
CUDA_PREFIX = "/v2/cudasharedmemory"

_ACTIONS = ("status", "register", "unregister")
_decode_body = msgspec.json.Decoder()


def is_shared_memory_path(path: str) -> bool:
    return path.startswith(SYSTEM_PREFIX) or path.startswith(CUDA_PREFIX)


def _split(path: str) -> Optional[tuple[bool, str, str]]:
    """(is CUDA, region name or '', action) for a shared-memory path, or None if it is not one."""
    cuda = path.startswith(CUDA_PREFIX)
    rest = path[len(CUDA_PREFIX if cuda else SYSTEM_PREFIX):]
    parts = rest.split("/")
    # rest is "/<action>" or "/region/<name>/<action>"
    if len(parts) == 2 and parts[0] == "":
        name, action = "", parts[1]
    elif len(parts) == 4 and parts[0] == "" and parts[1] == "region" and parts[2]:
        name, action = parts[2], parts[3]
    else:
        return None
    if action not in _ACTIONS:
        return None
    return cuda, name, action


async def handle(app, path: str, method: str, receive, send) -> None:
    """Serve one shared-memory request; KernelError propagates to the app's error mapping."""
    route = _split(path)
    if route is None:
        await send_error(send, 404, "Not Found")
        return
    cuda, name, action = route
    if method != ("GET" if action == "status" else "POST"):
        await send_error(send, 405, "Method Not Allowed")
        return
    shm: SharedMemoryManager = app.server.shared_memory
    if action == "status":
        await send_json(send, 200, shm.cuda_status(name) if cuda else shm.system_status(name))
        return
    server = app.server
    if action == "unregister":
        await server.change_shared_memory(RegionChange("unregister_cuda" if cuda else "unregister_system", name))
        await send_status(send, 200)
        return
    kind = "cuda" if cuda else "system"
    if not name:
        raise KernelError(ErrorCode.INVALID_ARG, f"'region name' is necessary to register {kind} shared memory region")
    body = await app.read_control_body(receive)
    if body is None:
        return  # client went away
    if cuda:
        raw_handle, device_id, byte_size = _cuda_register_request(body)
        change = RegionChange("register_cuda", name, raw_handle=raw_handle, device_id=device_id, byte_size=byte_size)
    else:
        key, offset, byte_size = _register_request(body)
        change = RegionChange("register_system", name, key, offset, byte_size)
    await server.change_shared_memory(change)
    await send_status(send, 200)


def _register_request(body: bytes) -> tuple[str, int, int]:
    """(key, offset, byte_size) from a `$system_shared_memory_register_request` body."""
    if not body:
        raise _bad("failed to parse the request JSON buffer: The document is empty.")
    try:
        doc: Any = _decode_body.decode(body)
    except msgspec.DecodeError as exc:
        raise _bad(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(doc, dict):
        raise _bad("failed to parse the request JSON buffer: expected a JSON object")
    if "key" not in doc:
        raise _bad("Shared memory register request has no 'key' field")
    key = doc["key"]
    if not isinstance(key, str):
        raise _bad("Unable to parse 'key': attempt to access JSON non-string as string")
    offset = doc.get("offset", 0)
    if not _is_uint(offset):
        raise _bad("Unable to parse 'offset': attempt to access JSON non-unsigned-integer as unsigned-integer")
    if "byte_size" not in doc:
        raise _bad("Shared memory register request has no 'byte_size' field")
    byte_size = doc["byte_size"]
    if not _is_uint(byte_size):
        raise _bad("Unable to parse 'byte_size': attempt to access JSON non-unsigned-integer as unsigned-integer")
    return key, offset, byte_size


def _cuda_register_request(body: bytes) -> tuple[bytes, int, int]:
    """(raw_handle, device_id, byte_size) from a `$cuda_shared_memory_register_request` body.

    tritonclient sends {"raw_handle": {"b64": <base64 cudaIpcMemHandle_t>}, "device_id": N,
    "byte_size": N}. The checks and messages follow tritonserver 2.51's, in its order; where it
    answers 500 for a malformed body, Kernel answers 400, as for the system register. The handle is
    decoded as tritonserver decodes it (`decode_ipc_handle`), line breaks and all.
    """
    if not body:
        raise _bad("failed to parse the request JSON buffer: The document is empty.")
    try:
        doc: Any = _decode_body.decode(body)
    except msgspec.DecodeError as exc:
        raise _bad(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(doc, dict) or "raw_handle" not in doc:
        raise _bad("Shared memory register request has no 'raw_handle' field")
    handle = doc["raw_handle"]
    if not isinstance(handle, dict) or "b64" not in handle:
        raise _bad("attempt to access non-existing object member 'b64'")
    b64 = handle["b64"]
    if not isinstance(b64, str):
        raise _bad("attempt to access JSON non-string as string")
    for field in ("byte_size", "device_id"):  # tritonserver reads byte_size first
        if field not in doc:
            raise _bad(f"attempt to access non-existing object member '{field}'")
        if not _is_uint(doc[field]):
            raise _bad("attempt to access JSON non-unsigned-integer as unsigned-integer")
    raw = decode_ipc_handle(b64)
    if raw is None:
        raise _bad("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    return raw, doc["device_id"], doc["byte_size"]


# The 64 alphabet characters of standard base64; anything else in a handle's text is skipped.
_NOT_BASE64 = re.compile(r"[^A-Za-z0-9+/]")
# Alphabet characters that decode to exactly IPC_HANDLE_SIZE bytes: each carries 6 bits, and a
# last partial byte is dropped (64 bytes: 86 characters, 512 of their 516 bits).
_HANDLE_CHARS = -(-IPC_HANDLE_SIZE * 8 // 6)


def decode_ipc_handle(text: str) -> Optional[bytes]:
    """The 64-byte cudaIpcMemHandle_t in `text`, decoded as tritonserver 2.51 decodes it; None if not one.

    Why not base64.b64decode(validate=True): C++ clients (perf_analyzer, the C++ tritonclient)
    encode with libb64, which ends a line every 72 characters and the text with one more line
    break, and tritonserver decodes with libb64, which skips every character outside the base64
    alphabet (line breaks, padding, anything else) and counts the bytes the rest make. So a handle
    is valid when its alphabet characters make exactly 64 bytes, whatever else lies between them.
    """
    chars = _NOT_BASE64.sub("", text)
    if len(chars) != _HANDLE_CHARS:
        return None
    return base64.b64decode(chars + "=" * (-len(chars) % 4))


def _is_uint(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _bad(message: str) -> KernelError:
    return KernelError(ErrorCode.INVALID_ARG, message)

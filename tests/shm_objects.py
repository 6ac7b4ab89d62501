"""A client's system shared-memory object for tests that drive the core's SharedMemoryManager
directly (no server): a fresh /dev/shm object with known bytes, registered as region 'r', and a
request with one input in it, built as the transports' codecs build it."""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager

import numpy as np

from kernel.core.request import InferRequest, InferTensor
from kernel.core.shared_memory import RequestWindows, SharedMemoryManager


@contextmanager
def registered_object(size: int):
    """(manager, fd, content): region 'r' over a fresh object of `size` bytes holding 0, 1, 2, ...
    (mod 251); the object is removed afterwards."""
    key = f"/kernel-test-shm-{uuid.uuid4().hex[:10]}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    content = (np.arange(size) % 251).astype(np.uint8)
    os.pwrite(fd, content.tobytes(), 0)
    manager = SharedMemoryManager()
    try:
        manager.register_system("r", key, 0, size)
        yield manager, fd, content
    finally:
        manager.close()
        os.close(fd)
        os.unlink(f"/dev/shm{key}")


def input_request(manager: SharedMemoryManager, rid: str, offset: int, size: int) -> InferRequest:
    """A request for model 'm' with one UINT8 input of `size` bytes at `offset` of region 'r'."""
    windows = RequestWindows()
    raw = windows.hold(manager.input("r", offset, size))
    request = InferRequest("m", id=rid, inputs=[InferTensor("IN", "UINT8", [size], raw=raw)])
    request.shm = windows
    return request

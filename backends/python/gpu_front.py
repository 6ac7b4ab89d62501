"""The front's side of GPU tensors that cross a worker boundary as CUDA IPC handles (gpu_worker.py).

One `DeviceTensors` per worker generation (a restarted worker gets a fresh one). It keeps two
tables, the front's half of the release protocol:

- exports: GPU outputs (and BLS inputs) this worker made. Each becomes a core
  kernel.core.device_memory.DeviceBuffer, handed on by reference: to a client's CUDA region (copied
  device to device there), a BLS caller, the next ensemble step, or, should a transport want its
  bytes after all, a host copy. A weak reference sees the last holder go, and the worker is told
  to free that memory (DeviceRelease with its token), one message per loop iteration, as for
  arena views (arena_views.py).
- loans: GPU tensors the front handed to this worker (its inputs, its BLS outputs), each under a
  key of the front's. The front holds the buffer, and so keeps its producer's memory, until the
  worker says the model's last array over it is gone (DeviceRelease with those keys).

When the worker dies, both tables go: its exports are marked `gone` (a consumer that has not yet
opened one gets a clear error naming the instance, not a read of freed memory; nothing is sent to
the worker that replaces it, whose tokens mean other memory), and the loans are dropped, which
releases them to their own producers. A consumer that already opened an export keeps its mapping
until it lets go; what the driver does with memory whose exporter exited is the driver's business.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import weakref
from typing import Iterable, Optional

from kernel.backends.python import messages
from kernel.core import datatypes
from kernel.core.cuda_shared_memory import IPC_HANDLE_SIZE
from kernel.core.device_memory import DeviceBuffer
from kernel.core.request import InferTensor


class DeviceTensors:
    def __init__(self, instance):
        self.name = instance.name
        self._instance = instance  # its channel: this generation's worker until close()
        self._exports: dict[int, weakref.ref] = {}  # the worker's token -> weak reference to its DeviceBuffer
        self._loans: dict[int, DeviceBuffer] = {}  # the front's key -> the buffer lent to the worker
        self._keys = itertools.count(1)
        self._releases: list[int] = []
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop_thread = 0
        self._flush_handle = None
        self.closed = False

    @property
    def live(self) -> tuple[int, int]:
        """(exports still held, loans still out): tests, diagnostics."""
        return len(self._exports), len(self._loans)

    # ---- exports: the worker's GPU tensors --------------------------------------------------------

    def unpack(self, t: messages.Tensor) -> InferTensor:
        """The core tensor for a GPU tensor the worker sent (an output, or a BLS call's input).
        ValueError for a location that does not describe the tensor (as for arena locations)."""
        size = datatypes.ELEMENT_SIZE.get(t.datatype)
        if (size is None or len(t.ipc) != IPC_HANDLE_SIZE or t.device < 0 or t.offset < 0
                or t.nbytes != datatypes.element_count(t.shape) * size):
            raise ValueError(f"GPU tensor '{t.name}' ({t.datatype}, shape {t.shape}) has a location that does not fit it")
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
        buf = DeviceBuffer(t.ipc, t.device, t.offset, t.nbytes, f"model instance '{self.name}'")
        token = t.token
        self._exports[token] = weakref.ref(buf, lambda ref, token=token: self._gone(token))
        return InferTensor(t.name, t.datatype, t.shape, device=buf)

    def release_now(self, tokens: Iterable[int]) -> None:
        """Exports nobody will hold (a response for a request no longer pending): free them at once."""
        tokens = list(tokens)
        if tokens and not self.closed:
            self._send(messages.DeviceRelease(tokens))

    def _gone(self, token: int) -> None:
        if self.closed or self._exports.pop(token, None) is None:
            return
        if threading.get_ident() == self._loop_thread:
            self._release(token)
        else:  # dropped by another thread: the loop owns the channel
            try:
                self._loop.call_soon_threadsafe(self._release, token)
            except RuntimeError:  # the loop is closed: the server is gone, and the worker with it
                pass

    def _release(self, token: int) -> None:
        self._releases.append(token)
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _send(self, msg: messages.DeviceRelease) -> None:
        channel = self._instance.channel
        if channel is not None and not channel.closed:
            channel.send(msg)

    def _flush(self) -> None:
        self._flush_handle = None
        tokens, self._releases = self._releases, []
        if tokens and not self.closed:
            try:
                self._send(messages.DeviceRelease(tokens))
            except ConnectionError:
                pass

    # ---- loans: GPU tensors handed to the worker ----------------------------------------------------

    def lend(self, t: InferTensor) -> messages.Tensor:
        """`t` (a GPU tensor) as the worker receives it; KernelError when its producer is gone."""
        buf: DeviceBuffer = t.device
        buf.check()
        if not buf.nbytes:
            return messages.Tensor(t.name, t.datatype, list(t.shape), b"")
        key = next(self._keys)
        self._loans[key] = buf
        return messages.Tensor(t.name, t.datatype, list(t.shape), None, -1, buf.offset, buf.nbytes, -1,
                               buf.handle, buf.device, key)

    def returned(self, keys: Iterable[int]) -> None:
        """The worker is done with these loans (or never got them): let go of the buffers."""
        for key in keys:
            self._loans.pop(key, None)

    # ---- the worker is gone ----------------------------------------------------------------------

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        for ref in self._exports.values():
            buf = ref()
            if buf is not None:
                buf.gone = reason
        self._exports.clear()
        self._loans.clear()  # their producers are told once nothing else holds them
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None

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
- kept handles: a loan whose allocation is known to stay (its buffer's `lifetime`: a client's CUDA
  shared-memory region while it is registered here, an export out of a worker's permanent block
  while that worker runs) is marked `keep`, and the worker keeps its mapping of the handle open
  for the next request (an IPC open costs hundreds of microseconds; a small copy a few). When that
  lifetime ends, the worker is told (DeviceUnmap). This worker's own exports out of its permanent
  block (the worker marks them `keep`) carry this generation's `lifetime`, ended at close().

When the worker dies, both tables go: its exports are marked `gone` (a consumer that has not yet
opened one gets a clear error naming the instance, not a read of freed memory; nothing is sent to
the worker that replaces it, whose tokens mean other memory), and the loans are dropped, which
releases them to their own producers. A consumer that already opened an export keeps its mapping
until it lets go; what the driver does with memory whose exporter exited is the driver's business.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
import weakref
from typing import Iterable, Optional

from kernel.backends.python import messages
from kernel.core import datatypes
from kernel.core.cuda_shared_memory import IPC_HANDLE_SIZE
from kernel.core.device_memory import DeviceBuffer, Lifetime
from kernel.core.request import InferTensor


_serials = itertools.count(1)


class DeviceTensors:
    def __init__(self, instance):
        self.name = instance.name
        self._instance = instance  # its channel: this generation's worker until close()
        self._exports: dict[int, weakref.ref] = {}  # the worker's token -> weak reference to its DeviceBuffer
        self._loans: dict[int, DeviceBuffer] = {}  # the front's key -> the buffer lent to the worker
        self._keys = itertools.count(1)
        self._releases: list[int] = []
        self.lifetime = Lifetime()  # this generation's permanent exports (ended at close)
        self._serial = next(_serials)  # (names its callbacks in a Lifetime: ids are reused)
        self._unmaps: list[tuple[bytes, int]] = []
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
        self._bind_loop()
        buf = DeviceBuffer(t.ipc, t.device, t.offset, t.nbytes, f"model instance '{self.name}'",
                           lifetime=self.lifetime if t.keep else None)
        token = t.token
        self._exports[token] = weakref.ref(buf, lambda ref, token=token: self._gone(token))
        return InferTensor(t.name, t.datatype, t.shape, device=buf)

    def release_now(self, tokens: Iterable[int]) -> None:
        """Exports nobody will hold (a response for a request no longer pending): free them at once."""
        tokens = list(tokens)
        if tokens and not self.closed:
            self._send(messages.DeviceRelease(tokens))

    def _bind_loop(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()

    def _gone(self, token: int) -> None:
        if self.closed or self._exports.pop(token, None) is None:
            return
        self._on_loop(self._release, token)

    def _on_loop(self, fn, *args) -> None:
        if threading.get_ident() == self._loop_thread:
            fn(*args)
        else:  # dropped by another thread: the loop owns the channel
            try:
                self._loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop is closed: the server is gone, and the worker with it
                pass

    def _release(self, token: int) -> None:
        self._releases.append(token)
        self._schedule()

    def _unmap(self, handle: bytes, device: int) -> None:
        if not self.closed:
            self._unmaps.append((handle, device))
            self._schedule()

    def _schedule(self) -> None:
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _send(self, msg: messages.DeviceRelease) -> None:
        channel = self._instance.channel
        if channel is not None and not channel.closed:
            channel.send(msg)

    def _flush(self) -> None:
        self._flush_handle = None
        tokens, self._releases = self._releases, []
        unmaps, self._unmaps = self._unmaps, []
        if self.closed:
            return
        try:
            if tokens:
                self._send(messages.DeviceRelease(tokens))
            if unmaps:
                self._send(messages.DeviceUnmap([h for h, _ in unmaps], [d for _, d in unmaps]))
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
        lifetime = buf.lifetime
        keep = lifetime is not None and not lifetime.ended
        if keep:  # the worker keeps its mapping: it is told to close it when the allocation may go
            self._bind_loop()
            lifetime.when_ended(("loans", self._serial, buf.handle, buf.device),
                                functools.partial(_unmap_later, weakref.ref(self), buf.handle, buf.device))
        return messages.Tensor(t.name, t.datatype, list(t.shape), None, -1, buf.offset, buf.nbytes, -1,
                               buf.handle, buf.device, key, keep)

    def returned(self, keys: Iterable[int]) -> None:
        """The worker is done with these loans (or never got them): let go of the buffers."""
        for key in keys:
            self._loans.pop(key, None)

    # ---- the worker is gone ----------------------------------------------------------------------

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.lifetime.end()  # (mappings of this worker's exports kept elsewhere: closed once unused)
        for ref in self._exports.values():
            buf = ref()
            if buf is not None:
                buf.gone = reason
        self._exports.clear()
        self._unmaps = []  # (the worker that kept those mappings is gone)
        self._loans.clear()  # their producers are told once nothing else holds them
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None


def _unmap_later(ref: "weakref.ref[DeviceTensors]", handle: bytes, device: int) -> None:
    """An allocation this front lent out of may go now (called from any thread): tell the worker, from the loop."""
    tensors = ref()
    if tensors is not None and not tensors.closed:
        tensors._on_loop(tensors._unmap, handle, device)

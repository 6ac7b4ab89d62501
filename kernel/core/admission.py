"""Requests held before they are admitted while their client-sized work runs beside the loop:
inputs read out of client shared-memory regions, BYTES elements checked, large requests'
response-cache keys hashed, and bytes a transport left to be made (LateBytes: gRPC's large typed
contents, transports/grpc/typed_contents.py). Their requests still reach the model in the order they came.

An input in a system shared-memory region is copied out of the client's object (kernel.core.
shared_memory says why a copy and not a mapping). A model whose instances take it unread
(BackendInstance.takes_input_windows: the Python backend reads it straight into its arena, one
copy in all) gets it so, unless it is BYTES (validation reads its elements) or the request is
traced or cached (both read the bytes). Otherwise it is read here when the request is submitted:
a request whose inputs there add up to READ_BESIDE_BYTES or less on the loop (~0.6 ms per MiB on
a 2-core VM, page faults of the new buffer included), a larger one on a thread, where pread lets
go of the GIL. On the loop, one 1 GiB input held every client of the front for ~0.6 s.

Validating a BYTES input walks its elements' length prefixes in Python, one step per element: a
request whose BYTES inputs may hold more than BYTES_ELEMENTS_ON_LOOP elements is validated on a
thread (the walk holds the GIL, but hands it to the loop every switch interval), after its reads.
On the loop, 64 MiB of empty elements (16 Mi of them, within the default --http-max-input-size)
held every client of the front for 6.5 s.

A request of a model with a response cache whose inputs add up to more than KEY_BESIDE_BYTES has
its key (kernel.core.cache_key: SHA-256 digests of its large inputs) computed on a thread too,
last: on the loop, a 256 MiB request's key held every client of the front for 0.2-0.6 s (a copy
and a hash of its bytes).

While a request waits here, the requests for the same model version submitted after it wait
behind it, whatever they carry: a model sees its requests in the order they were submitted
(a sequence's steps, a stream's messages). The work runs side by side; only the handing over is in
order. A request that waits here is in flight (Server.in_flight, so a graceful stop drains it);
one whose read fails (the client shrank its object), that does not validate, or that the model
refuses once ready is answered with the error through its on_response, as a model's failure would be."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Callable, Optional

from kernel.core import datatypes
from kernel.core.beside import run_beside
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest, InferResponse, LateBytes
from kernel.core.shared_memory import InputWindow

log = logging.getLogger("kernel.core.admission")

# A request whose unread shared-memory inputs add up to more than this is read on a thread.
READ_BESIDE_BYTES = 2 << 20
# A request whose BYTES inputs could hold more elements than this is validated on a thread (their
# elements are walked in Python, ~150 ns each here: ~2.5 ms on the loop at most).
BYTES_ELEMENTS_ON_LOOP = 16384
# A caching model's request whose inputs add up to more than this has its cache key hashed on a
# thread (SHA-256 runs at ~1.7 GB/s here: 1.2 ms of loop for 2 MiB).
KEY_BESIDE_BYTES = 2 << 20


def _takes_windows(model) -> bool:
    """Whether the model's instances read unread inputs themselves (BackendInstance.takes_input_windows),
    and nothing before them needs the bytes (a response cache hashes them)."""
    instances = model.instances
    return bool(instances) and model.response_cache is None and all(i.takes_input_windows for i in instances)


def _prepare(tensors: list, validate: bool, cache, model, request: InferRequest) -> None:
    """On a thread: the tensors' windows read (and late bytes made) into their bytes; then, if `validate`, the request
    validated (Model.validate_tagged: KernelError when it does not fit); then, when `cache` is
    given, its cache key (set on the request). The request is held here meanwhile: nothing on the
    loop reads its tensors or its key before it is handed over."""
    for t in tensors:
        t._raw = t._raw.read()
    if validate:
        model.validate_tagged(request)
    if cache is not None:
        request.cache_key = cache.key(model, request)


def _nbytes(raw) -> int:
    """A tensor's size before admission: a window's or late bytes' (not yet read), or the bytes'."""
    return len(raw) if isinstance(raw, (InputWindow, LateBytes)) else memoryview(raw).nbytes


def _validate_beside(model, request: InferRequest) -> bool:
    """Whether checking the request's BYTES elements could take more than BYTES_ELEMENTS_ON_LOOP
    steps (each element is a step, bounded by the bytes there are: 4 per element at least, 2 in
    late bytes, whose size is what the client sent: a protobuf element's tag and length)."""
    if not model.bytes_inputs:
        return False
    steps = 0
    for t in request.inputs:
        raw = t._raw
        if t.datatype == "BYTES" and raw is not None:
            least = 2 if isinstance(raw, LateBytes) else 4
            steps += min(datatypes.element_count(t.shape), _nbytes(raw) // least + 1)
    return steps > BYTES_ELEMENTS_ON_LOOP


def _key_beside(model, request: InferRequest) -> bool:
    """Whether the request's cache key is to be hashed on a thread: its model caches and its inputs
    (those still in windows included) add up to more than KEY_BESIDE_BYTES, none of them on a GPU."""
    if model.response_cache is None:
        return False
    total = 0
    for t in request.inputs:
        if t.device is not None:
            return False  # (its bytes come to the host on the loop, as the key is made there)
        total += _nbytes(t.raw)
    return total > KEY_BESIDE_BYTES


class _Waiting:
    __slots__ = ("model", "request", "tensors", "reading", "validated")

    def __init__(self, model, request: InferRequest):
        self.model = model
        self.request = request
        self.validated = False  # validated on the thread (before its key was made)
        self.tensors: list = []  # the InferTensors whose bytes are being read
        self.reading: Optional[asyncio.Future] = None  # their reads and the key's hashing; None: nothing beside


class Admission:
    """The requests a Server holds while their work runs beside the loop."""

    def __init__(self, admit: Callable[[object, InferRequest, bool], None]):
        # admit(model, request, validated): what Server.submit does with a request whose inputs are
        # all here (validated: it was validated beside the loop); raises KernelError when refused.
        self._admit = admit
        self._waiting: dict[object, deque[_Waiting]] = {}  # model version -> its requests, in order
        self.count = 0  # requests held here

    def take(self, model, request: InferRequest) -> bool:
        """Read the request's unread inputs; False when that is done (on the loop, or there was
        nothing to read) and nothing of this model waits: the caller admits it now. True: it waits
        here and is admitted (or answered with its error) when its turn comes. KernelError when a
        read on the loop fails: the request is refused as it is submitted."""
        queue = self._waiting.get(model)
        tensors = None
        if request.shm is not None:
            tensors = [t for t in request.inputs if type(t._raw) is InputWindow]
            if tensors and request.trace is None and _takes_windows(model):  # the backend reads them itself
                tensors = [t for t in tensors if t.datatype == "BYTES"]  # (validation reads their elements)
            if tensors and sum(t._raw.nbytes for t in tensors) <= READ_BESIDE_BYTES:
                for t in tensors:
                    t._raw = t._raw.read()
                tensors = None
        validate = _validate_beside(model, request)
        if request.late_inputs:  # (always beside the loop: their transport left them for it)
            tensors = (tensors or []) + [t for t in request.inputs if isinstance(t._raw, LateBytes)]
        hash_key = _key_beside(model, request)
        if not tensors and not validate and not hash_key and queue is None:
            return False
        waiting = _Waiting(model, request)
        if tensors or validate or hash_key:
            waiting.tensors = tensors or []
            waiting.validated = validate
            future = run_beside(_prepare, waiting.tensors, validate, model.response_cache if hash_key else None,
                                model, request)
            waiting.reading = future
            future.add_done_callback(lambda _: self._hand_over(model))
        if queue is None:
            queue = self._waiting[model] = deque()
        queue.append(waiting)
        self.count += 1
        return True

    def _hand_over(self, model) -> None:
        """Admit this model's waiting requests from the front, up to the first still being read."""
        queue = self._waiting.get(model)
        while queue:
            waiting = queue[0]
            if waiting.reading is not None and not waiting.reading.done():
                return
            queue.popleft()
            self.count -= 1
            self._admit_read(waiting)
        if queue is not None and not queue:
            del self._waiting[model]

    def _admit_read(self, waiting: _Waiting) -> None:
        request = waiting.request
        try:
            if waiting.reading is not None:
                waiting.reading.result()  # (raises what the read raised)
            self._admit(waiting.model, request, waiting.validated)
        except KernelError as exc:
            self._refuse(waiting, exc)
        except Exception as exc:  # noqa: BLE001 - an OSError reading, a fault of ours admitting
            log.exception("unexpected error submitting a request for model '%s'", request.model_name)
            self._refuse(waiting, KernelError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"))

    @staticmethod
    def _refuse(waiting: _Waiting, error: KernelError) -> None:
        request = waiting.request
        if request.on_response is not None:
            model = waiting.model
            request.on_response(InferResponse(model.name, str(model.version), request.id, error=error))

"""One model instance running one bound callable inside the server process.

A synchronous callable gets a thread of its own, fed through a queue, so it
never runs on the front event loop; an async callable (coroutine function or
async generator function) runs as tasks on the backend's shared async loop.
Results come back to the front loop through the backend's inbox, which batches
the wake-ups.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional

from kernel.core.backend import BackendInstance
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest, InferResponse
from kernel.backends.callable.execution import Delivery, Execution
from kernel.backends.callable.inbox import LoopInbox
from kernel.backends.callable.outputs import ResultConverter

if TYPE_CHECKING:
    from kernel.backends.callable.runner import AsyncRunner

log = logging.getLogger("kernel.callable")


def is_async_callable(fn: Callable) -> bool:
    """Coroutine or async generator functions, also behind wrappers and as callable objects."""
    for candidate in (fn, getattr(fn, "__call__", None)):
        if candidate is not None and (
            inspect.iscoroutinefunction(candidate) or inspect.isasyncgenfunction(candidate)
        ):
            return True
    return False


class CallableInstance(BackendInstance):
    def __init__(
        self,
        name: str,
        fn: Callable,
        converter: ResultConverter,
        output_names: list[str],
        max_batch_size: int,
        decoupled: bool,
        inbox: LoopInbox,
        runner: "AsyncRunner",
        on_unrecoverable: Optional[Callable[[BaseException], None]] = None,
    ):
        self.name = name
        self.fn = fn
        self.converter = converter
        self.output_names = output_names
        self.max_batch_size = max_batch_size
        self.decoupled = decoupled
        self.is_async = is_async_callable(fn)
        self.healthy = False
        self._inbox = inbox
        self._runner = runner
        self._on_unrecoverable = on_unrecoverable
        self._pending: set[InferRequest] = set()
        self._executing = 0
        self._queue: "queue.SimpleQueue[Optional[list[InferRequest]]]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None

    # ---- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        if self.is_async:
            self._runner.ensure_started()
        else:
            self._thread = threading.Thread(target=self._thread_main, name=f"kernel-{self.name}", daemon=True)
            self._thread.start()
        self.healthy = True
        self.notify_available()

    async def stop(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._pending and loop.time() < deadline:
            await asyncio.sleep(0.01)
        self.healthy = False
        if self._thread is not None:
            self._queue.put(None)
            await asyncio.to_thread(self._thread.join, max(0.1, deadline - loop.time()))
            if self._thread.is_alive():
                log.warning("the inference callable of '%s' is still running after the exit timeout", self.name)
            self._thread = None
        pending, self._pending = self._pending, set()
        error = KernelError(ErrorCode.UNAVAILABLE, f"model instance '{self.name}' was stopped")
        for request in pending:
            _respond(request, InferResponse(self.converter.model_name, self.converter.version, request.id,
                                            error=error))

    # ---- request path (front loop) ---------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def executing(self) -> int:
        # A decoupled model's batches stream for as long as they like: like Triton's Python
        # backend in decoupled mode, the instance takes the next batch meanwhile.
        return 0 if self.decoupled else self._executing

    def submit(self, requests: list[InferRequest]) -> None:
        if not self.healthy:
            error = KernelError(ErrorCode.UNAVAILABLE, f"model instance '{self.name}' is not available")
            for r in requests:
                _respond(r, InferResponse(self.converter.model_name, self.converter.version, r.id, error=error))
            return
        self._pending.update(requests)
        self._executing += 1
        if self.is_async:
            self._runner.spawn(self._run_async, requests)
        else:
            self._queue.put(requests)

    def post(self, delivery: Delivery) -> None:
        """From the callable's thread or loop: hand responses to the front loop."""
        self._inbox.post(self._deliver, delivery)

    def _deliver(self, delivery: Delivery) -> None:
        pending = self._pending
        for request, response in delivery.responses:
            if request not in pending:
                continue  # already answered (the instance was stopped)
            if response.final:
                pending.discard(request)
            _respond(request, response)
        record = delivery.record
        if record is not None:
            self._executing -= 1
            stats = self.stats
            if stats is not None:
                stats.record_execution(record)
            self.notify_available()

    def report_failure(self, exc: BaseException, message: str) -> None:
        """From the callable's thread or loop: log the failure; stop the server if it cannot go on."""
        log.warning("%s", message)
        if self._on_unrecoverable is not None and _is_unrecoverable(exc):
            self._inbox.post(self._on_unrecoverable, exc)

    # ---- running the callable ----------------------------------------------------------------

    def _thread_main(self) -> None:
        get = self._queue.get
        while True:
            requests = get()
            if requests is None:
                return
            self._run_sync(requests)

    def _run_sync(self, requests: list[InferRequest]) -> None:
        execution = Execution(self, requests)
        try:
            batch = execution.prepare()
            if not batch:
                execution.finish()
                return
            result = self.fn(batch)
            if inspect.isgenerator(result):
                for item in result:
                    execution.on_result(item)
                    if execution.all_cancelled():
                        result.close()
                        break
            elif inspect.isawaitable(result) or inspect.isasyncgen(result):
                # A wrapper hid an async callable: run it on the async loop and wait here.
                self._runner.wait_for(_drive_async(execution, result))
            else:
                execution.on_result(result)
        except BaseException as exc:  # noqa: BLE001 - whatever the callable raises fails its batch only
            execution.fail(exc)
            return
        execution.finish()

    async def _run_async(self, requests: list[InferRequest]) -> None:
        execution = Execution(self, requests)
        try:
            batch = execution.prepare()
            if not batch:
                execution.finish()
                return
            await _drive_async(execution, self.fn(batch))
        except BaseException as exc:  # noqa: BLE001
            execution.fail(exc)
            return
        execution.finish()


async def _drive_async(execution: Execution, result: Any) -> None:
    if inspect.isawaitable(result):
        result = await result
    if inspect.isasyncgen(result):
        async for item in result:
            execution.on_result(item)
            if execution.all_cancelled():
                await result.aclose()
                break
    elif inspect.isgenerator(result):
        for item in result:
            execution.on_result(item)
            if execution.all_cancelled():
                result.close()
                break
    else:
        execution.on_result(result)


def _respond(request: InferRequest, response: InferResponse) -> None:
    callback = request.on_response
    if callback is None:
        return
    try:
        callback(response)
    except Exception:  # noqa: BLE001 - a transport callback must not break the others
        log.exception("response callback failed for model '%s'", response.model_name)


def _is_unrecoverable(exc: BaseException) -> bool:
    """PyTritonUnrecoverableError or a subclass (PyTriton tests with isinstance). By name, because
    backends sit below the PyTriton face (kernel.exceptions) and may not import it."""
    return any(cls.__name__ == "PyTritonUnrecoverableError" for cls in type(exc).__mro__)

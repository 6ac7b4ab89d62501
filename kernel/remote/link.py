"""The binding process's end of a remote-binding connection: frames in and out, and the callables.

A reader thread takes the server's frames: answers to Bind/Unbind wake the caller waiting for
them; each Infer goes to the thread of its instance (synchronous callables: one thread per
instance, as the in-process backend runs them) or, for async callables, to one event loop
thread. Results, one frame per returned or yielded list, go back under a lock so frames from
different threads never interleave.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import queue
import socket
import threading
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from kernel.exceptions import PyTritonUnrecoverableError
from kernel.proxy import remote as proto
from kernel.proxy import remote_socket as place
from kernel.proxy.types import Request

LOGGER = logging.getLogger("kernel.remote")


class LinkError(ConnectionError):
    """The server cannot be reached, refused the connection, or the connection ended."""


class NotOurServer(LinkError):
    """The process listening on the socket runs as another user: nothing was sent to it."""


class _Answer:
    def __init__(self):
        self.event = threading.Event()
        self.error: Optional[str] = None


def _is_async(fn: Callable) -> bool:
    return any(
        c is not None and (inspect.iscoroutinefunction(c) or inspect.isasyncgenfunction(c))
        for c in (fn, getattr(fn, "__call__", None))
    )


class Link:
    """A connection to the server's remote-binding socket."""

    def __init__(self, path: Path, on_lost: Callable[[], None], on_unrecoverable: Callable[[BaseException], None],
                 uid: Optional[int] = None):
        """Connect to `path`; the process listening there must run as `uid` (default: this process's)."""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(str(path))
        except OSError as exc:
            self._sock.close()
            raise LinkError(f"cannot connect to {path}: {exc}") from None
        try:  # before the first frame: our models' configs and answers go to our own user's server only
            place.check_peer(self._sock, uid, str(path))
        except place.PeerRefused as exc:
            self._sock.close()
            raise NotOurServer(str(exc)) from None
        self._send_lock = threading.Lock()
        self._on_lost = on_lost
        self._on_unrecoverable = on_unrecoverable
        self._answers: Dict[str, _Answer] = {}
        self._callables: Dict[str, List[Callable]] = {}
        self._queues: Dict[tuple, queue.SimpleQueue] = {}
        self._threads: List[threading.Thread] = []
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._lock = threading.Lock()
        self._cancelled: set = set()  # calls the server no longer waits for
        self.alive = True
        self._send(proto.Hello(pid=os.getpid()))
        self._sock.settimeout(30)
        welcome = self._read()
        self._sock.settimeout(None)
        if not isinstance(welcome, proto.Welcome) or welcome.error:
            self._sock.close()
            raise LinkError(f"the server refused the connection: {getattr(welcome, 'error', welcome)}")
        self._reader = threading.Thread(target=self._read_loop, name="kernel-remote-reader", daemon=True)
        self._reader.start()

    # ---- frames -----------------------------------------------------------------------------------

    def _send(self, message: proto.Message) -> None:
        data = proto.frame(message)
        with self._send_lock:
            self._sock.sendall(data)

    def _recv_exactly(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self._sock.recv(min(n, 1 << 20))
            if not chunk:
                raise LinkError("the server closed the connection")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _read(self) -> proto.Message:
        header = self._recv_exactly(proto.HEADER_BYTES)
        return proto.decode(self._recv_exactly(proto.frame_length(header)))

    def _read_loop(self) -> None:
        try:
            while True:
                message = self._read()
                if isinstance(message, proto.Infer):
                    self._dispatch(message)
                elif isinstance(message, proto.Cancel):
                    self._cancelled.add(message.call)
                elif isinstance(message, proto.Answer):
                    answer = self._answers.get(message.name)
                    if answer is not None:
                        answer.error = message.error
                        answer.event.set()
        except (OSError, ValueError) as exc:
            LOGGER.debug("remote binding connection ended: %s", exc)
        except Exception:  # noqa: BLE001
            LOGGER.exception("remote binding connection failed")
        self.alive = False
        for answer in list(self._answers.values()):
            answer.error = answer.error or "the server closed the connection"
            answer.event.set()
        self._on_lost()

    # ---- binding ------------------------------------------------------------------------------------

    def request(self, message, name: str, timeout: Optional[float]) -> Optional[str]:
        """Send a Bind or Unbind and wait for the server's answer; returns its error (None: done)."""
        answer = self._answers[name] = _Answer()
        try:
            if not self.alive:
                return "the connection to the server is closed"
            try:
                self._send(message)
            except OSError as exc:
                return f"the connection to the server failed: {exc}"
            if not answer.event.wait(timeout):
                return f"the server did not answer within {timeout} s"
            return answer.error
        finally:
            self._answers.pop(name, None)

    def add_callables(self, name: str, callables: List[Callable]) -> None:
        with self._lock:
            self._callables[name] = list(callables)

    def remove_callables(self, name: str) -> None:
        with self._lock:
            self._callables.pop(name, None)

    # ---- running callables ----------------------------------------------------------------------------

    def _dispatch(self, message: proto.Infer) -> None:
        with self._lock:
            callables = self._callables.get(message.name)
        if not callables:
            self._send(proto.Failed(message.call, f"model '{message.name}' is not bound by process {os.getpid()}"))
            return
        fn = callables[message.instance] if message.instance < len(callables) else callables[0]
        if _is_async(fn):
            loop = self._async_loop()
            loop.call_soon_threadsafe(lambda: loop.create_task(self._run_async(fn, message)))
            return
        key = (message.name, message.instance)
        with self._lock:
            work = self._queues.get(key)
            if work is None:
                work = self._queues[key] = queue.SimpleQueue()
                thread = threading.Thread(target=self._worker, args=(fn, work), daemon=True,
                                          name=f"kernel-remote-{message.name}-{message.instance}")
                self._threads.append(thread)
                thread.start()
        work.put(message)

    def _worker(self, fn: Callable, work: queue.SimpleQueue) -> None:
        while True:
            message = work.get()
            if message is None:
                return
            self._run(fn, message)

    def _run(self, fn: Callable, message: proto.Infer) -> None:
        try:
            result = fn(_requests(message))
            if inspect.isgenerator(result):
                for item in result:
                    if message.call in self._cancelled:
                        result.close()  # the generator's finally blocks run now, as in the server's process
                        break
                    self._result(message.call, item)
            elif inspect.isawaitable(result) or inspect.isasyncgen(result):
                asyncio.run_coroutine_threadsafe(self._drain(message.call, result), self._async_loop()).result()
            else:
                self._result(message.call, result)
        except BaseException as exc:  # noqa: BLE001 - reported to the server as this call's failure
            self._failed(message.call, exc)
            return
        finally:
            self._cancelled.discard(message.call)
        self._send_quietly(proto.Done(message.call))

    async def _run_async(self, fn: Callable, message: proto.Infer) -> None:
        try:
            await self._drain(message.call, fn(_requests(message)))
        except BaseException as exc:  # noqa: BLE001
            self._failed(message.call, exc)
            return
        finally:
            self._cancelled.discard(message.call)
        self._send_quietly(proto.Done(message.call))

    async def _drain(self, call: int, result: Any) -> None:
        if inspect.isawaitable(result):
            result = await result
        if inspect.isasyncgen(result):
            async for item in result:
                if call in self._cancelled:
                    await result.aclose()
                    break
                self._result(call, item)
        elif inspect.isgenerator(result):
            for item in result:
                if call in self._cancelled:
                    result.close()
                    break
                self._result(call, item)
        else:
            self._result(call, result)

    def _result(self, call: int, results: Any) -> None:
        if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
            raise TypeError(
                "the inference callable must return a list with one dict of numpy arrays per request; it returned "
                f"{type(results).__name__}"
            )
        self._send(proto.Result(call, [{str(k): proto.to_array(v) for k, v in r.items()} for r in results]))

    def _failed(self, call: int, exc: BaseException) -> None:
        unrecoverable = isinstance(exc, PyTritonUnrecoverableError)
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self._send_quietly(proto.Failed(call, text, unrecoverable))
        if unrecoverable:
            self._on_unrecoverable(exc)

    def _send_quietly(self, message: proto.Message) -> None:
        try:
            self._send(message)
        except OSError:
            pass  # the reader thread reports the lost connection

    def _async_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                ready = threading.Event()

                def main():
                    loop = asyncio.new_event_loop()
                    self._loop = loop
                    ready.set()
                    loop.run_forever()

                threading.Thread(target=main, name="kernel-remote-async", daemon=True).start()
                ready.wait()
            return self._loop

    # ---- closing ----------------------------------------------------------------------------------------

    def close(self) -> None:
        self.alive = False
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._lock:
            for work in self._queues.values():
                work.put(None)
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        if self._reader is not threading.current_thread():
            self._reader.join(5)


def _requests(message: proto.Infer) -> List[Request]:
    return [
        Request(data={k: proto.from_array(a) for k, a in r.inputs.items()}, parameters=r.parameters,
                requested_output_names=r.requested_outputs)
        for r in message.requests
    ]

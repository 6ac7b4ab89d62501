"""The KServe HTTP front's fast path: plain infer requests answered by the connection itself.

Why: at concurrency 1 uvicorn's per-request machinery (the ASGI scope, a RequestResponseCycle,
a task per request, two ASGI send messages, a DisconnectWatch) was over a third of the front's
Python time (benchmarks/results/latency_budget.md, issue 17). A request that is
`POST /v2/models/<m>[/versions/<v>]/infer` with a Content-Length body and nothing unusual is
taken here, in the parser's callbacks: its body is gathered in one buffer sized from
Content-Length, it goes to the same HttpApp.infer_request -> server.submit -> codec encode the
ASGI route uses, and its answer leaves in one write (binary outputs as their own buffers,
never joined into one). The connection's own connection_lost cancels its in-flight request:
no watcher object, task or timer per request.

Everything else goes through ASGI unchanged, and so does an infer request that is unusual:
Content-Encoding, Transfer-Encoding, Upgrade, an invalid
Inference-Header-Content-Length, a body over --http-max-input-size, a percent-encoded or
query-carrying URL, restricted APIs (--http-restricted-api), tracing on, a request pipelined
behind one still being answered, or a client not reading its answers (write buffer full).
Answers are byte for byte what the ASGI route writes (tests/transports/test_http_fast.py).
The limits of kernel.transports.http_limits hold here as well: this class is a
LimitedHttpToolsProtocol and takes requests only after its header checks, and its body
timer sees the fast request as an unanswered cycle.

Two things leave the callbacks, both only when they are large: a JSON body over
large_json.INLINE_REQUEST_BYTES is decoded, and an answer with a JSON output over
codec.INLINE_JSON_BYTES encoded, on large_json's thread (in pieces, so the loop keeps going);
the connection goes on from the future's callback. While the server holds more answers for
slow readers than --max-held-output-bytes allows (kernel.core.holding), infer requests are
refused with 503 (one comparison per request).

KERNEL_HTTP_FAST_PATH=0 in the environment turns the fast path off (every request through
ASGI): for comparing the two.

Large bodies are read straight into their buffer: the event loop reads the connection with
get_buffer/buffer_updated (asyncio's BufferedProtocol), and once a fast request's headers are in
and its body is 64 KiB or more, get_buffer hands it the rest of that body's buffer, so the
socket's bytes land in the request's buffer with no copy in user space (neither uvloop's bytes
object nor httptools' on_body piece). The parser does not see those bytes; a fresh parser takes
the connection's next request. Everything else is read into one shared buffer and fed to
httptools as before. uvloop reads that way only from an object that is not an asyncio.Protocol,
which this class is through uvicorn's: the loop is given a BufferedReads in front of it.
"""

from __future__ import annotations

import asyncio
import os
import re
from typing import Callable, Optional

import httptools
import numpy as np
from uvicorn.protocols.http.httptools_impl import STATUS_LINE
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import collect_single_response
from kernel.transports.asgi import status_for
from kernel.transports.http import codec, large_json
from kernel.transports.http.app import HttpApp, binary_headers, error_for
from kernel.transports.http_limits import Http1Limits, LimitedHttpToolsProtocol

ENABLED = os.environ.get("KERNEL_HTTP_FAST_PATH", "1") != "0"

# The route, on the raw URL: a name of visible ASCII without '/', '?', '%' or '#'; a version of digits.
_INFER = re.compile(rb"/v2/models/([^/?%#\x00-\x20\x7f-\xff]+)(?:/versions/([0-9]+))?/infer")
# Request headers that send a request to the ASGI route (the fast path does not handle them).
_UNUSUAL = frozenset((b"content-encoding", b"transfer-encoding", b"upgrade"))
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_JSON_TYPE = b"content-type: application/json\r\ncontent-length: "
_CLOSE = b"connection: close\r\n"
# Bodies this large are read straight into their buffer (below it they come with the headers anyway).
DIRECT_BODY_BYTES = 64 * 1024
# Everything else is read into one buffer per listener (one event loop), fed to the parser at once;
# the parser keeps no reference to it.
READ_BUFFER_BYTES = 256 * 1024


class _NoEvent:
    """Stands in for a cycle's message_event: uvicorn sets it on disconnect; nothing waits on it here."""

    __slots__ = ()

    def set(self) -> None:
        pass


_NO_EVENT = _NoEvent()


class FastCycle:
    """One fast request; as uvicorn's RequestResponseCycle where uvicorn and the limits look at it."""

    __slots__ = ("name", "version", "url", "http_version", "header_length", "length", "body", "filled", "keep_alive", "reading",
                 "response_started", "response_complete", "disconnected", "request")
    message_event = _NO_EVENT

    def __init__(self, name: str, version: str, url: bytes, http_version: str, header_length: Optional[int],
                 length: int, keep_alive: bool):
        self.name = name
        self.version = version
        self.url = url  # the protocol's own url and scope belong to the next request once one is pipelined
        self.http_version = http_version
        self.header_length = header_length
        self.length = length
        self.body = None  # bytes (arrived in one piece) or a memoryview of `length` bytes being filled
        self.filled = 0
        self.keep_alive = keep_alive
        self.reading = True  # until the body is whole (a request pipelined behind is uvicorn's again)
        self.response_started = False
        self.response_complete = False
        self.disconnected = False
        self.request = None


class _DefaultHeaders:
    """uvicorn's default headers (date, server) as bytes, rebuilt when uvicorn replaces them (each second)."""

    __slots__ = ("source", "text")

    def __init__(self) -> None:
        self.source = None
        self.text = b""

    def get(self, headers: list) -> bytes:
        if headers is not self.source:
            self.text = b"".join(name.lower() + b": " + value + b"\r\n" for name, value in headers)
            self.source = headers
        return self.text


_DEFAULTS = _DefaultHeaders()


class FastInferProtocol(LimitedHttpToolsProtocol):
    """A LimitedHttpToolsProtocol that answers plain infer requests itself; `app` set by protocol_for."""

    app_fast: HttpApp
    read_buffer: memoryview  # set by protocol_for: READ_BUFFER_BYTES shared by the listener's connections

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fast: Optional[FastCycle] = None  # the fast request being read or answered
        self.direct: Optional[FastCycle] = None  # the fast request whose body is read past the parser

    # ---- reads (asyncio.BufferedProtocol) ---------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        cycle = self.direct
        if cycle is None:
            return self.read_buffer
        return cycle.body[cycle.filled:]

    def buffer_updated(self, nbytes: int) -> None:
        cycle = self.direct
        if cycle is None:
            self.data_received(self.read_buffer[:nbytes])
            return
        self.read_past_parser()
        cycle.filled += nbytes
        if cycle.filled < cycle.length:
            return
        # The old parser still waits for the body it never saw: the next request gets a fresh one.
        self.direct = None
        parser = httptools.HttpRequestParser(self)
        parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn sets it
        self.parser = parser
        self.on_message_complete()

    # ---- choosing -------------------------------------------------------------------

    def headers_complete(self) -> None:
        cycle = self._fast_cycle()
        if cycle is None:
            super().headers_complete()
            return
        self.fast = self.cycle = cycle  # uvicorn and the limits look at self.cycle
        if self.expect_100_continue:
            # As uvicorn does when the ASGI route starts reading the body (which it always does for a
            # request that would come here): large uploads from curl and the like ask for it.
            self.transport.write(_CONTINUE)
        if cycle.length >= DIRECT_BODY_BYTES:
            # Uninitialised memory, not a bytearray: no zero-filling pass over it. From the heap, not a
            # fresh mmap: glibc reuses a freed block of that size, where new pages would each fault.
            cycle.body = memoryview(np.empty(cycle.length, np.uint8))
            self.direct = cycle  # once this read is parsed, the rest of the body goes straight in

    def _fast_cycle(self) -> Optional[FastCycle]:
        """A FastCycle for this request, or None to send it through ASGI."""
        parser = self.parser
        if parser.get_method() != b"POST":
            return None
        match = _INFER.fullmatch(self.url)
        if match is None:
            return None
        app = self.app_fast
        if app.restricted is not None or app.tracer.active:
            return None
        previous = self.cycle
        if (previous is not None and not previous.response_complete) or self.pipeline or self.flow.write_paused:
            return None  # pipelined behind an answer still due: uvicorn's queue keeps the order
        length = 0
        header_length = None
        for name, value in self.headers:
            if name == b"content-length":
                length = int(value)
            elif name == b"inference-header-content-length":
                try:
                    header_length = codec.header_length(value)
                except KernelError:
                    return None
            elif name in _UNUSUAL:
                return None
        if length > app.max_input_size:
            return None
        version = match.group(2)
        http_version = parser.get_http_version()
        return FastCycle(match.group(1).decode("ascii"), version.decode("ascii") if version else "", self.url,
                         http_version, header_length, length, http_version != "1.0" and parser.should_keep_alive())

    # ---- reading ----------------------------------------------------------------------

    def body_received(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is not FastCycle or not cycle.reading:
            super().body_received(body)
            return
        # One buffer sized from Content-Length; a body that came in one piece is kept as it is.
        size = len(body)
        if cycle.body is None and size == cycle.length:
            cycle.body = body
            cycle.filled = size
            return
        if cycle.body is None:
            cycle.body = memoryview(bytearray(cycle.length))
        start = cycle.filled
        cycle.body[start:start + size] = body
        cycle.filled = start + size

    def message_complete(self) -> None:
        cycle = self.cycle
        if type(cycle) is not FastCycle or not cycle.reading:
            super().message_complete()
            return
        cycle.reading = False
        self.direct = None
        body = cycle.body
        if body is None:
            body = b""
        cycle.body = None
        held = self.held
        if held is not None and held.over_limit:
            self._error(cycle, KernelError(ErrorCode.UNAVAILABLE, held.refusal()))
            return
        headers = self.headers  # the next pipelined request's headers replace them
        if len(body) > large_json.INLINE_REQUEST_BYTES and large_json.too_large_for_loop(body, cycle.header_length):
            future = large_json.run(large_json.decode_request, body, cycle.header_length)
            future.add_done_callback(lambda f: self._decoded(cycle, body, headers, f))
            return
        self._submit(cycle, body, headers, None)

    def _decoded(self, cycle: FastCycle, body, headers, future) -> None:
        if cycle.disconnected:
            return
        try:
            decoded = future.result()
        except Exception as exc:  # noqa: BLE001 - answered as the ASGI route answers it
            self._error(cycle, exc)
            return
        self._submit(cycle, body, headers, decoded)

    def _submit(self, cycle: FastCycle, body, headers, decoded) -> None:
        app = self.app_fast
        try:
            request, binary_default, binary_choice = app.infer_request(
                cycle.name, cycle.version, body, cycle.header_length, headers, decoded)
            future = collect_single_response(request)
            app.server.submit(request)
        except Exception as exc:  # noqa: BLE001 - answered as the ASGI route answers it
            self._error(cycle, exc)
            return
        cycle.request = request
        future.add_done_callback(lambda f: self._answer(cycle, f, binary_default, binary_choice))

    # ---- answering --------------------------------------------------------------------

    def _answer(self, cycle: FastCycle, future, binary_default, binary_choice) -> None:
        if cycle.disconnected or future.cancelled():
            return  # the client went away; connection_lost cancelled the request
        response = future.result()
        if response.error is not None:
            self._write(cycle, status_for(response.error), codec.error_body(response.error.message))
            return
        limit = self.app_fast.max_json_output_size
        try:
            encoded = codec.encode_infer_response(response, binary_default, binary_choice, limit)
        except codec.LargeJson:
            later = large_json.run(large_json.encode_answer, response, binary_default, binary_choice, limit)
            later.add_done_callback(lambda f: self._encoded(cycle, f))
            return
        except Exception as exc:  # noqa: BLE001
            self._error(cycle, exc)
            return
        self._send(cycle, *encoded)

    def _encoded(self, cycle: FastCycle, future) -> None:
        if cycle.disconnected:
            return
        try:
            encoded = future.result()
        except Exception as exc:  # noqa: BLE001
            self._error(cycle, exc)
            return
        self._send(cycle, *encoded)

    def _send(self, cycle: FastCycle, body, json_length) -> None:
        if json_length is None:
            self._write(cycle, 200, body)
            return
        size = 0
        for part in body:
            size += len(part)
        head = self._head(cycle, 200, binary_headers(json_length, size))
        if len(body[0]) < large_json.INLINE_REQUEST_BYTES:
            body[0] = head + body[0]
        else:
            body.insert(0, head)
        self._finish(cycle, body)

    def _error(self, cycle: FastCycle, exc: Exception) -> None:
        status, message = error_for(exc, "POST", self._path(cycle))
        self._write(cycle, status, codec.error_body(message))

    def _write(self, cycle: FastCycle, status: int, body) -> None:
        """A JSON answer, as asgi.send_response writes it through uvicorn (a large one not copied)."""
        head = STATUS_LINE[status] + _DEFAULTS.get(self.server_state.default_headers) + _JSON_TYPE
        head += b"%d\r\n%s\r\n" % (len(body), b"" if cycle.keep_alive else _CLOSE)
        self._finish(cycle, [head + body] if len(body) < large_json.INLINE_REQUEST_BYTES else [head, body], status)

    def _head(self, cycle: FastCycle, status: int, headers: list) -> bytes:
        parts = [STATUS_LINE[status], _DEFAULTS.get(self.server_state.default_headers)]
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        if not cycle.keep_alive:
            parts.append(_CLOSE)
        parts.append(b"\r\n")
        return b"".join(parts)

    def _finish(self, cycle: FastCycle, parts: list, status: int = 200) -> None:
        cycle.response_started = True
        cycle.request = None
        transport = self.transport
        if self.access_log:
            scope = {"client": self.client, "path": self._path(cycle), "query_string": b""}
            self.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(scope), "POST",
                                    get_path_with_query_string(scope), cycle.http_version, status)
        if transport.is_closing():
            pass  # cut meanwhile (shutdown's grace ended, or a limit): connection_lost is on its way
        elif len(parts) == 1:
            transport.write(parts[0])
        else:
            transport.writelines(parts)  # binary outputs as their own buffers: no join, no copy
        cycle.response_complete = True
        if self.fast is cycle:
            self.fast = None
        if not cycle.keep_alive:
            transport.close()
        self.on_response_complete()

    def _path(self, cycle: FastCycle) -> str:
        """The request's path, made only when something reads it (a 500's log line, the access log)."""
        return self.root_path + cycle.url.decode("ascii")

    # ---- the connection -----------------------------------------------------------------

    def connection_lost(self, exc) -> None:
        cycle = self.fast
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            request = cycle.request
            if request is not None:
                request.cancel()  # the model sees is_cancelled(), as with the ASGI route's watcher
        self.fast = self.direct = None
        super().connection_lost(exc)


class BufferedReads(asyncio.BufferedProtocol):
    """What the event loop is given for one FastInferProtocol connection: the connection's own
    methods, on an object that is not an asyncio.Protocol.

    Why: uvloop takes a protocol that is an asyncio.Protocol for one that wants bytes, even when
    it has get_buffer, and FastInferProtocol is one through uvicorn's class. Given the connection
    itself, uvloop read every body in 256 KiB pieces, made a bytes object of each, httptools a
    second and body_received copied it a third time, up to 32 pieces per wake-up: a 24 MiB body
    held the loop ~30 ms at a time (the fast path's /v2/health/live p99 under 24 MiB JSON bodies:
    30-100 ms, against 6 ms on the ASGI route). The methods are the connection's bound methods, so
    the loop calls straight into it; uvicorn, the limits and the server's connection set all see
    the connection, never this."""

    def __init__(self, connection: "FastInferProtocol") -> None:
        self.connection_made = connection.connection_made
        self.connection_lost = connection.connection_lost
        self.eof_received = connection.eof_received
        self.pause_writing = connection.pause_writing
        self.resume_writing = connection.resume_writing
        self.get_buffer = connection.get_buffer
        self.buffer_updated = connection.buffer_updated


def protocol_for(app: HttpApp, limits: Http1Limits) -> Callable[..., BufferedReads]:
    """The connection factory for the KServe HTTP front (uvicorn's `http`): the fast path on `app`,
    within `limits` (and --http-max-input-size for declared bodies, the server's account of held
    answers), each connection behind a BufferedReads."""
    connection = type("FastInferProtocol", (FastInferProtocol,),
                      {"limits": limits, "app_fast": app, "read_buffer": memoryview(bytearray(READ_BUFFER_BYTES)),
                       "max_body": app.max_input_size, "held": app.server.held_output})

    def accepted(**kwargs) -> BufferedReads:
        return BufferedReads(connection(**kwargs))

    return accepted

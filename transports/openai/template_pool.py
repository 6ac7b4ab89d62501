"""Chat templates rendered beside the front, in renderer processes with a time and a size limit.

Why: a model's chat template is code that runs on every chat call, and the client's messages
drive its loops. Rendered on the event loop, a nested `range` froze the front for good (issue 31).
Here each render goes to a renderer process (template_worker.py, why a process is said there),
one render at a time per process, at most MAX_PROCESSES of them, started on the first render of a
model that has a template (a model without one never starts any). A render that has not answered
within RENDER_TIMEOUT_S has its process killed, and the client gets a 400 that says so; a render
whose prompt passes the limit (--http-max-input-size: a prompt is never larger than the largest
body the server takes) stops there and is refused the same way. The front waits without blocking:
other clients, /v2/health/live and a SIGTERM are served meanwhile.

Measured on the 2-core box (a Llama-3-style template, four short messages): 9 us in the front's
own thread, 22 us as a blocking round trip to a process; the process starts in ~80 ms (once).
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import sys
from pathlib import Path
from typing import Optional

import msgspec

from kernel.transports.openai.errors import ApiError, bad_request

log = logging.getLogger("kernel.openai")

RENDER_TIMEOUT_S = 5.0
MAX_PROCESSES = 2
# Messages larger than this are packed for the renderer off the event loop.
OFFLOAD_BYTES = 256 * 1024
_WORKER = str(Path(__file__).with_name("template_worker.py"))
# The renderer runs template_worker.py by path, with the current directory off sys.path.
_BOOT = "import runpy, sys; del sys.path[0]; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
_LEN = struct.Struct("<I")
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


class _Process:
    __slots__ = ("proc",)

    def __init__(self, proc) -> None:
        self.proc = proc

    async def call(self, payload: bytes) -> dict:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        stdin.write(_LEN.pack(len(payload)))
        stdin.write(payload)
        await stdin.drain()
        head = await stdout.readexactly(4)
        return _decode(await stdout.readexactly(_LEN.unpack(head)[0]))

    def kill(self) -> None:
        if self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass


class TemplatePool:
    """The renderer processes of one OpenAI listener."""

    def __init__(self, limit: int, timeout_s: float = RENDER_TIMEOUT_S, processes: int = MAX_PROCESSES) -> None:
        self.limit = limit
        self.timeout_s = timeout_s
        self.processes = processes
        self._idle: list[_Process] = []
        self._started = 0  # processes alive, idle or rendering
        self._waiters: list[asyncio.Future] = []
        self._all: set[_Process] = set()
        self._closed = False

    async def render(self, template, messages: list[dict], size: int, tools: Optional[list] = None,
                     add_generation_prompt: bool = True, kwargs: Optional[dict] = None) -> str:
        """The prompt `template` (chat_template.ChatTemplate with a text) makes of `messages` (and
        the request's `tools`, `add_generation_prompt` and `chat_template_kwargs`); ApiError when
        it fails, is too slow or too large. `size`: about how many bytes the messages take."""
        request = {"text": template.text, "bos": template.bos_token, "eos": template.eos_token, "messages": messages,
                   "tools": tools, "add_generation_prompt": add_generation_prompt, "kwargs": kwargs or {}}
        if size > OFFLOAD_BYTES:
            payload = await asyncio.get_running_loop().run_in_executor(None, _encode, request)
        else:
            payload = _encode(request)
        del request
        process = await self._take()
        try:
            reply = await asyncio.wait_for(process.call(payload), self.timeout_s)
        except asyncio.TimeoutError:
            self._drop(process)
            raise bad_request(f"the model's chat template did not finish rendering these messages within "
                              f"{self.timeout_s:g} s; the render was stopped", "messages",
                              "chat_template_limit") from None
        except (asyncio.IncompleteReadError, ConnectionError, OSError, msgspec.DecodeError):
            self._drop(process)
            raise bad_request("the model's chat template failed on these messages: the renderer stopped (it may "
                              "have needed more memory than a render may take)", "messages",
                              "chat_template_limit") from None
        except BaseException:  # cancelled (the server stops, the client left): the process is mid-render
            self._drop(process)
            raise
        self._give_back(process)
        prompt = reply.get("prompt")
        if isinstance(prompt, str):
            return prompt
        raise _refusal(template, reply.get("error"), str(reply.get("message", "")), self.limit)

    # ---- the processes --------------------------------------------------------------------

    async def _take(self) -> _Process:
        while True:
            if self._closed:
                raise ApiError(503, "the server is stopping", "server_error", None, "server_stopping")
            if self._idle:
                return self._idle.pop()
            if self._started < self.processes:
                self._started += 1
                try:
                    return await self._start()
                except BaseException:
                    self._started -= 1
                    self._wake()
                    raise
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    async def _start(self) -> _Process:
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _BOOT, _WORKER, str(os.getpid()), str(self.limit),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        except OSError as exc:
            log.error("could not start a chat template renderer: %s", exc)
            raise ApiError(500, "the server could not start its chat template renderer", "server_error") from None
        process = _Process(proc)
        self._all.add(process)
        return process

    def _give_back(self, process: _Process) -> None:
        if self._closed:
            self._drop(process)
            return
        self._idle.append(process)
        self._wake()

    def _drop(self, process: _Process) -> None:
        process.kill()
        if process in self._all:
            self._all.discard(process)
            self._started -= 1
            asyncio.ensure_future(_reap(process))
        self._wake()

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        """Stop every renderer (the server stops)."""
        self._closed = True
        processes = list(self._all)
        self._idle.clear()
        for process in processes:
            self._drop(process)
        await asyncio.gather(*(_reap(p) for p in processes), return_exceptions=True)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)


async def _reap(process: _Process) -> None:
    try:
        await asyncio.wait_for(process.proc.wait(), 5.0)
    except asyncio.TimeoutError:
        pass


def _refusal(template, kind: Optional[str], message: str, limit: int) -> ApiError:
    """The client's answer for a render that failed; the template's path stays in the server's log."""
    if kind == "raised":
        return bad_request(f"the model's chat template refused the messages: {message}", "messages")
    if kind == "too_large":
        return bad_request(f"the prompt the model's chat template made of these messages passed {limit} bytes, the "
                           "most a prompt may take (--http-max-input-size)", "messages", "chat_template_limit")
    if kind == "memory":
        return bad_request("the model's chat template needed more memory than a render may take on these messages",
                           "messages", "chat_template_limit")
    if kind == "failed":
        log.warning("model '%s': its chat template (%s) failed to render a request: %s", template.model,
                    template.source, message)
        return bad_request(f"the chat template of model '{template.model}' failed on these messages: {message}",
                           "messages", "chat_template_error")
    log.error("model '%s': its chat template (%s) cannot be used: %s", template.model, template.source, message)
    if kind == "compile":
        return ApiError(500, f"the chat template of model '{template.model}' does not compile: {message}",
                        "server_error", None, "chat_template_error")
    return ApiError(500, f"model '{template.model}' has a chat template and {message}", "server_error", None,
                    "chat_template_error")

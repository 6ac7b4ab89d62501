"""The chat-template renderer process: renders a model's Jinja2 template for the front, with bounds.

Why a process: a template is code. A two-line nested `range` in one froze the front's event loop
for good (SIGTERM ignored, issue 31), another built a 1 GiB string. A thread cannot be stopped and
shares the front's memory; Jinja2's sandbox hooks see calls and operators but not loop iterations
nor C-level string growth (`"x".ljust(10**9)`, `~` concatenations). A process can be killed, and
its memory is its own, under a limit. The front (template_pool.py) sends one render at a time and
kills the process when a render passes its time limit; here:

- the output is counted as the template produces it (`Template.generate`), and the render stops
  as soon as it passes the limit the front gives;
- the address space is limited (RLIMIT_AS: what the process had at start plus MEMORY_FACTOR x the
  output limit plus MEMORY_SLACK): a template that builds something huge gets a MemoryError, which
  is answered as an error, or the process dies, which the front answers the same way;
- the process dies with the front (PR_SET_PDEATHSIG on Linux, else a thread that watches the parent)
  and ignores SIGINT (Ctrl-C at a terminal reaches the whole process group; the front stops it).

Run by file path (template_pool.py), not as a module of the package: importing the package would
import the whole OpenAI transport. It imports only the standard library, msgspec and jinja2.

Wire format, both ways: a 4-byte little-endian length, then a msgpack map.
    request  {"text", "bos", "eos", "messages", "tools", "add_generation_prompt", "kwargs"}
    reply    {"prompt": str} or {"error": kind, "message": str}; kind is "raised" (the template's
             raise_exception: its message is for the client), "failed" (an exception on these
             messages), "compile", "too_large", "memory" or "setup" (jinja2 missing).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import threading
from collections import OrderedDict
from datetime import datetime

MEMORY_FACTOR = 8  # a rendered str may take 4 bytes a character, its pieces as much again
MEMORY_SLACK = 256 << 20
COMPILED_KEPT = 32  # compiled templates kept (most recently used)
_LEN = struct.Struct("<I")
_PR_SET_PDEATHSIG = 1


class Raised(Exception):
    """raise_exception() in a template."""


class TooLarge(Exception):
    pass


def _environment():
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise Raised(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


class Renderer:
    def __init__(self, limit: int) -> None:
        self.limit = limit  # the most bytes (UTF-8) a rendered prompt may take
        self.env = None
        self.compiled: OrderedDict = OrderedDict()

    def render(self, request: dict) -> dict:
        if self.env is None:
            try:
                self.env = _environment()
            except ImportError:
                return {"error": "setup", "message": "rendering it needs jinja2 (a dependency of Kernel), which is "
                                                     "missing from the server's Python environment: pip install "
                                                     "'jinja2>=3.1' there, or reinstall Kernel"}
        text = request["text"]
        template = self.compiled.get(text)
        if template is None:
            from jinja2 import TemplateError

            try:
                template = self.env.from_string(text)
            except TemplateError as exc:
                return {"error": "compile", "message": f"{type(exc).__name__}: {exc}"}
            self.compiled[text] = template
            if len(self.compiled) > COMPILED_KEPT:
                self.compiled.popitem(last=False)
        else:
            self.compiled.move_to_end(text)
        limit = self.limit
        pieces = []
        size = 0
        try:
            variables = dict(request.get("kwargs") or {})
            variables.update(messages=request["messages"], bos_token=request["bos"], eos_token=request["eos"],
                             add_generation_prompt=request.get("add_generation_prompt", True))
            if request.get("tools") is not None:  # none: undefined in the template, as transformers leaves it
                variables["tools"] = request["tools"]
            for piece in template.generate(**variables):
                size += len(piece)
                if size > limit:
                    raise TooLarge
                pieces.append(piece)
            prompt = "".join(pieces)
            del pieces
            if len(prompt.encode("utf-8")) > limit:
                raise TooLarge
        except Raised as exc:
            return {"error": "raised", "message": str(exc)}
        except TooLarge:
            return {"error": "too_large", "message": f"the rendered prompt passed {limit} bytes"}
        except MemoryError:
            return {"error": "memory", "message": "the template needed more memory than a render may take"}
        except RecursionError:
            return {"error": "failed", "message": "RecursionError: the template nests too deeply"}
        except Exception as exc:  # noqa: BLE001 - a template that fails on these messages
            return {"error": "failed", "message": f"{type(exc).__name__}: {exc}"}
        return {"prompt": prompt}


def _die_with_parent(parent: int) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != parent:  # the parent died before prctl
                os._exit(0)
            return
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while True:
            threading.Event().wait(0.5)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _limit_memory(limit: int) -> None:
    try:
        import resource

        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        budget = size + MEMORY_FACTOR * limit + MEMORY_SLACK
        resource.setrlimit(resource.RLIMIT_AS, (budget, budget))
    except (OSError, ValueError, ImportError):
        pass  # not Linux: the time limit is the only bound


def main() -> None:
    import msgspec

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent, limit = int(sys.argv[1]), int(sys.argv[2])
    _die_with_parent(parent)
    renderer = Renderer(limit)
    try:  # before the memory limit: the import itself must not count against a render
        renderer.env = _environment()
    except ImportError:
        pass
    _limit_memory(limit)
    decoder = msgspec.msgpack.Decoder()
    encoder = msgspec.msgpack.Encoder()
    read = sys.stdin.buffer.read
    out = sys.stdout.buffer
    while True:
        head = read(4)
        if len(head) < 4:
            return
        body = read(_LEN.unpack(head)[0])
        try:
            reply = encoder.encode(renderer.render(decoder.decode(body)))
        except MemoryError:
            reply = encoder.encode({"error": "memory", "message": "the template needed more memory than a render "
                                                                  "may take"})
        del body
        out.write(_LEN.pack(len(reply)))
        out.write(reply)
        out.flush()


if __name__ == "__main__":
    main()

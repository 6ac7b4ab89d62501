"""A Kernel server (core + transports) on a background thread with its own uvloop.

Used by kernel.triton.Triton: the user's thread keeps running their program
while the server answers requests. Options come as `kernel serve` arguments,
parsed by the CLI's own parser and built by its build_server(), so every flag
behaves as it does on the command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import threading
from typing import Any, Awaitable, Callable, Optional

import uvloop

from kernel.serve import cli

from kernel.observe import log as server_log
from kernel.core.server import Server, StartupError

log = logging.getLogger("kernel.core.server")


class ServerArgumentError(ValueError):
    """The arguments do not parse as `kernel serve` arguments."""


def parse_args(argv: list[str]):
    """`kernel serve` arguments -> argparse namespace; ServerArgumentError with argparse's message."""
    parser = cli.build_parser()
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return parser.parse_args(argv)
    except SystemExit as exc:
        lines = [line for line in errors.getvalue().splitlines() if line.strip()]
        message = " ".join(getattr(exc, "message", "").split("\n"))  # cli.ArgumentsRefused: both lines
        raise ServerArgumentError(message or (lines[-1] if lines else "invalid server arguments")) from None


class InProcessServer:
    def __init__(self, args, prepare: Optional[Callable[[Server], None]] = None):
        """args: parsed `kernel serve` arguments; prepare(server) runs before the repository is loaded."""
        self.args = args
        self._prepare = prepare
        self.server: Optional[Server] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._started = threading.Event()
        self._startup_error: Optional[BaseException] = None
        self._stopped = threading.Event()

    # ---- lifecycle (user's thread) -------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        """Start serving; raise what made start-up fail (StartupError, OSError for a taken port...)."""
        args = self.args
        # Kernel runs inside the user's program: its records go through the program's logging
        # (logging.basicConfig(...) formats them); Kernel writes them itself only until that is configured.
        server_log.configure(args.log_verbose, args.log_info, args.log_warning, args.log_error,
                             args.log_format, args.log_file, role=server_log.EMBEDDED)
        for flag in args.no_effect:
            log.warning("%s is accepted for compatibility with tritonserver and has no effect in Kernel", flag)
        self._thread = threading.Thread(target=self._main, name="kernel-server", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError(f"the server did not start within {timeout:g} s")
        if self._startup_error is not None:
            self._thread.join(10)
            raise self._startup_error

    def call(self, coroutine: Awaitable, timeout: Optional[float] = None) -> Any:
        """Run a coroutine on the server's loop and wait for its result."""
        if self._loop is None or not self.is_alive():
            raise RuntimeError("the server is not running")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def stop(self, timeout: Optional[float] = None) -> None:
        """Graceful stop (in-flight requests finish within --exit-timeout-secs); returns when it is done."""
        # Stopped while starting (Ctrl-C during start()): let start-up finish first, so that
        # the shutdown does not run alongside it.
        while self._thread is not None and self._thread.is_alive() and not self._started.wait(0.05):
            pass
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
        except RuntimeError:  # the loop already closed
            pass
        thread.join(timeout)

    def is_alive(self) -> bool:
        return (self._thread is not None and self._thread.is_alive() and not self._stopped.is_set()
                and self.server is not None and self.server.live)

    # ---- the server thread -------------------------------------------------------------------------

    def _main(self) -> None:
        loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            if loop.run_until_complete(self._startup()):
                loop.run_forever()
        finally:
            self._stopped.set()
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    async def _startup(self) -> bool:
        try:
            self.server = cli.build_server(self.args)
            if self._prepare is not None:
                self._prepare(self.server)
            await self.server.open()  # listen (live) and check every port before the repository loads
            await self.server.start()
            await self.server.start_transports()
        except BaseException as exc:  # noqa: BLE001 - reported to the thread that called start()
            if isinstance(exc, SystemExit):
                # The CLI's helpers exit on bad flag values; here that must not end the user's program.
                exc = StartupError(str(exc.code))
            self._startup_error = exc
            if self.server is not None:
                try:
                    await self.server.stop()
                except Exception:  # noqa: BLE001
                    log.exception("stopping the server after a failed start failed")
            self._started.set()
            return False
        self._started.set()
        return True

    async def _shutdown(self) -> None:
        try:
            if self.server is not None:
                await self.server.stop()
        finally:
            self._stopped.set()
            asyncio.get_running_loop().stop()

"""`kernel serve`'s run (cli.serve): start-up as a task a signal can abandon, the standby workers
to start, service failures.

Apart from cli.py, which is near the size limit, and importing nothing heavy: cli.serve starts the
standby workers (backends/python/standby.py) before it imports the server, so that the workers'
imports overlap the front's.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import signal
from pathlib import Path

log = logging.getLogger("kernel.core.server")

# tritonserver's name of each service in its "failed to start <name> service: ..." line.
SERVICE_NAMES = {"HTTPService": "HTTP", "GRPCInferenceService": "GRPC", "Metrics Service": "Metrics",
                 "Sagemaker HTTPService": "Sagemaker", "Vertex AI HTTPService": "Vertex AI",
                 "OpenAIService": "OpenAI"}  # Kernel only (Triton's OpenAI frontend is another program)
# Why a listening socket could not be made: tritonserver words them all "already in use".
_BIND_ERRNOS = {errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES}


def service_failure(exc) -> str:
    """The one line tritonserver logs when a service cannot start; for a port that cannot be
    listened on: `failed to start HTTP service: Unavailable - Socket '0.0.0.0:8000' already in use `
    (its trailing space included, for scripts that match the whole line)."""
    transport = exc.transport
    name = SERVICE_NAMES.get(transport.service_name, transport.service_name)
    address, port = getattr(transport, "address", None), getattr(transport, "port", None)
    if exc.errno in _BIND_ERRNOS and address is not None:
        return f"failed to start {name} service: Unavailable - Socket '{address}:{port}' already in use "
    return f"failed to start {name} service: {exc}"


def expected_workers(args) -> int:
    """Workers that loading at start-up will start (an estimate from the config files' text)."""
    from kernel.backends.python import standby

    names = None  # every model folder: modes none and poll, or explicit with --load-model=*
    if args.model_control_mode == "explicit" and "*" not in args.load_model:
        names = set(args.load_model)
    repositories = [Path(p) for p in (args.model_repository or []) if "://" not in p]
    return standby.estimate(repositories, args.model_config_name or "", names)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StartupInterrupted(BaseException):
    """A stop signal came while the front built the server (signals_interrupt): nothing is serving
    yet, so `kernel serve` just ends (status 0). A BaseException, as KeyboardInterrupt is, so that no
    `except Exception` in the code being imported swallows it."""


def _received(stop: asyncio.Event, sig: signal.Signals) -> None:
    if not stop.is_set():
        log.info("Received signal %d (%s), shutting down", sig, sig.name)
    stop.set()


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT and SIGTERM, each logged when it arrives (not when a load finishes)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, _received, stop, sig)
    return stop


@contextlib.contextmanager
def signals_interrupt(stop: asyncio.Event):
    """Around synchronous start-up work on the loop's thread (the front importing and building the
    server: ~0.3 s on an idle box, over a second on a busy one, where the loop sees no signal and a
    Ctrl-C waited for the imports to end): a Python-level handler takes SIGINT and SIGTERM meanwhile
    and raises StartupInterrupted at once. The loop's handlers are put back afterwards."""
    if stop.is_set():  # came while the standbys were started
        raise StartupInterrupted()
    loop = asyncio.get_running_loop()

    def interrupt(signum, _frame) -> None:
        _received(stop, signal.Signals(signum))
        raise StartupInterrupted()

    for sig in _STOP_SIGNALS:
        signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for sig in _STOP_SIGNALS:
            loop.add_signal_handler(sig, _received, stop, sig)


async def run(server, remote, stop: asyncio.Event, fronts=None) -> int:
    """Start `server` (and the remote-binding host), serve until `stop` is set, stop; the exit status.

    fronts: the supervisor of several front processes (kernel.serve.fronts), started with the
    server, served once it has loaded, and stopped before it.

    Start-up runs as a task, so that a signal during a long model load abandons it: the loads are
    cancelled (the backend stops the workers it was starting) and the server stops at once, where
    it used to finish every load and start every listener first.
    """
    from kernel.core.server import StartupError
    from kernel.core.transport import TransportStartError

    startup = asyncio.ensure_future(_start(server, remote, fronts))
    signalled = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((startup, signalled), return_when=asyncio.FIRST_COMPLETED)
    finally:
        signalled.cancel()
    if not startup.done():
        startup.cancel()
        await asyncio.gather(startup, return_exceptions=True)
        loading = sorted(f"'{m.name}' version {m.version}" for m in server.registry.all_models()
                         if m.state.value == "LOADING")
        if loading:
            log.info("start-up interrupted: stopped loading %s", ", ".join(loading))
        await _stop(server, remote, fronts)
        return 0
    try:
        startup.result()
    except TransportStartError as exc:
        log.error("%s", service_failure(exc))
        await _stop(server, None, fronts)
        return 1
    except (StartupError, OSError) as exc:
        if str(exc).startswith("failed to start "):  # a service refused its settings, e.g. Vertex AI's
            log.error("%s", exc)
        else:
            log.error("error: creating server: %s", exc)
        await _stop(server, None, fronts)
        return 1
    await stop.wait()
    await _stop(server, remote, fronts)
    return 0


async def _start(server, remote, fronts=None) -> None:
    from kernel.backends.python import standby

    await server.open()  # listen (live) and check every port before any model loads
    if fronts is not None:
        await fronts.start()  # they listen (live, not ready) while the models load
    await server.start()
    standby.release()  # start-up loading is over: the standbys nobody took exit
    await server.start_transports()
    if fronts is not None:
        await fronts.serve()
    if remote is not None:
        await remote.start()
    # What start-up made (modules, configs, protobuf descriptors: most of the heap) lives as long as
    # the server: out of the collector's reach, a full collection scans only what came since. Without
    # this one took ~0.2 s of the event loop, every few seconds under streaming load (a per-token
    # allocation rate), all streams stalled meanwhile.
    gc.freeze()


async def _stop(server, remote, fronts=None) -> None:
    if remote is not None:
        remote.stop_listening()
    if fronts is not None:
        await fronts.stop()  # every front drains its requests (within the exit timeout) first
    await server.stop()
    if remote is not None:
        await remote.close()

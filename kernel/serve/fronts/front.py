"""A front process: one uvloop with the core and every client transport, in front of the
supervisor's model instances (`python -m kernel.serve.fronts.front`, started by supervisor.py).

It builds its server from the same `kernel serve` arguments as the supervisor (so every flag means
the same here), without the metrics port (the supervisor's) and with its share of the held-bytes
bounds; it binds the client ports beside the other fronts (kernel.transports.listen), answers
liveness at once, and serves the models the supervisor publishes (mirror.py) over its own links to
the workers. Whatever must act on the whole server goes through the supervisor (peers.py).

Ctrl-C reaches the whole process group: a front leaves stopping to the supervisor, which stops the
fronts first and the workers after. A SIGTERM sent to a front alone drains it and ends it (the
supervisor starts another in its place). A front whose supervisor is gone ends at once.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import socket
import sys
from typing import Optional

log = logging.getLogger("kernel.fronts")


def _parse(argv: list[str]):
    parser = argparse.ArgumentParser(prog="kernel-front")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--fd-channel-fd", type=int, required=True)
    parser.add_argument("--index", type=int, required=True)  # 1-based: also this front's link id
    parser.add_argument("--fronts", type=int, required=True)
    parser.add_argument("serve", nargs=argparse.REMAINDER)  # `kernel serve` arguments after "--"
    own = parser.parse_args(argv)
    serve_argv = own.serve[1:] if own.serve[:1] == ["--"] else own.serve
    return own, serve_argv


class Front:
    def __init__(self, own, args):
        from kernel.serve.fronts import messages as m
        from kernel.serve.fronts.channel import ControlChannel

        self.own = own
        self.args = args
        self.index = own.index
        self.channel = ControlChannel(
            m.ToFront, socket.socket(fileno=own.control_fd), socket.socket(fileno=own.fd_channel_fd),
            self._handle, self._supervisor_gone, name="the supervisor")
        self.server = None
        self.mirror = None
        self.done: Optional[asyncio.Future] = None
        self.relay = None  # the link to the supervisor's relay (attach.relay_instance)
        self._stopping = False

    # ---- start-up --------------------------------------------------------------------------------

    def build(self):
        from kernel.serve import cli
        from kernel.serve.fronts import attach
        from kernel.serve.fronts.mirror import Mirror
        from kernel.serve.fronts.peers import ForwardedControl, FrontPeers
        from kernel.transports import listen

        listen.shared_ports = True
        args = self.args
        args.allow_metrics = False  # the supervisor's port: it totals every front's numbers
        args.allow_remote_binding = False
        server = cli.build_server(args)
        # The bounds on what clients may make the server hold are the whole server's: each front its share.
        server.held_output.share(self.own.fronts)
        server.held_input.share(self.own.fronts)
        server.control = ForwardedControl(self.channel)
        server.peers = FrontPeers(self.channel)
        # Trace files are the supervisor's: one file, every front's traces in it, ids kept apart.
        server.tracer.forward_records(self._forward_traces, self.index, self.own.fronts + 1)
        self.mirror = Mirror(server, self.index, attach.attach_instances, attach.relay_scheduler(self))
        self.server = server
        return server

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self.done = loop.create_future()
        loop.add_signal_handler(signal.SIGINT, lambda: None)  # the supervisor stops us (module docstring)
        loop.add_signal_handler(signal.SIGTERM, self._terminated)
        await self.channel.open()
        server = self.build()
        from kernel.serve.fronts import messages as m
        from kernel.serve.startup import service_failure
        from kernel.core.transport import TransportStartError

        try:
            await server.open(check_ports=False)  # listen where liveness must answer while models load
        except TransportStartError as exc:
            log.error("%s", service_failure(exc))
            return 1
        await self.channel.call(m.Hello(0, self.index, os.getpid()))
        code = await self.done
        return code

    # ---- the supervisor's messages ----------------------------------------------------------------

    async def _handle(self, msg, fds):
        from kernel.serve.fronts import messages as m

        kind = type(msg)
        if kind is m.Publish:
            await self.mirror.apply(msg, fds)
            if msg.loaded and not self.server.loaded:
                await self._start_serving()
            return None
        if kind is m.Relink:
            found = self.mirror.relink(msg, fds)
            if found is not None:
                instance, chan, fd_sock = found
                await instance.replace(chan, fd_sock, msg.instance.facts)
            return None
        if kind is m.RelayLink:
            from kernel.serve.fronts.attach import relay_instance

            self.relay = await relay_instance(self.server, self.index, socket.socket(fileno=fds[0]),
                                              socket.socket(fileno=fds[1]))
            return None
        if kind is m.AllReady:
            self.server.peers.all_ready = msg.ready
            return None
        if kind is m.Regions:
            msg.change.apply(self.server.shared_memory)
            return None
        if kind is m.LogChange:
            from kernel.observe import log as server_log

            server_log.update_settings(self.server, **msg.changes)
            return None
        if kind is m.TraceChange:
            from kernel.serve.fronts.peers import trace_update

            self.server.tracer.update(msg.model_name, trace_update(msg))
            return None
        if kind is m.Collect:
            return self._collect(msg)
        if kind is m.Stop:
            asyncio.ensure_future(self._stop(0))
            return None
        raise ValueError(f"unexpected message {kind.__name__}")

    async def _start_serving(self) -> None:
        """Start-up loading is over: the transports that waited for the models start (SageMaker,
        Vertex AI); what stops one is told to the supervisor in the words `kernel serve` logs."""
        from kernel.core.errors import ErrorCode, KernelError
        from kernel.core.server import StartupError
        from kernel.core.transport import TransportStartError
        from kernel.serve.startup import service_failure

        try:
            await self.server.start()
            await self.server.start_transports()
        except TransportStartError as exc:
            raise KernelError(ErrorCode.INTERNAL, service_failure(exc)) from None
        except (StartupError, OSError) as exc:
            raise KernelError(ErrorCode.INTERNAL, str(exc)) from None
        gc.freeze()  # as `kernel serve` does once started (kernel.serve.startup)

    def _collect(self, msg):
        from kernel.core.errors import KernelError
        from kernel.observe.metrics import front_families

        if msg.what == "statistics":
            try:
                return self.server.statistics(msg.name, msg.version)
            except KernelError:
                return {"model_stats": []}  # not (yet, or any more) served here: nothing to add
        return front_families(self.server)

    def _forward_traces(self, path: str, records: str, indexed: bool) -> None:
        from kernel.serve.fronts import messages as m

        try:
            self.channel.send(m.TraceRecords(0, path, records, indexed))
        except ConnectionError:
            pass  # the supervisor is gone: so is its file

    # ---- stopping ------------------------------------------------------------------------------

    def _terminated(self) -> None:
        log.info("front %d: SIGTERM, draining", self.index)
        asyncio.ensure_future(self._stop(0))

    def _supervisor_gone(self) -> None:
        if not self._stopping and self.done is not None and not self.done.done():
            log.error("front %d: the supervisor is gone; exiting", self.index)
            self.done.set_result(1)

    async def _stop(self, code: int) -> None:
        if self._stopping:
            return
        self._stopping = True
        try:
            if self.server is not None:
                self.server.peers.all_ready = False
                await self.server.stop()
        finally:
            if not self.done.done():
                self.done.set_result(code)


def main(argv: Optional[list[str]] = None) -> int:
    own, serve_argv = _parse(sys.argv[1:] if argv is None else argv)
    from kernel.observe import log as server_log
    from kernel.serve import cli

    args = cli.build_parser().parse_args(["serve", *serve_argv])
    from kernel.serve import memory

    memory.return_large_buffers()
    server_log.configure(args.log_verbose, args.log_info, args.log_warning, args.log_error,
                         args.log_format, args.log_file, role=server_log.SERVE)
    if not args.log_verbose:
        # The supervisor logs the server's life (models loaded and unloaded, "Started ...", the
        # drain at shutdown) once; N fronts would repeat each line N times.
        logging.getLogger("kernel.core.server").setLevel(logging.WARNING)
    import uvloop

    return uvloop.run(Front(own, args).run())


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

"""Remote binding, server side: processes on this host bind callables into a running server
(PyTriton's RemoteTriton).

A binding process dials the server's Unix socket (kernel.proxy.remote_socket says where, and checks
that both ends run as the same user) and is then
served like a worker: each model it binds is loaded through the one loader with the config.pbtxt
it generated, and its instances are proxies in the callable backend that send each batch over
the connection and turn the answers back into results. The callable backend therefore checks
and converts remote results exactly as it does local ones.

Connections and proxies live on the callable backend's async loop; loading and unloading run on
the server's own loop. A connection that ends (the process exited, crashed or stopped) unloads
its models; calls in flight on it fail with an error naming the process. Other models, local or
bound by other processes, are not touched. On in Triton() unless its config turns it off; in
`kernel serve` only with --allow-remote-binding.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any, AsyncIterator, Dict, List, Optional

import numpy as np
from google.protobuf import text_format

from kernel.backends.callable import BoundModel, CallableBackend
from kernel.core.errors import KernelError
from kernel.core.server import Server
from kernel.protos import model_config_pb2
from kernel.proxy import remote as proto
from kernel.proxy import remote_socket as place

log = logging.getLogger("kernel.remote")


class RemoteCallableError(RuntimeError):
    """The callable in the binding process raised, or the process went away."""


@dataclasses.dataclass(frozen=True)
class _Output:
    name: str
    dtype: Any
    shape: tuple


_LOST = object()


class _Connection:
    """One binding process: its models and its calls in flight."""

    def __init__(self, service: "RemoteBindingService", reader, writer, pid: int):
        self.service = service
        self.reader = reader
        self.writer = writer
        self.pid = pid
        self.models: Dict[str, int] = {}  # name -> version
        self.calls: Dict[int, asyncio.Queue] = {}
        self.ids = itertools.count(1)
        self.lock = asyncio.Lock()
        self.open = True

    async def send(self, message: proto.Message) -> None:
        if not self.open:
            raise RemoteCallableError(self._gone())
        async with self.lock:
            self.writer.write(proto.frame(message))
            await self.writer.drain()

    def _gone(self) -> str:
        return f"the process that bound this model (pid {self.pid}) has disconnected"

    async def call(self, name: str, instance: int, requests: list) -> AsyncIterator[list]:
        """Run one batch in the binding process; yields each list of results it sends back."""
        call = next(self.ids)
        answers: asyncio.Queue = asyncio.Queue()
        self.calls[call] = answers
        ended = False
        try:
            batch = [
                proto.RequestData({k: proto.to_array(v) for k, v in r.data.items()}, dict(r.parameters or {}),
                                  r.requested_output_names)
                for r in requests
            ]
            await self.send(proto.Infer(call, name, instance, batch))
            while True:
                answer = await answers.get()
                ended = answer is _LOST or isinstance(answer, (proto.Done, proto.Failed))
                if answer is _LOST:
                    raise RemoteCallableError(self._gone())
                if isinstance(answer, proto.Done):
                    return
                if isinstance(answer, proto.Failed):
                    raise RemoteCallableError(answer.message)
                yield [{k: proto.from_array(a, writable=False) for k, a in item.items()} for item in answer.responses]
        finally:
            self.calls.pop(call, None)
            if not ended and self.open:
                # Closed early (the backend stops reading a stream whose requests were all cancelled):
                # let the binding process stop its callable too.
                task = asyncio.ensure_future(self._cancel(call))
                self.service.background(task)

    async def _cancel(self, call: int) -> None:
        try:
            await self.send(proto.Cancel(call))
        except (RemoteCallableError, ConnectionError):
            pass

    def deliver(self, message) -> None:
        answers = self.calls.get(message.call)
        if answers is not None:
            answers.put_nowait(message)

    def lost(self) -> None:
        self.open = False
        for answers in self.calls.values():
            answers.put_nowait(_LOST)


def _proxy(connection: _Connection, name: str, instance: int, decoupled: bool):
    """The callable the backend runs for one instance: forwards each batch to the binding process."""
    if decoupled:
        async def stream(requests):
            async for results in connection.call(name, instance, requests):
                yield results

        return stream

    async def single(requests):
        out = None
        async for results in connection.call(name, instance, requests):
            if out is not None:
                raise RemoteCallableError(f"the inference callable of model '{name}' is not decoupled, so it must "
                                          "produce exactly one list of responses; it produced more")
            out = results
        return out

    return single


class RemoteBindingService:
    """The Unix socket binding processes dial, and the models they bind."""

    def __init__(self, server: Server, backend: CallableBackend, store: Path, ports: List[int]):
        self.server = server
        self.backend = backend
        self.store = Path(store)
        self.ports = [p for p in ports if p]
        self.paths: List[Path] = []
        self.uid = os.getuid()  # the only user whose processes may bind
        self._folder: Optional[Path] = None  # a fresh folder of ours, removed at close
        self._listener: Optional[asyncio.AbstractServer] = None
        self._front: Optional[asyncio.AbstractEventLoop] = None
        self._connections: set = set()
        self._tasks: set = set()
        self._closing = False

    # ---- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """On the server's loop: listen on the socket for each of the server's ports."""
        self._front = asyncio.get_running_loop()
        self.backend.runner.ensure_started()
        await self._on(self.backend.runner.loop, self._listen())

    async def _listen(self) -> None:
        folder, fresh = await asyncio.to_thread(place.server_folder)
        if fresh:
            self._folder = folder
        main = folder / place.socket_name(self.ports[0])
        await asyncio.to_thread(_clear_stale, main)
        self._listener = await asyncio.start_unix_server(self._serve, path=str(main))
        os.chmod(main, 0o600)
        self.paths.append(main)
        for port in self.ports[1:]:
            alias = folder / place.socket_name(port)
            await asyncio.to_thread(_clear_stale, alias)
            alias.symlink_to(main.name)
            self.paths.append(alias)
        self.store.mkdir(parents=True, exist_ok=True)
        log.info("Remote binding enabled: processes of uid %d on this host may bind models through %s",
                 self.uid, main)

    def background(self, task: asyncio.Future) -> None:
        """Keep a fire-and-forget task referenced until it is done."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stop_listening(self) -> None:
        """The server is about to stop: connections that end from now on leave unloading to it."""
        self._closing = True

    def close(self, timeout: float = 10.0) -> None:
        """From any thread but the runner's: stop listening, drop every connection (the server is stopping)."""
        self._closing = True
        loop = self.backend.runner.loop
        if loop is None or loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._close(), loop).result(timeout)
        except Exception:  # noqa: BLE001 - the server stops all the same
            log.exception("closing the remote binding socket failed")

    async def _close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for path in self.paths:
            try:
                path.unlink()
            except OSError:
                pass
        if self._folder is not None:
            try:
                self._folder.rmdir()
            except OSError:
                pass
        for connection in list(self._connections):
            connection.lost()
            connection.writer.close()

    @staticmethod
    async def _on(loop: asyncio.AbstractEventLoop, coroutine):
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, loop))

    # ---- one binding process --------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:  # before reading anything: another user's process gets nothing, not even an error frame
            place.check_peer(writer.get_extra_info("socket"), self.uid, "a remote-binding connection")
        except place.PeerRefused as exc:
            log.warning("Refused a remote-binding connection: %s", exc)
            writer.close()
            return
        try:
            hello = await _read(reader)
        except Exception:  # noqa: BLE001 - not a binding process (or not one of this version)
            writer.close()
            return
        if not isinstance(hello, proto.Hello) or hello.protocol != proto.PROTOCOL_VERSION:
            writer.write(proto.frame(proto.Welcome(error=f"expected protocol {proto.PROTOCOL_VERSION}")))
            writer.close()
            return
        connection = _Connection(self, reader, writer, hello.pid)
        self._connections.add(connection)
        await connection.send(proto.Welcome())
        log.info("Remote binding process pid %d connected", hello.pid)
        tasks: set = set()
        try:
            while True:
                message = await _read(reader)
                if isinstance(message, (proto.Result, proto.Done, proto.Failed)):
                    connection.deliver(message)
                elif isinstance(message, (proto.Bind, proto.Unbind)):
                    handle = self._bind if isinstance(message, proto.Bind) else self._unbind
                    task = asyncio.ensure_future(handle(connection, message))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the process ended or closed the connection
        except Exception:  # noqa: BLE001 - a peer sending garbage loses its connection, nothing more
            log.exception("remote binding process pid %d sent a frame that cannot be read", hello.pid)
        finally:
            connection.lost()
            self._connections.discard(connection)
            writer.close()
            if connection.models and not self._closing:
                log.warning("Remote binding process pid %d disconnected; unloading its models: %s",
                            hello.pid, ", ".join(sorted(connection.models)))
                for name in list(connection.models):
                    await self._remove(connection, name)

    async def _bind(self, connection: _Connection, message: proto.Bind) -> None:
        error = None
        try:
            error = await self._load(connection, message)
        except Exception as exc:  # noqa: BLE001 - reported to the binding process
            log.exception("remote bind of model '%s' failed", message.name)
            error = f"{type(exc).__name__}: {exc}"
        try:
            await connection.send(proto.Answer(message.name, error))
        except (RemoteCallableError, ConnectionError):
            pass

    async def _load(self, connection: _Connection, message: proto.Bind) -> Optional[str]:
        name, version = message.name, message.version
        problem = _check_bind(message)
        if problem is not None:
            return problem
        entry = self.server.registry.entries.get(name)
        if entry is not None and entry.state.name != "UNAVAILABLE":
            # As in PyTriton (whose remote bind loads a new config over the model of that name):
            # the model served under this name is replaced, whoever bound it.
            if entry.state.name != "READY":
                return f"model '{name}' is {entry.state.name.lower()}; bind it again once it is done"
            try:
                await self._on(self._front, self.server.control.unload_from_path(name))
            except KernelError as exc:
                return exc.message
            for other in self._connections:
                other.models.pop(name, None)  # its exit must not unload the model bound now
            log.warning("Model '%s' is replaced by the one remote process pid %d binds", name, connection.pid)
        folder = self.store / name
        await asyncio.to_thread(_write_model, folder, version, message.config_pbtxt)
        outputs = [_Output(o[0], np.dtype(o[1]), tuple(o[2])) for o in message.outputs]
        proxies = [_proxy(connection, name, i, message.decoupled) for i in range(max(1, message.instances))]
        self.backend.register(BoundModel(
            name=name, version=version, callables=proxies, outputs=outputs, batching=message.batching,
            decoupled=message.decoupled, strict=message.strict,
        ))
        connection.models[name] = version
        try:
            await self._on(self._front, self.server.control.load_from_path(name, folder))
        except BaseException as exc:
            connection.models.pop(name, None)
            self.backend.unregister(name, version)
            await asyncio.to_thread(shutil.rmtree, folder, True)
            if isinstance(exc, KernelError):
                return exc.message
            raise
        if not connection.open:  # the process went away while its model loaded
            await self._remove(connection, name)
            return None
        log.info("Model '%s' version %d bound by remote process pid %d", name, version, connection.pid)
        return None

    async def _unbind(self, connection: _Connection, message: proto.Unbind) -> None:
        error = None
        if message.name not in connection.models:
            error = f"model '{message.name}' is not bound by this process"
        else:
            error = await self._remove(connection, message.name)
        try:
            await connection.send(proto.Answer(message.name, error))
        except (RemoteCallableError, ConnectionError):
            pass

    async def _remove(self, connection: _Connection, name: str) -> Optional[str]:
        version = connection.models.pop(name, None)
        if version is None:
            return None
        error = None
        if not self.server.stopping:
            try:
                await self._on(self._front, self.server.control.unload_from_path(name))
            except KernelError as exc:
                error = exc.message
        self.backend.unregister(name, version)
        await asyncio.to_thread(shutil.rmtree, self.store / name, True)
        log.info("Model '%s' of remote process pid %d unloaded", name, connection.pid)
        return error


_MODEL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")


def _check_bind(message: proto.Bind) -> Optional[str]:
    """What the server will not take from a binding process, whatever its own checks did: a name that
    is not a plain folder name, or a config that asks for anything but the callable backend."""
    if not _MODEL_NAME.match(message.name) or message.name in (".", ".."):
        return f"invalid model name {message.name!r}"
    if not 0 <= message.version < 2**63:
        return f"invalid model version {message.version}"
    try:
        config = text_format.Parse(message.config_pbtxt, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        return f"invalid model configuration: {exc}"
    if config.backend not in ("", "python") or config.platform or config.name not in ("", message.name):
        return "a bound model's configuration must name the model and the python backend only"
    if "EXECUTION_ENV_PATH" in config.parameters:
        return "a bound model cannot set EXECUTION_ENV_PATH"
    return None


async def _read(reader: asyncio.StreamReader) -> proto.Message:
    header = await reader.readexactly(proto.HEADER_BYTES)
    body = await reader.readexactly(proto.frame_length(header))
    return proto.decode(body)


def _write_model(folder: Path, version: int, config_pbtxt: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    (folder / str(version)).mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config_pbtxt)


def _clear_stale(path: Path) -> None:
    """Remove a socket left by a server that is gone; refuse to take one a live server answers on."""
    if not os.path.lexists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()
        return
    finally:
        probe.close()
    raise OSError(f"another server already accepts remote binding on {path}")


async def start_remote_binding(server: Server, backend: CallableBackend, store: Path,
                               ports: List[int]) -> RemoteBindingService:
    """On the server's loop: open the remote binding socket for a server that has `backend` installed."""
    service = RemoteBindingService(server, backend, store, ports)
    try:
        await service.start()
    except BaseException:
        await asyncio.to_thread(service.close)  # no socket left listening for a server that has none
        raise
    return service


class RemoteBindingHost:
    """`kernel serve --allow-remote-binding=true`: the callable backend (installed before the
    server starts, so model.py models still go to the Python backend through it) and the socket."""

    def __init__(self, server: Server, args):
        from kernel.serve.bound import install_callable_backend

        self.server = server
        self.ports = [args.http_port if args.allow_http else None, args.grpc_port if args.allow_grpc else None]
        self.backend = install_callable_backend(server, [])
        self.store = Path(tempfile.mkdtemp(prefix="kernel-remote-models-"))
        self.service: Optional[RemoteBindingService] = None

    async def start(self) -> None:
        """After the transports: open the socket."""
        self.service = await start_remote_binding(self.server, self.backend, self.store, self.ports)

    def stop_listening(self) -> None:
        if self.service is not None:
            self.service.stop_listening()

    async def close(self) -> None:
        """After the server has stopped: drop the connections, stop the callables' loop, remove the store."""
        if self.service is not None:
            await asyncio.to_thread(self.service.close)
        await asyncio.to_thread(self.backend.close)
        await asyncio.to_thread(shutil.rmtree, self.store, True)


def remote_binding_host(server: Server, args) -> Optional[RemoteBindingHost]:
    """The remote-binding host for a `kernel serve` server built from `args`, or None when it is off."""
    return RemoteBindingHost(server, args) if getattr(args, "allow_remote_binding", False) else None

"""RemoteTriton: bind callables into a Kernel server running in another process on this host.

    with RemoteTriton(url="localhost:8000") as remote:
        remote.bind(model_name="Mul", infer_func=mul, inputs=[...], outputs=[...])
        remote.serve()

As in PyTriton's remote mode, the callables run in this process and the models are served by the
server at `url` for as long as this object is connected; they are unloaded when it stops (or the
process dies). A Triton() allows it unless its config says allow_remote_binding=False, as
PyTriton's does; `kernel serve` only with --allow-remote-binding=true. Only processes of the same
user on the same host can bind: the connection is a Unix socket in a folder private to the user
(kernel.proxy.remote_socket), whose other end must run as the same user, so `url` must name this
host. The url's port only says which server: nothing of the binding is sent to it.
"""

from __future__ import annotations

import atexit
import ipaddress
import logging
import pathlib
import signal
import socket
import threading
import time
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Union

from kernel.client.exceptions import PyTritonClientTimeoutError
from kernel.client.url import TritonUrl
from kernel.client.warnings import NotSupportedTimeoutWarning
from kernel.decorators import TritonContext
from kernel.exceptions import PyTritonInvalidOperationError, PyTritonModelConfigError
from kernel.model_config.model_config import ModelConfig
from kernel.model_config.tensor import Tensor
from kernel.proxy import remote as proto
from kernel.proxy import remote_socket as place
from kernel.remote.link import Link, LinkError, NotOurServer
from kernel.triton_model import BoundCallables, validate_model_name
from kernel.workspace import Workspace

LOGGER = logging.getLogger("kernel.triton")

MONITORING_PERIOD_S = 10.0
SERVER_READY_TIMEOUT_S = 120.0  # PyTriton waits this long for the server at connect()
LOAD_TIMEOUT_S = 300.0
UNLOAD_TIMEOUT_S = 30.0
SOCKET_GRACE_S = 3.0
MODEL_URL = "/v2/models/{model_name}"


class RemoteTriton:
    """Serves callables bound here as models of the Kernel server at `url` (same host)."""

    def __init__(self, url: str, workspace: Union[Workspace, str, pathlib.Path, None] = None,
                 access_token: Optional[str] = None):
        self._url = TritonUrl.from_url(url)  # PyTritonClientInvalidUrlError, as PyTriton
        self._access_token = access_token
        self._workspace = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
        self._triton_context = TritonContext()
        self._models: Dict[str, BoundCallables] = {}
        self._cv = threading.Condition()
        self._link: Optional[Link] = None
        self._connected = False
        self._stopped = False
        self._fatal: Optional[BaseException] = None
        atexit.register(self.stop)

    def __enter__(self) -> "RemoteTriton":
        try:
            self.connect()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_) -> None:
        self.stop()

    # ---- binding ------------------------------------------------------------------------------------

    def bind(
        self,
        model_name: str,
        infer_func: Union[Callable, Sequence[Callable]],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        model_version: int = 1,
        config: Optional[ModelConfig] = None,
        strict: bool = False,
        trace_config: Optional[List[str]] = None,
    ) -> None:
        """Serve infer_func as model `model_name` on the server; once connected, returns when it is ready."""
        validate_model_name(model_name)
        if trace_config is not None:
            LOGGER.warning("bind(trace_config=...) is not supported by Kernel; use TritonConfig.trace_config")
        model = BoundCallables(model_name, model_version, infer_func, inputs, outputs, config, strict,
                               self._workspace.path)
        with self._cv:
            if model_name in self._models:
                raise PyTritonInvalidOperationError("Cannot add model with the same name twice.")
            self._models[model_name] = model
        model.inject_context(self._triton_context)
        if self.is_connected():
            try:
                self._bind_remote(model)
            except BaseException:
                with self._cv:
                    self._models.pop(model_name, None)
                raise

    def _bind_remote(self, model: BoundCallables) -> None:
        link = self._link
        if link is None:
            raise PyTritonInvalidOperationError("RemoteTriton is not connected to a server")
        folder = model.write(self._workspace.model_store_path)
        c = model.triton_model_config
        message = proto.Bind(
            name=model.model_name, version=model.model_version,
            config_pbtxt=(folder / "config.pbtxt").read_text(),
            outputs=[[o.name, _dtype_str(o.dtype), list(o.shape)] for o in (c.outputs or [])],
            batching=c.batching, decoupled=c.decoupled, strict=model.strict, instances=len(model.infer_functions),
        )
        link.add_callables(model.model_name, model.infer_functions)
        error = link.request(message, model.model_name, LOAD_TIMEOUT_S)
        if error is not None:
            link.remove_callables(model.model_name)
            raise PyTritonModelConfigError(f"The server did not load model '{model.model_name}': {error}")
        url = MODEL_URL.format(model_name=model.model_name)
        LOGGER.info("Infer function available as model: `%s`", url)
        LOGGER.info("  Status:         `GET  %s/ready/`", url)
        LOGGER.info("  Model config:   `GET  %s/config/`", url)
        LOGGER.info("  Inference:      `POST %s/infer/`", url)

    # ---- connecting and serving -----------------------------------------------------------------------

    def connect(self) -> None:
        """Wait for the server, open the binding connection and serve the models bound so far."""
        with self._cv:
            if self._connected:
                return
            if self._stopped:
                raise PyTritonInvalidOperationError("RemoteTriton was stopped; create a new one")
        _check_same_host(self._url)
        link = self._dial(grace_s=0.0)  # a server of ours already up: no need to ask the port anything
        if link is None:
            self._wait_for_server()
            link = self._dial(grace_s=SOCKET_GRACE_S)
        with self._cv:
            self._link = link
            models = list(self._models.values())
        for model in models:
            self._bind_remote(model)
        with self._cv:
            self._connected = True

    def _wait_for_server(self) -> None:
        """As PyTriton: wait up to SERVER_READY_TIMEOUT_S for the server at the url to be ready. Nothing
        of the binding goes this way: whoever answers on the port, the models go over the socket."""
        from kernel.client.utils import create_client_from_url, wait_for_server_ready  # tritonclient: load late
        headers = {"triton-access-token": self._access_token} if self._access_token else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotSupportedTimeoutWarning)  # gRPC: nothing to bound here
            client = create_client_from_url(self._url.with_scheme)
        try:
            wait_for_server_ready(client, timeout_s=SERVER_READY_TIMEOUT_S, headers=headers)
        except PyTritonClientTimeoutError as exc:
            raise TimeoutError("Triton Inference Server is not ready after timeout.") from exc
        finally:
            client.close()

    def _dial(self, grace_s: float) -> Optional[Link]:
        """Connect to the binding socket of this user's server with the url's port (a server answers
        ready a moment before it opens it, hence the grace). Only sockets in this user's private
        folders are tried, and only one whose listening process runs as this user is kept. None when
        there is none and grace_s is 0."""
        port = self._url.port
        deadline = time.monotonic() + grace_s
        while True:
            problems = []
            for path in place.candidate_sockets(port):
                try:
                    return Link(path, on_lost=self._on_lost, on_unrecoverable=self._on_unrecoverable)
                except NotOurServer as exc:
                    problems.append(f"refused {path}: {exc}")
                except LinkError as exc:
                    problems.append(str(exc))  # a socket left by a server that is gone
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        if not grace_s:
            return None
        where = "; ".join(problems) or f"no socket for port {port} in this user's private folders"
        raise PyTritonInvalidOperationError(
            f"The server at {self._url.with_scheme} does not accept remote binding ({where}). A Triton() started "
            "by this user on this host accepts it unless TritonConfig(allow_remote_binding=False) turns it off; "
            "`kernel serve` needs --allow-remote-binding=true"
        )

    def serve(self, monitoring_period_s: float = MONITORING_PERIOD_S) -> None:
        """Serve until Ctrl-C, SIGTERM, stop() from another thread, or the server going away."""
        terminated = threading.Event()
        restore = _on_sigterm(lambda: _notify_from_thread(self._cv, terminated))
        try:
            try:
                self.connect()
                with self._cv:
                    while self.is_alive() and not terminated.is_set():
                        self._cv.wait(timeout=monitoring_period_s)
            except KeyboardInterrupt:
                LOGGER.info("SIGINT received, exiting.")
            self.stop()
        finally:
            restore()

    def stop(self) -> bool:
        """Unbind every model (the server unloads them), close the connection, remove the workspace."""
        with self._cv:
            if self._stopped:
                return False
            self._stopped = True
            self._connected = False
            link, self._link = self._link, None
            models = list(self._models)
        atexit.unregister(self.stop)
        if link is not None:
            if link.alive:
                for name in models:
                    error = link.request(proto.Unbind(name), name, UNLOAD_TIMEOUT_S)
                    if error is not None:
                        LOGGER.debug("unbinding model '%s': %s", name, error)
            link.close()
        self._workspace.clean()
        with self._cv:
            self._cv.notify_all()
        return True

    def is_alive(self) -> bool:
        """Connected, the server still there, and no callable raised PyTritonUnrecoverableError."""
        link = self._link
        if link is None:
            # As PyTriton: before connect() it is alive while no bound model waits to be served.
            with self._cv:
                return not self._stopped and not self._models
        return link.alive and self._fatal is None

    def is_connected(self) -> bool:
        with self._cv:
            return self._connected

    # ---- events from the connection's threads ---------------------------------------------------------

    def _on_lost(self) -> None:
        LOGGER.info("The connection to the server at %s ended", self._url.with_scheme)
        _notify_from_thread(self._cv, None)

    def _on_unrecoverable(self, exc: BaseException) -> None:
        LOGGER.error("Unrecoverable error in an inference callable; unbinding this process's models: %s", exc)
        self._fatal = exc
        threading.Thread(target=self.stop, name="kernel-remote-stop", daemon=True).start()


def _dtype_str(dtype) -> str:
    import numpy as np

    return np.dtype(dtype).str


def _check_same_host(url: TritonUrl) -> None:
    """Remote binding goes through a Unix socket: the url must name this host (a loopback address)."""
    try:
        infos = socket.getaddrinfo(url.hostname, url.port, type=socket.SOCK_STREAM)
        addresses = {info[4][0] for info in infos}
        loopback = bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)
    except (OSError, ValueError):
        loopback = False
    if not loopback:
        raise PyTritonInvalidOperationError(
            f"RemoteTriton binds into a server on this host only; {url.hostname} is not a loopback address "
            "(use localhost)"
        )


def _notify_from_thread(cv: threading.Condition, event: Optional[threading.Event]) -> None:
    """Wake serve(); from a new thread, since the caller (a signal handler) may hold the condition."""
    if event is not None:
        event.set()

    def notify():
        with cv:
            cv.notify_all()

    threading.Thread(target=notify, daemon=True).start()


def _on_sigterm(callback: Callable[[], None]) -> Callable[[], None]:
    """While serve() blocks the main thread, SIGTERM stops it gracefully (when left at its default)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    try:
        previous = signal.getsignal(signal.SIGTERM)
        if previous is not signal.SIG_DFL:
            return lambda: None
        signal.signal(signal.SIGTERM, lambda *_: callback())
    except (ValueError, OSError):
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, previous)

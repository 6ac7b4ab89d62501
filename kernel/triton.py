"""PyTriton's server-side API on Kernel (`pytriton.triton` -> `kernel.triton`).

    with Triton(config=TritonConfig(http_port=8000)) as triton:
        triton.bind(model_name="AddSub", infer_func=infer, inputs=[...], outputs=[...],
                    config=ModelConfig(max_batch_size=64))
        triton.serve()

Where PyTriton starts a tritonserver process and relays every batch to the
callable over sockets, Triton() here runs the Kernel server inside the calling
process, on a background thread with its own event loop. Bound models are
written to a model store in the workspace (config.pbtxt as PyTriton generates
it) and served by the in-process callable backend, registered as "python", so
their configuration reads as PyTriton's; model.py models in the same store or
in TritonConfig.model_repository are served by the Python backend as usual.
"""

from __future__ import annotations

import atexit
import logging
import pathlib
import signal
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from kernel.decorators import TritonContext
from kernel.core.errors import KernelError
from kernel.exceptions import (
    PyTritonInvalidOperationError,
    PyTritonModelConfigError,
    PyTritonRuntimeError,
    PyTritonValidationError,
)
from kernel.model_config.model_config import ModelConfig
from kernel.model_config.tensor import Tensor
from kernel.remote import RemoteTriton
from kernel.triton_config import (
    DEFAULT_PROTECTED_ENDPOINTS,
    DefaultTritonLifecyclePolicy,
    TRITON_ACCESS_HEADER,
    TritonConfig,
    TritonLifecyclePolicy,
    TritonSecurityConfig,
    VALID_TRITON_ENDPOINTS,
    VertextAILifecyclePolicy,
    merged_config,
    server_argv,
)
from kernel.triton_model import BoundCallables, validate_model_name
from kernel.workspace import Workspace

__all__ = [
    "DEFAULT_PROTECTED_ENDPOINTS", "DefaultTritonLifecyclePolicy", "MONITORING_PERIOD_S", "RemoteTriton",
    "TRITON_ACCESS_HEADER", "Triton", "TritonConfig", "TritonLifecyclePolicy", "TritonSecurityConfig",
    "VALID_TRITON_ENDPOINTS", "VertextAILifecyclePolicy",
]

LOGGER = logging.getLogger("kernel.triton")

MONITORING_PERIOD_S = 10.0
MODEL_URL = "/v2/models/{model_name}"


class Triton:
    """A Kernel server in this process, serving the callables bound to it."""

    def __init__(
        self,
        *,
        config: Optional[TritonConfig] = None,
        workspace: Union[Workspace, str, pathlib.Path, None] = None,
        triton_lifecycle_policy: Optional[TritonLifecyclePolicy] = None,
        security_config: Optional[TritonSecurityConfig] = None,
    ):
        if triton_lifecycle_policy is None:
            vertex = config is not None and config.allow_vertex_ai
            triton_lifecycle_policy = VertextAILifecyclePolicy if vertex else DefaultTritonLifecyclePolicy
        self._lifecycle = triton_lifecycle_policy
        self._config = merged_config(config)
        self._security_config = security_config or TritonSecurityConfig()
        self._workspace = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
        self._triton_context = TritonContext()
        self._models: Dict[Tuple[str, int], BoundCallables] = {}
        self._cv = threading.Condition()
        self._runtime = None  # kernel.serve.inprocess.InProcessServer once started
        self._backend = None  # kernel.backends.callable.CallableBackend of the running server
        self._remote = None  # kernel.serve.remote.RemoteBindingService when remote binding is allowed
        self._stopped = True
        self._connected = False
        self._fatal: Optional[BaseException] = None  # what a callable raised as PyTritonUnrecoverableError
        self._log_verbose = self._config.log_verbose or 0
        atexit.register(self.stop)

    # ---- context manager -------------------------------------------------------------------------

    def __enter__(self) -> "Triton":
        if self._lifecycle.launch_triton_on_startup:
            try:
                self._run_server()
                self.connect()
            except BaseException:
                self.stop()  # __exit__ will not run: leave no workspace behind
                raise
        return self

    def __exit__(self, *_) -> None:
        self.stop()

    # ---- binding ---------------------------------------------------------------------------------

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
        """Serve infer_func (or one callable per instance) as model `model_name`.

        Before run() the model is served once the server starts; after it, it is
        loaded at once and this returns when it is ready.
        """
        validate_model_name(model_name)
        if trace_config is not None:
            LOGGER.warning("bind(trace_config=...) is not supported by Kernel; use TritonConfig.trace_config")
        model = BoundCallables(model_name, model_version, infer_func, inputs, outputs, config, strict,
                               self._workspace.path)
        key = (model_name.lower(), model_version)
        with self._cv:
            if key in self._models:
                raise PyTritonInvalidOperationError("Cannot add model with the same name twice.")
            self._models[key] = model
        model.inject_context(self._triton_context)
        model.write(self._workspace.model_store_path)
        if self.is_connected():
            try:
                self._load(model)
            except BaseException:
                with self._cv:
                    self._models.pop(key, None)
                model.remove(self._workspace.model_store_path)
                raise

    def _bound_model(self, model: BoundCallables):
        from kernel.serve.bound import BoundModel

        c = model.triton_model_config
        return BoundModel(
            name=model.model_name, version=model.model_version, callables=model.infer_functions,
            outputs=c.outputs or [], batching=c.batching, decoupled=c.decoupled, strict=model.strict,
            on_unrecoverable=self._on_unrecoverable,
        )

    def _load(self, model: BoundCallables) -> None:
        model.warmup()
        self._backend.register(self._bound_model(model))
        folder = self._workspace.model_store_path / model.model_name
        try:
            self._runtime.call(self._runtime.server.control.load_from_path(model.model_name, folder))
        except KernelError as exc:
            self._backend.unregister(model.model_name, model.model_version)
            raise PyTritonModelConfigError(exc.message) from None
        self._log_model(model)

    # ---- running ---------------------------------------------------------------------------------

    def run(self) -> None:
        """Start the server (if it is not running) and serve the bound models in the background."""
        self._run_server()
        self.connect()

    def serve(self, monitoring_period_s: float = MONITORING_PERIOD_S) -> None:
        """Run the server and block until it stops (Ctrl-C, stop() from another thread, or a fatal error)."""
        terminated = threading.Event()
        restore = _on_sigterm(lambda: self._wake(terminated))
        try:
            # Ctrl-C may come as soon as the models answer ready, before the wait below.
            try:
                self._run_server()
                self.connect()
                LOGGER.info("Serving until SIGINT (Ctrl-C) or SIGTERM.")
                with self._cv:
                    while self.is_alive() and not terminated.is_set():
                        self._cv.wait(timeout=monitoring_period_s)
            except KeyboardInterrupt:
                LOGGER.info("SIGINT received, exiting.")
            if terminated.is_set():
                LOGGER.info("SIGTERM received, exiting.")
            self.stop()
        finally:
            restore()

    def _wake(self, event: threading.Event) -> None:
        event.set()
        # The handler runs on the main thread, which may hold the condition: notify from another one.
        threading.Thread(target=self._notify, daemon=True).start()

    def _notify(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def connect(self) -> None:
        """Load the models bound so far (the server must be running)."""
        with self._cv:
            if self._connected:
                return
            if self._runtime is None or not self._runtime.is_alive():
                raise PyTritonInvalidOperationError("The server is not running; call run() or serve() first.")
            self._connected = True
            for model in self._models.values():
                self._log_model(model)

    def stop(self) -> bool:
        """Stop serving (in-flight requests finish, within exit_timeout_secs) and remove the workspace."""
        with self._cv:
            if self._stopped:
                if self._runtime is None:
                    # Never started (or failed to): its workspace still goes.
                    atexit.unregister(self.stop)
                    self._workspace.clean()
                return False
            self._stopped = True
            self._connected = False
        atexit.unregister(self.stop)
        runtime, self._runtime = self._runtime, None
        remote, self._remote = self._remote, None
        if remote is not None:
            remote.stop_listening()
        if runtime is not None:
            runtime.stop()
        if remote is not None:
            remote.close()  # the binding processes see the connection end
        if self._backend is not None:
            self._backend.close()
            self._backend = None
        self._workspace.clean()
        with self._cv:
            self._cv.notify_all()
        LOGGER.debug("Stopped the server")
        return True

    def is_alive(self) -> bool:
        """The server runs and every instance of every bound model can take requests."""
        runtime = self._runtime
        if runtime is None or not runtime.is_alive() or self._fatal is not None:
            return False
        backend = self._backend
        for model in list(self._models.values()):
            bound = backend.bound(model.model_name, model.model_version) if backend is not None else None
            if bound is not None and bound.instances and not all(i.healthy for i in bound.instances):
                return False
        return True

    def is_connected(self) -> bool:
        with self._cv:
            return self._connected

    def get_access_token(self) -> Optional[str]:
        """The token that restricted endpoints require in header `triton-access-token`."""
        return self._security_config.access_token

    # ---- internals ---------------------------------------------------------------------------------

    def _run_server(self) -> None:
        if self._runtime is not None and self._runtime.is_alive():
            return
        from kernel.serve.bound import install_callable_backend
        from kernel.serve.inprocess import InProcessServer, ServerArgumentError, parse_args
        from kernel.core.server import StartupError

        argv = server_argv(self._config, self._workspace.model_store_path, self._security_config)
        try:
            args = parse_args(argv)
        except ServerArgumentError as exc:
            raise PyTritonValidationError(f"Invalid TritonConfig: {exc}") from None
        if self._log_verbose > 0:
            LOGGER.warning("The server runs with verbose logs (log_verbose=%d); this may affect performance.",
                           self._log_verbose)
        with self._cv:
            models = list(self._models.values())
        for model in models:
            model.warmup()
        backend_holder = []

        def install_backend(server) -> None:
            backend_holder.append(install_callable_backend(server, [self._bound_model(m) for m in models]))

        runtime = InProcessServer(args, prepare=install_backend)
        try:
            runtime.start()
        except (StartupError, OSError) as exc:
            if backend_holder:
                backend_holder[0].close()
            message, models_failed = self._startup_failure(runtime, exc)
            raise (PyTritonModelConfigError if models_failed else PyTritonRuntimeError)(message) from None
        except KeyboardInterrupt:
            # Ctrl-C while starting: nothing may keep serving behind the caller's back.
            runtime.stop()
            if backend_holder:
                backend_holder[0].close()
            raise
        self._runtime = runtime
        self._backend = backend_holder[0]
        with self._cv:
            self._stopped = False
            self._fatal = None
        if self._config.allow_remote_binding is not False:
            self._start_remote_binding(runtime, required=self._config.allow_remote_binding is True)

    def _start_remote_binding(self, runtime, required: bool) -> None:
        """Open the socket RemoteTriton processes of this user dial (named after the HTTP and gRPC ports).

        On unless the config turns it off, as PyTriton's Triton() takes remote binds from the start: only
        processes of this user on this host can reach the socket (kernel.proxy.remote_socket). When it
        was not asked for explicitly, failing to open it leaves the server serving without it."""
        from kernel.serve.remote import start_remote_binding

        args = runtime.args
        ports = [args.http_port if args.allow_http else None, args.grpc_port if args.allow_grpc else None]
        store = self._workspace.path / "remote-models"
        try:
            self._remote = runtime.call(start_remote_binding(runtime.server, self._backend, store, ports), 30)
        except OSError as exc:
            if not required:
                LOGGER.warning("Remote binding is not available (RemoteTriton cannot bind into this server): %s", exc)
                return
            self.stop()
            raise PyTritonRuntimeError(f"Remote binding cannot be enabled: {exc}") from None

    @staticmethod
    def _startup_failure(runtime, exc: Exception) -> Tuple[str, bool]:
        """The message for a failed start, and whether bound models failed to load."""
        server = runtime.server
        reasons = []
        if server is not None:
            for name, entry in sorted(server.registry.entries.items()):
                if entry.reason:
                    reasons.append(f"model '{name}': {entry.reason}")
        return f"The server could not start: {exc}" + ("; " + "; ".join(reasons) if reasons else ""), bool(reasons)

    def _on_unrecoverable(self, exc: BaseException) -> None:
        """A callable raised PyTritonUnrecoverableError: stop serving (from another thread, as PyTriton)."""
        LOGGER.error("Unrecoverable error in an inference callable; stopping the server: %s", exc)
        # Not alive from now on (before the error reaches the client), as PyTriton's model turns dead
        # before it answers; serve() wakes when stop() notifies.
        self._fatal = exc
        threading.Thread(target=self.stop, name="kernel-triton-stop", daemon=True).start()

    def _log_model(self, model: BoundCallables) -> None:
        url = MODEL_URL.format(model_name=model.model_name)
        LOGGER.info("Infer function available as model: `%s`", url)
        LOGGER.info("  Status:         `GET  %s/ready/`", url)
        LOGGER.info("  Model config:   `GET  %s/config/`", url)
        LOGGER.info("  Inference:      `POST %s/infer/`", url)


def _on_sigterm(callback: Callable[[], None]) -> Callable[[], None]:
    """While serve() blocks the main thread, SIGTERM (docker stop, kill) stops serving gracefully.

    Only when the program left SIGTERM at its default; returns what restores it.
    """
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

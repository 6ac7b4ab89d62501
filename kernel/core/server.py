"""The server object: the registry of model versions, request submission, health, statistics,
and graceful shutdown.

Transports call into it (`submit`, health, metadata, config); backends are handed to it by name.
It imports neither, nor anything else above the core: what loads models (kernel.loading), traces
requests and keeps metrics (kernel.observe) is attached by whoever composes the server
(kernel.serve.compose), through the attributes set to None here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from kernel import __version__
from kernel.core.backend import Backend, ModelControlHandle
from kernel.core import classification
from kernel.core.cache import create_cache
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.holding import HeldBytes
from kernel.core.admission import Admission
from kernel.core.model import Model, ModelState
from kernel.core.registry import ModelRegistry
from kernel.core.request import InferRequest
from kernel.core.output_writes import OutputWrites
from kernel.core.shared_memory import RegionChange, SharedMemoryManager, take_device_inputs
from kernel.core.transport import Transport, TransportStartError

log = logging.getLogger("kernel.core.server")

# KServe v2 extensions this server speaks (reported by GET /v2), in tritonserver's order.
EXTENSIONS = [
    "classification", "sequence", "model_repository", "model_repository(unload_dependents)", "schedule_policy",
    "model_configuration", "system_shared_memory", "cuda_shared_memory", "binary_tensor_data", "parameters",
    "statistics", "trace", "logging",
]
# Seconds the last trace spans get at shutdown even when draining spent the exit timeout.
FINAL_EXPORT_S = 0.5


@dataclass
class ServerOptions:
    model_repositories: list[Path]
    server_id: str = "triton"
    exit_timeout_secs: float = 30.0
    strict_readiness: bool = True
    exit_on_error: bool = True
    disable_auto_complete_config: bool = False
    strict_model_config: bool = False
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    log_verbose: int = 0
    backend_directory: Optional[Path] = None  # where backends not built in are looked for
    metrics_config: dict[str, str] = field(default_factory=dict)  # --metrics-config (global group)
    # Model control (kernel/loading/control.py): --model-control-mode, --load-model,
    # --repository-poll-secs, --model-config-name.
    model_control_mode: str = "none"
    startup_models: list[str] = field(default_factory=list)
    repository_poll_secs: float = 15.0
    model_config_name: str = ""
    trace: Any = None  # --trace-config: kernel.observe.trace_settings.TraceConfig; None: tracing off
    log: Any = None  # --log-*: kernel.observe.log.LogSettings; None: defaults with log_verbose
    # --cache-config: {cache name: {setting: value}}; empty: no response cache (kernel.core.cache)
    cache_config: dict[str, dict[str, str]] = field(default_factory=dict)
    # What clients may make the server hold (kernel.core.holding): answers not yet read by their
    # clients and partial requests, each bounded in total, and a client that makes no progress for
    # the stall timeout is cut (--max-held-output-bytes, --max-held-input-bytes, --client-stall-timeout-secs).
    max_held_output_bytes: int = 1 << 30
    max_held_input_bytes: int = 1 << 30
    client_stall_timeout_secs: float = 60.0


class StartupError(Exception):
    """Start-up failed in a way that must stop the server (e.g. a model failed with --exit-on-error)."""


class Server:
    def __init__(self, options: ServerOptions, backends: dict[str, Backend]):
        self.options = options
        self.backends = backends
        for backend in backends.values():
            backend.attach(self)
        self.registry = ModelRegistry()
        # Model control modes, the repository API and poll mode (kernel.loading.control.ModelControl).
        self.control: Optional[ModelControlHandle] = None
        self.transports: list[Transport] = []
        self.live = False
        self.stopping = False
        # Requests are taken until the drain at shutdown is over, as tritonserver takes them while it
        # exits: the transports stop new connections and streams themselves, so what still arrives is
        # a request that was already on its way (an upload in progress, a BLS call of a draining model).
        self.accepting = True
        self._loaded = False
        # Ready only once every transport listens: a client that saw /v2/health/ready on HTTP
        # must find the gRPC port open too.
        self._listening = False
        self._addresses: dict[Transport, str] = {}  # transports started, with the address each listens on
        # Observability (kernel.observe): custom metric families that models create
        # (metrics.CustomMetrics), what --metrics-config turns on (metrics.MetricsConfig), the log
        # settings of the logging extension (log.LogSettings) and the request tracer (trace.Tracer).
        self.custom_metrics: Any = None
        self.metrics_config: Any = None
        self.log_settings: Any = None
        self.tracer: Any = None
        # Client shared-memory regions (system/CUDA shared-memory extensions), used by every transport.
        self.shared_memory = SharedMemoryManager()
        # Requests whose large shared-memory inputs are read beside the loop, and those behind them.
        self.admission = Admission(self._admit_read)
        # Outputs written into client regions, beside the loop when large (counted in flight meanwhile).
        self.output_writes = OutputWrites()
        # The response cache (--cache-config); models that enable response_cache use it.
        self.response_cache = create_cache(options.cache_config)
        # Bytes held for slow clients, every transport's connections together (kernel.core.holding).
        self.held_output = HeldBytes("answers waiting for slow clients", options.max_held_output_bytes,
                                     options.client_stall_timeout_secs)
        self.held_input = HeldBytes("request bytes from slow clients", options.max_held_input_bytes,
                                    options.client_stall_timeout_secs)
        # The other processes of a server with several fronts (kernel.core.peers.Peers), set by the
        # front that runs this core; None: this process is the whole server.
        self.peers: Any = None
        # Called with versions about to stop (retire_models), before their instances stop: a
        # supervisor of fronts lets every front drain them first (kernel.serve.fronts).
        self.before_retire: Any = None

    # ---- health and metadata ---------------------------------------------

    @property
    def ready(self) -> bool:
        if not self.live or not self._loaded or not self._listening or self.stopping:
            return False
        if self.peers is not None and not self.peers.ready:
            return False
        if not self.options.strict_readiness:
            return True
        for e in self.registry.entries.values():
            if e.unloaded:
                continue
            if e.state is ModelState.UNAVAILABLE:
                return False
            if not any(m.ready for m in e.versions.values()):
                return False
        return True

    def metadata(self) -> dict:
        return {"name": self.options.server_id, "version": __version__, "extensions": EXTENSIONS}

    def model(self, name: str, version: str = "") -> Model:
        return self.registry.get(name, version)

    async def model_ready(self, name: str, version: str = "") -> bool:
        """Loaded, with a live instance whose model (if it has is_ready) says it is ready."""
        try:
            model = self.registry.get(name, version)
        except KernelError:
            return False
        if not model.ready:
            return False
        if model.is_ensemble:
            return True
        results = await asyncio.gather(*(inst.check_ready() for inst in model.instances))
        return any(ok for ok, _ in results)

    def model_metadata(self, name: str, version: str = "") -> dict:
        model = self.registry.get(name, version)
        entry = self.registry.entries[name]
        versions = [str(v) for v, m in sorted(entry.versions.items()) if m.state is ModelState.READY]
        return model.metadata(versions)

    def model_config(self, name: str, version: str = "") -> dict:
        return self.registry.get(name, version).config_dict

    # ---- inference ---------------------------------------------------------

    def submit(self, request: InferRequest) -> None:
        """Validate and schedule a request; responses go to request.on_response.

        Raises KernelError when the request is refused up front (unknown model,
        bad inputs, shutting down).
        """
        if not self.accepting:
            raise KernelError(ErrorCode.UNAVAILABLE, "Server is stopping; new requests are not accepted")
        model = self.registry.get(request.model_name, request.model_version)
        if request.shm is not None:
            take_device_inputs(request)  # CUDA shared-memory inputs stay on the GPU
        if (request.shm is not None or self.admission.count or model.response_cache is not None
                or model.bytes_inputs or request.late_inputs) and self.admission.take(model, request):
            return  # large shared-memory inputs, BYTES elements or cache keys dealt with beside the loop, or behind such
        self._admit(model, request)

    def _admit_read(self, model: Model, request: InferRequest, validated: bool) -> None:
        """_admit for a request that waited for work beside the loop (kernel.core.admission)."""
        if not self.accepting:
            raise KernelError(ErrorCode.UNAVAILABLE, "Server is stopping; the request was not executed")
        self._admit(model, request, validated)

    def _admit(self, model: Model, request: InferRequest, validated: bool = False) -> None:
        """Validate a request whose inputs are all here (unless that was done beside the loop), and
        schedule it (or answer it from the cache)."""
        if not validated:
            model.validate_tagged(request)
        if request.outputs:
            counts = classification.requested(request)
            if counts and request.on_response is not None:
                classification.wrap(request, model, counts)  # the top classes instead of the values
        request.arrival_ns = _now_ns()
        if request.trace is not None:
            request.trace.on_submit(request, model, request.arrival_ns)
        if model.stats.observer is not None and model.stats.observer.first_response is not None:
            model.stats.observer.watch_first_response(request)
        if request.shm is not None:
            self.output_writes.route(request)
        if model.response_cache is not None and model.response_cache.serve(model, request):
            return  # answered from the response cache (outputs still go to their windows); the model never sees it
        model.scheduler.enqueue(request)

    def in_flight(self) -> int:
        models = self.registry.all_models()
        queued = sum(m.scheduler.pending_count() for m in models if m.scheduler is not None)
        if self.response_cache is not None:
            queued += self.response_cache.pending  # a redis lookup, or a copy into the local cache
        queued += self.admission.count  # held while their work runs beside the loop
        queued += self.output_writes.count  # answers being written into shared memory
        return queued + sum(inst.in_flight for m in models for inst in m.instances)

    # ---- statistics ------------------------------------------------------------

    def transfers(self) -> int:
        """Bodies being read and answers being written on every transport (see Transport.transfers)."""
        return sum(t.transfers() for t in self.transports)

    def statistics(self, name: str = "", version: str = "") -> dict:
        """The statistics extension's `$stats_model_response` (also behind gRPC ModelStatistics).

        Every ready version of every model when `name` is empty, else the ready
        versions of `name` ('' = all of them). Raises KernelError(INVALID_ARG)
        with Triton's messages for unknown models and versions.
        """
        if not name:
            models = sorted((m for m in self.registry.all_models() if m.state is ModelState.READY),
                            key=lambda m: (m.name, m.version))
            return {"model_stats": [m.stats.to_json() for m in models]}
        entry = self.registry.entries.get(name)
        ready = sorted((m for m in entry.versions.values() if m.state is ModelState.READY),
                       key=lambda m: m.version) if entry is not None else []
        if not ready:
            raise KernelError(ErrorCode.INVALID_ARG, f"requested model '{name}' is not available")
        if version:
            try:
                wanted = int(version)
            except ValueError:
                raise KernelError(
                    ErrorCode.INVALID_ARG, f"failed to get model version from specified version string '{version}' (details: stol), "
                    "version should be an integral value > 0"
                ) from None
            ready = [m for m in ready if m.version == wanted]
            if not ready:
                raise KernelError(
                    ErrorCode.INVALID_ARG, f"requested model version is not available for model '{name}'"
                )
        return {"model_stats": [m.stats.to_json() for m in ready]}

    async def total_statistics(self, name: str = "", version: str = "") -> dict:
        """The statistics extension's answer for the whole server: this process's (statistics())
        or, with several front processes, the totals over all of them."""
        if self.peers is not None:
            return await self.peers.statistics(name, version)
        return self.statistics(name, version)

    # ---- client shared-memory regions ----------------------------------------------

    async def change_shared_memory(self, change: RegionChange) -> None:
        """Register or unregister a client region for the whole server (every front process has it
        when this returns); KernelError with the extension's messages."""
        if self.peers is not None:
            await self.peers.change_shared_memory(change)
        else:
            change.apply(self.shared_memory)

    # ---- unloading -----------------------------------------------------------
    # (Loading is kernel.loading's: the server is handed a model control at composition.)

    async def retire_models(self, models: list[Model]) -> None:
        """Stop serving these versions: refuse new requests, let in-flight ones finish, stop the instances."""
        for m in models:
            m.state = ModelState.UNLOADING  # new requests are refused from here on
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.exit_timeout_secs
        if self.before_retire is not None:
            await self.before_retire(models)
        while loop.time() < deadline and any(_has_work(m) for m in models):
            await asyncio.sleep(0.02)
        for m in models:
            if m.scheduler is not None:
                m.scheduler.close()
        await self.stop_versions(models, max(0.0, deadline - loop.time()))
        for m in models:
            m.state = ModelState.UNAVAILABLE
            if m.response_cache is not None:
                m.response_cache.clear_model(m)
            log.info("successfully unloaded '%s' version %d", m.name, m.version, extra=_unloaded(m))

    async def stop_versions(self, models: list[Model], timeout: float) -> None:
        await asyncio.gather(
            *(inst.stop(timeout) for m in models for inst in m.instances), return_exceptions=True
        )

    def model_states(self) -> list[dict]:
        """Every model version's state, the model table's rows as log event fields (model, version,
        state, reason: kernel.observe.log.EVENT_FIELDS); the JSON log writes one event per row."""
        rows = []
        for name in sorted(self.registry.entries):
            e = self.registry.entries[name]
            if e.versions:
                for v, m in sorted(e.versions.items()):
                    rows.append({"model": name, "version": v, "state": m.state.value})
            else:
                row = {"model": name, "state": e.state.value}
                if e.reason:
                    row["reason"] = e.reason
                rows.append(row)
        return rows

    def model_table(self) -> str:
        """tritonserver's start-up table of models, versions and states."""
        rows = [(r["model"], str(r.get("version", "-")),
                 f"UNAVAILABLE: {r['reason']}" if r.get("reason") else r["state"]) for r in self.model_states()]
        return _table(("Model", "Version", "Status"), rows)

    # ---- lifecycle -------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        """Start-up loading is over (start() has run)."""
        return self._loaded

    async def open(self, check_ports: bool = True) -> None:
        """Before any model loads: listen where a transport can serve while models load, and check
        the ports of the others.

        So a taken port stops start-up in a second rather than after every model has loaded, and
        /v2/health/live answers during a long load (readiness stays false until start_transports),
        so a liveness probe does not kill the pod that is loading. tritonserver listens on nothing
        before its models are loaded; its "Started <service> at <address>" lines still come after
        the model table here (start_transports), when the server serves, since scripts wait for them.
        """
        self.live = True
        for t in self.transports:
            if t.serves_while_loading:
                address = await self._start_transport(t)
                log.info("%s listening at %s while models load (live, not ready)", t.service_name, address,
                         extra={"service": t.service_name, "address": address})
            elif check_ports:  # (a front of several does not: the supervisor holds those ports, listen.py)
                try:
                    t.check_port()
                except OSError as exc:
                    raise TransportStartError(t, exc) from exc

    async def start(self) -> None:
        """Load what the model control mode loads at start-up, then follow the repositories."""
        if self.response_cache is not None:
            try:
                await self.response_cache.open()  # the redis cache connects (and must answer) first
            except RuntimeError as exc:
                raise StartupError(str(exc)) from None
        self.live = True
        all_found = await self.control.load_startup_models()
        self._loaded = True
        log.info(self.model_table(), extra={"models": self.model_states()})
        failed = [e for e in self.registry.entries.values() if e.state is ModelState.UNAVAILABLE]
        if (failed or not all_found) and self.options.exit_on_error:
            raise StartupError("failed to load all models")
        self.control.start_polling()

    async def start_transports(self) -> None:
        """Start the transports open() did not start; then the server serves (ready, when its models are)."""
        for t in self.transports:
            if t not in self._addresses:
                await self._start_transport(t)
        for t in self.transports:
            log.info("Started %s at %s", t.service_name, self._addresses[t],
                     extra={"service": t.service_name, "address": self._addresses[t]})
        self._listening = True

    async def _start_transport(self, t: Transport) -> str:
        try:
            address = await t.start()
        except OSError as exc:
            raise TransportStartError(t, exc) from exc
        self._addresses[t] = address
        return address

    async def stop(self) -> None:
        """Graceful shutdown: refuse new work, drain in-flight requests, finalize models."""
        self.stopping = True
        await self.control.stop()
        for t in self.transports:
            try:
                await t.stop()
            except Exception:  # noqa: BLE001
                log.exception("stopping %s failed", t.service_name)
        timeout = self.options.exit_timeout_secs
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        log.info("Waiting for in-flight requests to complete.")
        # Requests inside models, and transfers still going on the transports (a body being read,
        # an answer being written): both finish within the exit timeout.
        while (self.in_flight() or self.transfers()) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        self.accepting = False
        remaining = self.in_flight()
        log.info("Timeout %d: Found %d in-flight requests", int(max(0, deadline - loop.time())), remaining)
        models = self.registry.all_models()
        # Versions whose load was abandoned (a signal during start-up) were never loaded: nothing to report.
        abandoned = {id(m) for m in models if m.state is ModelState.LOADING}
        for m in models:
            m.state = ModelState.UNLOADING
            if m.scheduler is not None:
                m.scheduler.close()
        await asyncio.gather(
            *(inst.stop(max(0.0, deadline - loop.time())) for m in models for inst in m.instances),
            return_exceptions=True,
        )
        for m in models:
            m.state = ModelState.UNAVAILABLE
            if id(m) not in abandoned:
                log.info("successfully unloaded '%s' version %d", m.name, m.version, extra=_unloaded(m))
        for t in self.transports:
            try:
                await t.close()
            except Exception:  # noqa: BLE001
                log.exception("closing %s failed", t.service_name)
        self.held_output.close()
        self.held_input.close()
        self.shared_memory.close()
        if self.response_cache is not None:
            await self.response_cache.close()
        if self.tracer is not None:
            # What is left of the exit timeout (at least a moment for the last spans to go).
            await self.tracer.close(max(FINAL_EXPORT_S, deadline - loop.time()))
        self.live = False


_now_ns = time.monotonic_ns


def _unloaded(model: Model) -> dict:
    """The log event fields of an unloaded version (kernel.observe.log.EVENT_FIELDS)."""
    return {"model": model.name, "version": model.version, "state": ModelState.UNAVAILABLE.value, "reason": "unloaded"}


def _has_work(model: Model) -> bool:
    pending = getattr(model.scheduler, "pending_count", None)
    return bool((pending() if pending is not None else 0) or any(i.in_flight for i in model.instances))


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def fmt(row) -> str:
        return "|" + "|".join(f" {str(c):<{w}} " for c, w in zip(row, widths)) + "|"

    return "\n".join([line, fmt(header), line, *(fmt(r) for r in rows), line])

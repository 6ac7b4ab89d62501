"""The worker process: runs one instance of a model.py on its own uvloop.

Started by instance.py as `python -m kernel.backends.python.worker`. The loop owns the
channel to the front process. An `async def execute` runs on the loop, many at
a time. A synchronous `execute` runs inline on the loop too (a thread hop each
way cost more than the whole worker side of a small request); the calls that
wait for the front meanwhile (BLS, model loading, metric reads,
is_cancelled) pump the channel themselves, see inline_channel.py. Decoupled
models, models that answer through response senders and models with is_ready()
keep one dedicated model thread, so the loop stays free for their own threads'
responses and readiness checks.

A response is packed on whichever thread hands it over (responses.py); the arenas' side of that,
and of inputs read in place from the front's arena, is worker_arena.py.

Other front processes may reach this worker over links of their own (worker_links.py): their
requests run here as the primary front's do, each link answered on its own channel; waiting
Executes of a dynamically batched model may then run as one execute() (worker_merge.py).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np

from kernel.backends.python import gpu_worker, messages, wire
from kernel.backends.python.bls import BlsClient
from kernel.backends.python.execution_record import Batch, LinkedBatch, batch_size, execution_record
from kernel.backends.python.inline_channel import InlineChannel
from kernel.backends.python.inline_waits import InlineWaits
from kernel.backends.python.metrics_client import MetricsClient
from kernel.backends.python.model_import import load_model_class
from kernel.backends.python.model_loading import ModelLoadingClient
from kernel.backends.python.model_thread import ModelThread
from kernel.backends.python.stop_signals import hold_stop_signals
from kernel.backends.python.responses import ResponseSink, pack_tensor, response_message
from kernel.backends.python.worker_arena import WorkerArenas
from kernel.backends.python.worker_links import TAGGED, WorkerLinks
from kernel.backends.python.worker_log import apply_log_settings, format_exception
from kernel.backends.python.worker_merge import Merger, part_records
from kernel.backends.python.worker_results import ExecuteResults
from kernel.core import datatypes

import triton_python_backend_utils as pb_utils  # noqa: E402  (model code imports it too)

log = logging.getLogger("kernel.worker")


class Worker(InlineWaits, ExecuteResults):
    def __init__(
        self,
        channel_sock: socket.socket,
        fd_sock: socket.socket,
        model_file: str,
        instance_name: str,
        shm_default_byte_size: int,
        shm_growth_byte_size: int,
        shm_idle_release_seconds: float = 0.0,
    ):
        self.channel_sock = channel_sock
        self.fd_sock = fd_sock
        self.model_file = model_file
        self.instance_name = instance_name
        self.loop: asyncio.AbstractEventLoop | None = None
        self.channel: InlineChannel | None = None
        self.model = None
        self.model_name = ""
        self.model_version = 0
        self.output_names: list[str] = []
        self.decoupled = False
        self.async_execute = False
        self.arenas = WorkerArenas(self, shm_default_byte_size, shm_growth_byte_size, shm_idle_release_seconds,
                                   f"kernel-{instance_name}-out")
        self.arena = self.arenas.arena  # outputs and BLS inputs: written here
        self.peer = self.arenas.peer  # the front's arena: inputs and BLS outputs, read in place
        self.sinks: dict[int, ResponseSink] = {}
        self.requests: dict[int, object] = {}
        self.model_thread: ModelThread | None = None  # started with the loop
        self.done: asyncio.Future | None = None
        self._outbox: list[messages.Response] = []
        self._peer_releases: list[tuple[int, int]] = []
        self._flush_scheduled = False
        self.bls = BlsClient(self)
        self.bls.model_loading = ModelLoadingClient(self)  # pb_utils.load_model & co. go through the BLS hook
        pb_utils._bls_handler = self.bls
        self.metrics = MetricsClient(self)
        pb_utils._metrics_handler = self.metrics
        self.max_batch_size = 0
        self.bls_allowed = False  # BLS calls are refused in initialize and finalize, as in Triton
        self._executions: list[messages.Execution] = []
        self.inline_execute = False  # run a synchronous execute on the loop (see _execute_inline)
        self._inline_busy = False
        self._loop_thread = 0
        self.links = WorkerLinks(self)  # other fronts' links (worker_links.py)
        self.linked = False  # a link was ever added: the checks the primary alone never needs
        self.merger: Merger | None = None  # a dynamically batched synchronous model's (worker_merge.py)

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.model_thread = ModelThread(self.loop)
        self.done = self.loop.create_future()
        self.arenas.start(self.loop)
        direct_sock = self.channel_sock.dup()
        _, self.channel = await self.loop.create_unix_connection(
            lambda: InlineChannel(messages.ToWorker, self.on_message, self.on_lost, direct_sock, self.on_undecodable),
            sock=self.channel_sock,
        )
        await self.done

    def call_on_loop(self, fn, *args) -> None:
        if self.loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop or self.pumping_here():
            fn(*args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)

    # ---- channel ---------------------------------------------------------

    def on_lost(self, exc) -> None:
        # The front process is gone: nobody to answer to.
        if threading.get_ident() != self._loop_thread:  # noticed by a model thread's pump
            self.loop.call_soon_threadsafe(self.on_lost, exc)
            return
        if not self.done.done():
            self.done.set_result(None)

    def on_undecodable(self, frame: bytes, error: Exception, link=None) -> None:
        """A frame this worker cannot read fails the requests it carries, never the worker."""
        log.error("a message from the server could not be read (%s); its requests are answered with an error", error)
        channel = self.channel if link is None else link.channel
        answer = messages.refuse_undecodable(frame, error)
        if answer is not None:
            channel.send(answer)
        regions = messages.undecodable_regions(frame)  # its inputs in the front's arena: never read here
        if regions:
            channel.send(messages.Release(regions))

    def cancel(self, key: int) -> None:
        sink = self.sinks.get(key)
        if sink is not None:
            sink.cancelled = True
            # The front may give up on it (a model that never answers): its inputs go back
            # once the model drops them, not at a final response that may never come.
            sink.regions = None

    def on_message(self, msg) -> None:
        kind = type(msg)
        if self._inline_busy and kind not in _ANY_THREAD and threading.get_ident() != self._loop_thread:
            # Read by a model thread while an inline execute holds the loop: the loop handles it later.
            self.loop.call_soon_threadsafe(self.on_message, msg)
            return
        if kind is messages.Execute:
            if self.linked:
                self.links.board.received(0, len(msg.requests))
            self.execute(msg.requests, msg.trace_key)
        elif kind is messages.Cancel:
            self.cancel(msg.key)
        elif kind is messages.Gathered:
            if self.merger is not None:
                self.merger.gathered(msg.round)
        elif kind is messages.BlsResponses:
            self.bls.on_responses(msg.responses)
        elif kind is messages.ModelControlResult:
            self.bls.model_loading.on_result(msg)
        elif kind is messages.MetricReply:
            self.metrics.on_reply(msg)
        elif kind is messages.Release:
            for seg, off in msg.regions:
                self.arena.free(seg, off)
        elif kind is messages.DeviceRelease:
            gpu_worker.free(msg.tokens)
        elif kind is messages.DeviceUnmap:
            gpu_worker.unmap(msg)
        elif kind is messages.SegmentAdded:
            self.peer.receive(self.fd_sock, msg.segment, msg.size)
        elif kind is messages.SegmentRemoved:
            self.peer.remove(msg.segment)
        elif kind is messages.CheckReady:
            asyncio.ensure_future(self.check_ready(msg.key))
        elif kind is messages.Initialize:
            # Applied here, not in the task: a SetLog that follows must not be overtaken.
            apply_log_settings(msg.log)
            asyncio.ensure_future(self.initialize(msg))
        elif kind is messages.SetLog:
            apply_log_settings(msg.log)
        elif kind is messages.Shutdown:
            asyncio.ensure_future(self.shutdown())
        elif kind is messages.LinkAdded:
            self.links.add(msg.link)
        elif kind is messages.Usage:
            self.channel.send(self.links.usage(msg.key))

    # ---- lifecycle -------------------------------------------------------

    async def initialize(self, msg: messages.Initialize) -> None:
        self.channel.send(messages.Started())  # the front's stub-timeout-seconds ends here
        args = msg.args
        # The model's version folder, also when model.py is a Python-based backend's.
        pb_utils._set_model_dir(str(Path(args["model_repository"]) / args["model_version"]))
        try:
            config = json.loads(args["model_config"])
            self.decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
            self.model_name = args["model_name"]
            self.model_version = int(args["model_version"])
            self.max_batch_size = int(config.get("max_batch_size", 0) or 0)
            self.output_names = [o["name"] for o in config.get("output", [])]
            gpu_worker.bind(self, config)  # FORCE_CPU_ONLY_INPUT_TENSORS; CuPy only once a GPU tensor comes
            # (or now, for a KIND_GPU instance: CUDA set up beside the model's import and initialize)
            warming = self.loop.run_in_executor(None, gpu_worker.warm, args.get("model_instance_kind", ""),
                                                int(args.get("model_instance_device_id", 0) or 0))
            cls = load_model_class(self.model_file)
            self.model = cls()
            self.async_execute = inspect.iscoroutinefunction(getattr(self.model, "execute", None))
            # Decoupled models stream from their own threads, and is_ready() must answer while
            # execute runs: those keep the model thread.
            self.inline_execute = (not self.async_execute and not self.decoupled
                                   and not callable(getattr(self.model, "is_ready", None)))
            init = getattr(self.model, "initialize", None)
            if init is not None:
                if inspect.iscoroutinefunction(init):
                    await init(args)
                else:
                    await self.model_thread.submit(init, args)
            if not hasattr(self.model, "execute"):
                raise AttributeError("TritonPythonModel has no 'execute' method")
            self.merger = Merger.for_model(self, config)
            await warming
        except BaseException as exc:  # noqa: BLE001 - any failure is reported to the front
            message = f"Internal: {format_exception(exc)}"  # tritonserver: the status code's name, then the error
            log.error("%s", message)
            self.channel.send(messages.Ready(message))
            return
        self.bls_allowed = True
        # The interpreter's and the model's start-up objects (a framework's modules, the weights'
        # wrappers) live as long as the worker: out of the collector's reach, a full collection
        # scans only what came since instead of stalling every stream for the whole heap.
        gc.freeze()
        self.channel.send(messages.Ready(None, has_is_ready=callable(getattr(self.model, "is_ready", None)),
                                         async_execute=self.async_execute, decoupled=self.decoupled))

    async def check_ready(self, key: int, link=None) -> None:
        """Run the model's is_ready(): False, an exception or a non-bool means not ready."""
        hook = self.model.is_ready
        try:
            if inspect.iscoroutinefunction(hook):
                result = await hook()
            else:
                # Not on the execute thread: a busy model still answers readiness.
                result = await self.loop.run_in_executor(None, hook)
            if not isinstance(result, bool):
                ready, reason = False, f"is_ready() returned {type(result).__name__}, expected bool"
            else:
                ready, reason = result, "" if result else "is_ready() returned False"
        except BaseException as exc:  # noqa: BLE001
            ready, reason = False, f"is_ready() raised {format_exception(exc)}"
        try:
            (self.channel if link is None else link.channel).send(messages.ReadyResult(key, ready, reason))
        except ConnectionError:
            pass

    async def shutdown(self) -> None:
        self.bls_allowed = False
        error = None
        fin = getattr(self.model, "finalize", None)
        if fin is not None:
            try:
                if inspect.iscoroutinefunction(fin):
                    await fin()
                else:
                    await self.model_thread.submit(fin)
            except BaseException as exc:  # noqa: BLE001
                error = format_exception(exc)
        try:
            self.channel.send(messages.Finalized(error))
        except ConnectionError:
            pass
        self.loop.call_later(0.05, lambda: self.done.done() or self.done.set_result(None))

    # ---- requests --------------------------------------------------------

    def _input_tensor(self, t: messages.Tensor, link=None):
        """The model's tensor for input `t` from the front of `link` (None: the primary's)."""
        dtype = wire.NUMERIC_DTYPES.get(t.datatype)
        if dtype is not None and t.data is not None:  # the common case, without the general path's calls
            return pb_utils.Tensor._wrap(t.name, np.frombuffer(bytearray(t.data), dtype).reshape(t.shape), t.datatype)
        if t.ipc is not None:  # a GPU tensor (gpu_worker.py): on the GPU, or copied here for a CPU-input model
            if link is not None:
                t.token |= link.tag  # its loan goes back to that front (worker_links.py)
            return pb_utils.Tensor._wrap(t.name, gpu_worker.open_input(t, gpu_worker.gpu_inputs(),
                                                                       link.serial if link is not None else 0),
                                         t.datatype)
        if t.datatype == "BYTES":
            buffer = wire.view(t, self.peer if link is None else link.peer)
            count = datatypes.element_count(t.shape)
            arr = np.empty(count, dtype=np.object_)
            arr[:] = datatypes.deserialize_bytes(buffer, count)
            if t.data is None:
                del buffer
                self.call_on_loop(self.release_peer_region, t.segment, t.offset, link)  # read into objects: done
            return pb_utils.Tensor._wrap(t.name, arr.reshape(t.shape), "BYTES")
        if dtype is None:
            dtype = datatypes.datatype_to_numpy(t.datatype)
        if t.data is not None:
            return pb_utils.Tensor._wrap(t.name, wire.numeric_array(t.data, dtype, t.shape, writable=True), t.datatype)
        # A view of the front's arena (no copy): the region goes back when the last array over it does.
        return pb_utils.Tensor._wrap(t.name, self.arenas.input_array(t, dtype, link), t.datatype)

    def execute(self, wire_requests: list[messages.Request], trace_key: int = 0, link=None) -> None:
        """Run an Execute from the primary front, or from the front of `link` (worker_links.py)."""
        requests = []
        if link is None:
            keys = Batch(time.monotonic_ns())
            peer, tag = self.peer, 0
        else:
            keys = LinkedBatch(time.monotonic_ns(), link)
            peer, tag = link.peer, link.tag
        keys.trace_key = trace_key
        for r in wire_requests:
            requested = r.requested_outputs or None
            key = r.key | tag
            sink = ResponseSink(self, key, requested)
            self.sinks[key] = sink
            inputs = []
            try:
                for t in r.inputs:
                    inputs.append(self._input_tensor(t, link))
            except ValueError as exc:
                for t in r.inputs[len(inputs):]:  # never made into arrays: nothing else gives them back
                    if t.ipc is not None:
                        gpu_worker.give_back(t.token | tag)
                    elif t.data is None:
                        self.release_peer_region(t.segment, t.offset, link)
                inputs = None
                self.send_error(sink, getattr(exc, "code", "INVALID_ARG"), str(exc))
                if r.arrival_ns:
                    keys.failed_early.append(r.arrival_ns)
                continue
            sink.regions = wire.arena_inputs(r.inputs, peer, inputs)
            if r.device_outputs:
                sink.device = r.device_outputs
            sink.sender = pb_utils.InferenceResponseSender(sink, self.decoupled, requested)
            request = pb_utils.InferenceRequest._server_side(  # positional: keywords cost per request
                inputs, r.request_id, r.correlation_id, r.flags, r.requested_outputs or self.output_names,
                r.parameters, self.model_name, self.model_version, sink.sender, sink.is_cancelled,
            )
            if r.trace_context:  # traced: request.trace() names it, and BLS calls that pass it join it
                request._trace = pb_utils.InferenceTrace(r.trace_context)
            requests.append(request)
            keys.append(key)
            keys.meta.append((r.arrival_ns, batch_size(r, self.max_batch_size)))
        keys.requests = requests
        keys.input_end = time.monotonic_ns()
        if not requests:
            self._report_execution(keys, None, None)
            return
        if self.async_execute:
            asyncio.ensure_future(self._execute_async(requests, keys))
        elif self.merger is not None and self.linked and self.links.by_serial:
            self.merger.submit(keys, wire_requests[0])  # may run with other links' waiting Executes
        elif self._inline_busy:
            # Read while an inline execute pumps the channel: its sinks exist (cancellations
            # land), it runs once the current execute has returned.
            self.loop.call_soon(self._execute_sync, requests, keys)
        else:
            self._execute_sync(requests, keys)

    def _execute_sync(self, requests, keys) -> None:
        if self.inline_execute and self.channel.can_go_direct():
            self._execute_inline(requests, keys)
        else:
            self.model_thread.call(keys.run, (self.model.execute, requests), self._finish_timed, keys)

    def _execute_inline(self, requests, keys) -> None:
        """A synchronous execute on the loop itself: no thread hop each way.

        While it runs, the loop is not polling: the calls that wait for the front
        pump the channel themselves (see pumping_here). The running loop is
        unset so that model code may run its own asyncio loop, as on a thread.
        """
        self._inline_busy = True
        self.channel.set_direct(True)
        if self.linked:  # (other fronts' links: read too, see worker_links.py)
            self.links.hold(True)
        asyncio.events._set_running_loop(None)
        try:
            result = keys.run(self.model.execute, requests)
            exc = None
        except BaseException as error:  # noqa: BLE001 - reported like the thread does
            result, exc = None, error
        finally:
            asyncio.events._set_running_loop(self.loop)
            if self.linked:
                self.links.hold(False)
            self.channel.set_direct(False)  # waits for a model thread's direct read or write to end
            self._inline_busy = False
        if exc is None and result is None:
            # Responses go through response senders, maybe from the model's own threads
            # after execute returned: keep the loop free for them from now on.
            self.inline_execute = False
        self._finish_timed(keys, result, exc)

    async def _execute_async(self, requests, keys) -> None:
        keys.exec_start = time.monotonic_ns()
        try:
            result = await self.model.execute(requests)
        except BaseException as exc:  # noqa: BLE001
            keys.exec_end = time.monotonic_ns()
            self._finish_timed(keys, None, exc)
            return
        keys.exec_end = time.monotonic_ns()
        self._finish_timed(keys, result, None)

    def _finish_timed(self, keys, result, exc) -> None:
        self._finish(keys, result, exc)
        self._report_execution(keys, result, exc)
        if self.merger is not None:
            self.merger.finished()

    # ---- responses -------------------------------------------------------

    def send_error(self, sink: ResponseSink, code: str, message: str) -> None:
        self._queue(messages.Response(sink.key, error=messages.Error(code, message)))
        self.sinks.pop(sink.key, None)
        sink.regions = None

    def send_response(self, sink: ResponseSink, response, final: bool) -> None:
        """A response execute returned (on the loop)."""
        message = response_message(sink, response, final, self.arena)
        if final:
            self.sinks.pop(sink.key, None)
            sink.regions = None  # its input tensors: nothing more goes back by reference
        self._queue(message)

    def hand_over(self, sink: ResponseSink, response, final: bool) -> None:
        """A response given to a response sender, on whichever thread the model called send() from.

        Packed here and now: the answer is what the model handed over at this moment, whatever it
        does with its arrays next (Triton copies outputs into shared memory inside send() too).
        Only queueing the message waits for the loop.
        """
        if sink.key >= TAGGED and self.links.link_of(sink.key) is None:
            return  # its link is gone (worker_links.py): nobody to pack it for
        message = response_message(sink, response, final, self.arena)
        if final:
            sink.regions = None
        self.call_on_loop(self._handed_over, sink.key, message, final)

    def _handed_over(self, key: int, message: messages.Response, final: bool) -> None:
        if final:
            self.sinks.pop(key, None)
        self._queue(message)

    def pack_tensor(self, tensor) -> messages.Tensor:
        """A pb_utils.Tensor in message form (BLS inputs travel this way too: a GPU one as an IPC handle)."""
        return pack_tensor(tensor, self.arena, device=True)

    # ---- statistics and rescheduling (see kernel.core.stats, kernel.core.scheduling.sequence) ----

    def _report_execution(self, batch: Batch, result, exc) -> None:
        """One Execution record per Execute message: the front's statistics and schedulers need it."""
        if not self.linked:  # never a link (so never a merge): the primary's alone
            self._executions.append(execution_record(batch, result, exc, self.decoupled))
            self._schedule_flush()
            return
        self.links.board.executed(1 if batch.parts is None else len(batch.parts))
        if batch.parts is None:
            self._route_execution(batch, execution_record(batch, result, exc, self.decoupled))
        else:  # merged: a record per link's Execute (worker_merge.py)
            for part, record in part_records(batch, result, exc, self.decoupled):
                self._route_execution(part, record)

    def _route_execution(self, batch: Batch, record: messages.Execution) -> None:
        if batch.link is None:
            self._executions.append(record)
            self._schedule_flush()
        else:
            self.links.execution(batch.link, record)

    def _queue(self, response: messages.Response) -> None:
        if response.key >= TAGGED:  # another front's (worker_links.py)
            self.links.queue(response)
            return
        # Responses finished in the same loop iteration travel in one message.
        self._outbox.append(response)
        self._schedule_flush()

    def release_peer_region(self, segment: int, offset: int, link=None) -> None:
        """The model dropped a tensor that lives in a front's arena (an input, a BLS output)."""
        if link is not None:
            self.links.release(link, segment, offset)
            return
        self._peer_releases.append((segment, offset))
        self._schedule_flush()

    def send_device_release(self, tokens: list[int]) -> None:
        """GPU tensors the fronts lent that the model is done with (gpu_worker.give_back)."""
        if self.links.by_serial or any(t >= TAGGED for t in tokens):
            self.links.device_release(tokens)
        else:
            self.channel.send(messages.DeviceRelease(tokens))

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._outbox = self._outbox, []
        releases, self._peer_releases = self._peer_releases, []
        executions, self._executions = self._executions, []
        try:
            if self.arenas.unannounced:  # grown meanwhile: the front must know it before the responses
                self.arenas.send_announcements()
            if out or executions:
                self.channel.send(messages.Responses(out, executions, releases))
            elif releases:
                self.channel.send(messages.Release(releases))
        except ConnectionError:
            pass
        if self.linked:
            self.links.flush(out)


# Messages a model thread may handle itself while it pumps the channel (see take_off_loop).
_ANY_THREAD = frozenset((messages.Cancel, messages.BlsResponses, messages.ModelControlResult,
                         messages.MetricReply, messages.SegmentAdded, messages.SegmentRemoved))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="kernel-python-worker")
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--fd-channel-fd", type=int, required=True)
    parser.add_argument("--model-file", required=True)
    parser.add_argument("--instance-name", required=True)
    parser.add_argument("--shm-default-byte-size", type=int, default=64 << 20)
    parser.add_argument("--shm-growth-byte-size", type=int, default=64 << 20)
    parser.add_argument("--shm-idle-release-seconds", type=float, default=0.0)
    args = parser.parse_args(argv)
    # The model sees an embedded interpreter's argv, as under Triton's stub: argparse or
    # unittest.main() in model code must not trip over the worker's own flags.
    sys.argv = [""]
    hold_stop_signals()  # the front process decides when we stop (stop_signals.py)
    channel = socket.socket(fileno=args.channel_fd)
    fd_sock = socket.socket(fileno=args.fd_channel_fd)
    worker = Worker(
        channel, fd_sock, args.model_file, args.instance_name, args.shm_default_byte_size, args.shm_growth_byte_size,
        args.shm_idle_release_seconds,
    )
    try:
        import uvloop

        uvloop.run(worker.run())
    except ImportError:
        asyncio.run(worker.run())
    # Don't wait for a model's stray non-daemon threads.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

"""Control messages between the front process and a Python model worker.

Each message is a msgspec Struct encoded as msgpack and framed with a 4-byte
little-endian length (see framing.py). Small tensors ride inline in `data`;
large ones live in a shared-memory arena and the message carries only their
location (arena segment, offset, size). A GPU tensor carries a CUDA IPC handle
instead (`ipc`, with `device`, `offset`, `nbytes` and a `token` to give it back
with: see gpu_worker.py and gpu_front.py).
"""

from __future__ import annotations

import time
from typing import Optional, Union

import msgspec


class Tensor(msgspec.Struct, array_like=True, omit_defaults=True):
    name: str
    datatype: str
    shape: list[int]
    data: Optional[bytes] = None  # inline wire-form bytes, or None when in the arena
    segment: int = -1
    offset: int = 0
    nbytes: int = 0
    # >= 0: the bytes lie in the *receiver's* own arena, inside its allocation at (segment, owner);
    # a worker's output that is a view of a request's input goes back this way, without a copy.
    owner: int = -1
    # A GPU tensor: the cudaIpcMemHandle_t (64 bytes) of the device allocation it lies in, at
    # `offset`, `nbytes` long, on GPU `device`. `token` names it for DeviceRelease: from a worker,
    # its export (the front frees it with that token); from the front, the front's loan (the worker
    # gives it back with that token once the model has dropped every array over it).
    ipc: Optional[bytes] = None
    device: int = -1
    token: int = 0
    # Front -> worker: the handle is a client's CUDA shared-memory region: the worker keeps its
    # mapping open for the next request until the front sends DeviceUnmap for it.
    keep: bool = False


class Request(msgspec.Struct, array_like=True, omit_defaults=True):
    key: int  # the front process's handle for this request
    request_id: str
    inputs: list[Tensor]
    requested_outputs: list[str] = []
    correlation_id: Union[int, str] = 0
    flags: int = 0
    parameters: str = "{}"  # JSON object, as request.parameters() returns it
    arrival_ns: int = 0  # when the core accepted it (monotonic clock); 0: not counted in statistics
    # OpenTelemetry tracing: front -> worker, the traced request's context (request.trace());
    # worker -> front in a BlsRequest, the context the model passed as InferenceRequest(trace=...).
    trace_context: str = ""
    # Outputs that may go back as GPU tensors (IPC handles): True for all, or their names. Any
    # other GPU output is copied to the host in the worker (kernel.core.device_memory).
    device_outputs: Union[bool, list[str]] = False
    # A request relayed from a front to the supervisor's core (kernel/serve/fronts/relay.py), which
    # serves every model: which one, and what its scheduler needs. Empty for a worker.
    model_name: str = ""
    model_version: str = ""
    priority: int = 0
    timeout_us: int = 0


class Error(msgspec.Struct, array_like=True):
    code: str  # kernel.core.errors.ErrorCode name
    message: str


class Response(msgspec.Struct, array_like=True, omit_defaults=True):
    key: int
    outputs: list[Tensor] = []
    error: Optional[Error] = None
    parameters: str = ""
    final: bool = True
    has_response: bool = True  # False: a bare FINAL flag with no response object
    reschedule: bool = False  # released with RELEASE_RESCHEDULE: run it again, no response


# front -> worker


class LogSettings(msgspec.Struct, array_like=True, frozen=True):
    verbose: int = 0
    info: bool = True
    warning: bool = True
    error: bool = True
    format: str = "default"
    file: str = ""  # the server's log file ("" = stderr): model log lines are appended to it


class SetLog(msgspec.Struct, tag="set_log", array_like=True):
    """The server's log settings changed (logging extension): apply them from now on."""

    log: LogSettings


class Initialize(msgspec.Struct, tag="init", array_like=True):
    args: dict[str, str]
    log: LogSettings = LogSettings()


class CheckReady(msgspec.Struct, tag="check_ready", array_like=True):
    """Ask the model's own is_ready(); answered with ReadyResult(key)."""

    key: int


class Execute(msgspec.Struct, tag="exec", array_like=True):
    requests: list[Request]
    trace_key: int = 0  # non-zero: some requests are traced; the Execution record echoes it


class Cancel(msgspec.Struct, tag="cancel", array_like=True):
    key: int


class Release(msgspec.Struct, tag="release", array_like=True):
    """The receiver may reuse these regions of its own arena: (segment, offset).

    Sent by whichever side read tensors the other side wrote into its arena: the front once the
    transport is done with an output, the worker once the model's last array over an input (or a
    BLS output) is gone.
    """

    regions: list[tuple[int, int]]


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    pass


class LinkAdded(msgspec.Struct, tag="link_added", array_like=True):
    """On the primary channel only: a new link to another front process (worker_links.py). Its two
    sockets (message channel, fd channel) follow on the primary fd channel, in one datagram."""

    link: int  # 1..254, unique per worker: a link added again replaces the one it names


class Usage(msgspec.Struct, tag="usage", array_like=True):
    """Ask what the worker holds (diagnostics, tests); answered on the same link with UsageReport(key)."""

    key: int


class Gathered(msgspec.Struct, tag="gathered", array_like=True):
    """Front -> worker, the answer to Gather(round): what this front queued for the model (its Execute,
    if any) was sent before this, on the same link."""

    round: int


class DeviceRelease(msgspec.Struct, tag="device_release", array_like=True):
    """GPU tensors (Tensor.token) the sender is done with; both directions.

    Front -> worker: the last holder of these exports of the worker's is gone, free their device
    memory. Worker -> front: the model's last array over these GPU tensors the front lent it is
    gone (the worker closed its IPC mapping), so the front may let go of them.
    """

    tokens: list[int]


class DeviceUnmap(msgspec.Struct, tag="device_unmap", array_like=True):
    """Front -> worker: these CUDA regions (Tensor.keep) are unregistered and none of this front's
    requests uses them: the worker closes its mappings of them once the model's arrays are gone."""

    handles: list[bytes]
    devices: list[int]


# worker -> front


class Started(msgspec.Struct, tag="started", array_like=True):
    """The worker runs and has the Initialize message; the model's import and initialize() come next.

    stub-timeout-seconds bounds the wait for this, not for Ready: a model may take minutes to
    initialize, and Triton waits for it.
    """


class Ready(msgspec.Struct, tag="ready", array_like=True):
    error: Optional[str] = None
    has_is_ready: bool = False  # the model defines is_ready()
    async_execute: bool = False  # `async def execute`: executions overlap, the instance never looks busy
    decoupled: bool = False  # the model's transaction policy (told to fronts over links: WorkerFacts)


class ReadyResult(msgspec.Struct, tag="ready_result", array_like=True):
    key: int
    ready: bool
    reason: str = ""


class Execution(msgspec.Struct, array_like=True, omit_defaults=True):
    """One finished execute() call, for statistics (see kernel.core.stats.ModelStats.record_execution).

    Times are time.monotonic_ns(): start/input_end bracket turning the inputs
    into pb_utils requests, input_end..output_start is the model's execute,
    output_start..end turning its results into responses.
    """

    batch_size: int  # summed batch size of the requests it ran; 0: it ran nothing
    start: int
    input_end: int
    output_start: int
    end: int
    inference_count: int = 0  # summed batch size of the requests that succeeded
    ok_request_ns: list[int] = []  # per successful request: arrival -> end
    ok_queue_ns: list[int] = []  # per successful request: arrival -> start
    fail_ns: list[int] = []  # per failed request: arrival -> end
    trace_key: int = 0  # the Execute message's trace_key
    # >0: this Execute ran in one execute() with other links' Executes (worker_merge.py), of this
    # summed batch size; only the share with `lead` counts that execute() (execution_count, batch_stats).
    merged_batch_size: int = 0
    lead: bool = True
    cancelled_ns: list[int] = []  # per request its client cancelled before it ended: arrival -> end


class Responses(msgspec.Struct, tag="responses", array_like=True):
    responses: list[Response]
    executions: list[Execution] = []  # execute() calls that finished (one per Execute message)
    # Regions of the front's arena the worker is done with (as Release): an identity request's
    # input goes back in the same message as its response, read once the responses are.
    releases: list[tuple[int, int]] = []


class Board(msgspec.Struct, tag="board", array_like=True):
    """The worker's load board (board.py): a memfd of `size` bytes, its fd on the fd channel."""

    size: int


class Gather(msgspec.Struct, tag="gather", array_like=True):
    """Worker -> every front: a batch with a queue delay waits to run and has room for `room` more;
    send what you queued for this model now (worker_merge.py). Answered with Gathered(round)."""

    round: int
    room: int


class UsageReport(msgspec.Struct, tag="usage_report", array_like=True):
    """What the worker holds now (the answer to Usage): tests read that a lost link left nothing behind."""

    key: int
    arena_bytes: int  # the worker's own arena (outputs, BLS inputs): bytes allocated
    held_inputs: int  # input arrays over a front's arena still alive in the worker
    requests: int  # requests received and not finished (their response sinks)
    links: int  # links besides the primary
    gpu_exports: int = 0  # GPU outputs exported and not given back


class Finalized(msgspec.Struct, tag="finalized", array_like=True):
    error: Optional[str] = None


class BlsRequest(msgspec.Struct, tag="bls", array_like=True):
    """A model's BLS call: run `request` on another (or the same) model through the core."""

    model_name: str
    model_version: str  # "" = version policy's choice
    request: Request  # request.key is the worker's handle for this call
    timeout_us: int = 0
    decoupled: bool = False
    caller_blocks: bool = False  # exec() from a synchronous execute: the caller's thread waits
    # Outputs may come back as GPU tensors (IPC handles): the caller's preferred_memory is not CPU
    # and it can take them (bls.py decides); otherwise they come back in host memory.
    device_outputs: bool = False


class BlsCancel(msgspec.Struct, tag="bls_cancel", array_like=True):
    key: int


class BlsResponses(msgspec.Struct, tag="bls_responses", array_like=True):
    responses: list[Response]  # Response.key is the BLS call's key


# model control (pb_utils.load_model / unload_model / is_model_ready): worker -> front, reply front -> worker

MODEL_LOAD, MODEL_UNLOAD, MODEL_READY = "load", "unload", "ready"


class ModelControl(msgspec.Struct, tag="model_control", array_like=True, omit_defaults=True):
    key: int  # the worker's handle for this call
    op: str  # MODEL_LOAD, MODEL_UNLOAD or MODEL_READY
    model_name: str
    config: str = ""  # load: JSON config override ("" = none)
    files: dict[str, bytes] = {}  # load: {"file:<path>": contents}
    unload_dependents: bool = False  # unload
    model_version: str = ""  # ready


class ModelControlResult(msgspec.Struct, tag="model_control_result", array_like=True, omit_defaults=True):
    key: int
    error: Optional[str] = None  # the core's message when the call failed
    ready: bool = False  # ready: the answer


# custom metrics (pb_utils.MetricFamily / Metric): worker -> front, replies front -> worker


class MetricOp(msgspec.Struct, array_like=True, omit_defaults=True):
    """One custom-metric operation. Ids are the worker's own handles."""

    op: int  # see METRIC_* below
    id: int
    value: float = 0.0
    key: int = 0  # non-zero: the worker waits for a MetricReply with this key
    family: int = 0  # METRIC_NEW: the family's id
    name: str = ""  # FAMILY_NEW
    description: str = ""  # FAMILY_NEW
    kind: int = 0  # FAMILY_NEW: 0 counter, 1 gauge, 2 histogram
    labels: dict[str, str] = {}  # METRIC_NEW
    buckets: Optional[list[float]] = None  # METRIC_NEW (histograms)


METRIC_FAMILY_NEW, METRIC_FAMILY_DELETE, METRIC_NEW, METRIC_DELETE = 1, 2, 3, 4
METRIC_INCREMENT, METRIC_SET, METRIC_OBSERVE, METRIC_VALUE = 5, 6, 7, 8


class MetricOps(msgspec.Struct, tag="metric_ops", array_like=True):
    ops: list[MetricOp]


class MetricReply(msgspec.Struct, tag="metric_reply", array_like=True):
    key: int
    value: float = 0.0
    error: Optional[str] = None


# both directions: an arena segment was created; its fd follows on the fd channel.


class SegmentAdded(msgspec.Struct, tag="segment", array_like=True):
    segment: int
    size: int


class SegmentRemoved(msgspec.Struct, tag="segment_removed", array_like=True):
    """The sender closed this segment of its arena (it was wholly free for a while): unmap it.

    Its index is never used again, so a message still naming it is an error, not another segment.
    """

    segment: int


ToWorker = Union[
    Initialize, Execute, Cancel, Release, Shutdown, SegmentAdded, SegmentRemoved, BlsResponses, CheckReady, MetricReply,
    SetLog, ModelControlResult, DeviceRelease, DeviceUnmap, LinkAdded, Usage, Gathered,
]
ToFront = Union[
    Started, Ready, Responses, Finalized, SegmentAdded, SegmentRemoved, BlsRequest, BlsCancel, Release, ReadyResult,
    MetricOps, ModelControl, DeviceRelease, Board, UsageReport, Gather,
]


def refuse_undecodable(frame: bytes, error: Exception) -> Optional[Responses]:
    """The answer to a frame the worker could not decode: an error for each request of an Execute,
    read leniently for its keys, and an empty execution record so the front's count of executions
    in flight is undone. None when the frame is not a readable Execute (nothing to answer)."""
    try:
        doc = msgspec.msgpack.decode(frame)
    except msgspec.DecodeError:
        return None
    if not (isinstance(doc, list) and len(doc) >= 2 and doc[0] == "exec" and isinstance(doc[1], list)):
        return None
    keys = [r[0] for r in doc[1] if isinstance(r, list) and r and type(r[0]) is int]
    trace_key = doc[2] if len(doc) > 2 and type(doc[2]) is int else 0
    message = f"the model's worker could not read this request: {error}"
    now = time.monotonic_ns()
    return Responses([Response(k, error=Error("INVALID_ARG", message)) for k in keys],
                     [Execution(0, now, now, now, now, trace_key=trace_key)])


def undecodable_regions(frame: bytes) -> list[tuple[int, int]]:
    """The front-arena regions of the inputs of an Execute frame the worker could not decode, read
    leniently: the worker never made arrays of them, so it gives them back at once."""
    try:
        doc = msgspec.msgpack.decode(frame)
    except msgspec.DecodeError:
        return []
    if not (isinstance(doc, list) and len(doc) >= 2 and doc[0] == "exec" and isinstance(doc[1], list)):
        return []
    regions = []
    for r in doc[1]:
        inputs = r[2] if isinstance(r, list) and len(r) > 2 and isinstance(r[2], list) else ()
        for t in inputs:
            # Tensor: name, datatype, shape, data, segment, offset, ... (trailing defaults omitted)
            if isinstance(t, list) and len(t) > 4 and t[3] is None and type(t[4]) is int and t[4] >= 0:
                offset = t[5] if len(t) > 5 and type(t[5]) is int else 0
                regions.append((t[4], offset))
    return regions

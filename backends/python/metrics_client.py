"""Custom metrics across the process boundary.

Worker side: `MetricsClient`, installed as `pb_utils._metrics_handler`. Metric
operations are fire-and-forget messages, written when they are made (in order);
only creating a family (which can fail on a kind conflict with another
model) and reading a value wait for the front process's answer, and only when
called from the model's thread. Called on the worker's event loop (an
`async def execute`) they cannot wait: a family is then checked against what
this worker knows, and `value()` answers from this worker's own view.

Front side: `handle_ops`, which applies the operations to the server's
kernel.observe.metrics.CustomMetrics on behalf of one worker instance.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading

from kernel.backends.python import messages

log = logging.getLogger("kernel.python")

_OPS = {"increment": messages.METRIC_INCREMENT, "set": messages.METRIC_SET, "observe": messages.METRIC_OBSERVE}
_REPLY_TIMEOUT_S = 30.0


def _on_loop(loop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class MetricsClient:
    def __init__(self, worker) -> None:
        self.worker = worker
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._kinds: dict[str, int] = {}
        self._mirror: dict[int, float] = {}
        self._waiting: dict[int, queue.SimpleQueue] = {}
        self._outbox: list[messages.MetricOp] = []
        self._flush_pending = False

    # ---- pb_utils handler contract ------------------------------------------------

    def family_new(self, name: str, description: str, kind: int) -> int:
        import triton_python_backend_utils as pb_utils

        with self._lock:
            known = self._kinds.get(name)
            fid = next(self._ids)
        if known is not None and known != kind:
            raise pb_utils.TritonModelException(
                "Error when creating MetricFamily: Family name already exists with different type"
            )
        op = messages.MetricOp(messages.METRIC_FAMILY_NEW, fid, name=name, description=description, kind=kind)
        if self._can_wait():
            reply = self._call(op)
            if reply.error:
                raise pb_utils.TritonModelException(f"Error when creating MetricFamily: {reply.error}")
        else:
            self._send(op)
        with self._lock:
            self._kinds[name] = kind
        return fid

    def family_delete(self, family_id: int) -> None:
        self._send(messages.MetricOp(messages.METRIC_FAMILY_DELETE, family_id))

    def metric_new(self, family_id: int, kind: int, labels: dict, buckets) -> int:
        if buckets is not None and not all(a < b for a, b in zip(buckets, buckets[1:])):
            import triton_python_backend_utils as pb_utils

            raise pb_utils.TritonModelException(
                "Error when creating Metric: Failed to process the request for model "
                f"'{self.worker.instance_name}', message: Bucket Boundaries must be strictly sorted"
            )
        with self._lock:
            mid = next(self._ids)
        self._mirror[mid] = 0.0
        self._send(messages.MetricOp(messages.METRIC_NEW, mid, family=family_id, labels=labels, buckets=buckets))
        return mid

    def metric_delete(self, metric_id: int) -> None:
        self._mirror.pop(metric_id, None)
        self._send(messages.MetricOp(messages.METRIC_DELETE, metric_id))

    def update(self, metric_id: int, op: str, value: float) -> None:
        if op == "increment":
            self._mirror[metric_id] = self._mirror.get(metric_id, 0.0) + value
        elif op == "set":
            self._mirror[metric_id] = value
        self._send(messages.MetricOp(_OPS[op], metric_id, value))

    def value(self, metric_id: int) -> float:
        if not self._can_wait():
            return self._mirror.get(metric_id, 0.0)
        reply = self._call(messages.MetricOp(messages.METRIC_VALUE, metric_id))
        if reply.error:
            import triton_python_backend_utils as pb_utils

            raise pb_utils.TritonModelException(f"Failed to get metric value: {reply.error}")
        return reply.value

    # ---- plumbing -------------------------------------------------------------------

    def _call(self, op: messages.MetricOp) -> messages.MetricReply:
        answer: queue.SimpleQueue = queue.SimpleQueue()
        with self._lock:
            op.key = next(self._ids)
            self._waiting[op.key] = answer
        self._send(op)
        if self.worker.pumping_here():
            # A synchronous execute running on the loop: send now, pump until answered.
            self._flush()
            if self.worker.wait_inline(lambda: not answer.empty(), _REPLY_TIMEOUT_S):
                return answer.get()
        else:
            try:
                # _flush doubles as the send a model thread makes while an inline execute holds the loop.
                return self.worker.take_off_loop(answer, self._flush, _REPLY_TIMEOUT_S)
            except queue.Empty:
                pass
        self._waiting.pop(op.key, None)
        return messages.MetricReply(op.key, error="the server did not answer")

    def _send(self, op: messages.MetricOp) -> None:
        with self._lock:
            self._outbox.append(op)
            if self._flush_pending:
                return
            self._flush_pending = True
        # Written at the call, as Triton's stub waits for the server to apply each operation: a model
        # that reads the metrics page right after (its own self-check, over HTTP) sees it applied.
        # A synchronous execute on the loop writes straight to the socket (direct mode); on the loop
        # call_on_loop flushes at once; a model thread's operation leaves with the loop's next turn.
        if self.worker.pumping_here():
            self._flush()
        else:
            self.worker.call_on_loop(self._flush)

    def _can_wait(self) -> bool:
        """Waiting for a reply is possible off the loop, or on it while an inline execute pumps."""
        return self.worker.pumping_here() or not _on_loop(self.worker.loop)

    def _flush(self) -> None:
        with self._lock:
            ops, self._outbox = self._outbox, []
            self._flush_pending = False
        if ops:
            try:
                self.worker.channel.send(messages.MetricOps(ops))
            except (ConnectionError, AttributeError):
                pass

    def on_reply(self, reply: messages.MetricReply) -> None:
        answer = self._waiting.pop(reply.key, None)
        if answer is not None:
            answer.put(reply)


def handle_ops(instance, registry, ops: list[messages.MetricOp]) -> None:
    """Apply a worker's metric operations to the server's CustomMetrics (front process)."""
    from kernel.observe.custom_metrics import MetricError

    for op in ops:
        value = 0.0
        try:
            if registry is None:
                raise MetricError("metrics are not available")
            kind = op.op
            if kind == messages.METRIC_INCREMENT:
                registry.increment(instance, op.id, op.value)
            elif kind == messages.METRIC_SET:
                registry.set(instance, op.id, op.value)
            elif kind == messages.METRIC_OBSERVE:
                registry.observe(instance, op.id, op.value)
            elif kind == messages.METRIC_VALUE:
                value = registry.value(instance, op.id)
            elif kind == messages.METRIC_NEW:
                registry.metric_new(instance, op.id, op.family, op.labels, op.buckets)
            elif kind == messages.METRIC_DELETE:
                registry.metric_delete(instance, op.id)
            elif kind == messages.METRIC_FAMILY_NEW:
                registry.family_new(instance, op.id, op.name, op.description, op.kind)
            elif kind == messages.METRIC_FAMILY_DELETE:
                registry.family_delete(instance, op.id)
        except MetricError as exc:
            if op.key:
                instance.channel.send(messages.MetricReply(op.key, error=str(exc)))
            else:
                log.error("custom metric operation from '%s' failed: %s", instance.name, exc)
            continue
        if op.key:
            instance.channel.send(messages.MetricReply(op.key, value))

"""What a synchronous or asynchronous execute() returned, turned into the requests' responses.

A mixin of the Worker (worker.py): Triton's rules for the return value (a list of one
InferenceResponse or None per request; None from a decoupled model; requests released with
RELEASE_RESCHEDULE), its error messages word for word, and failing every request still open when
execute() raised. Responses go out through the worker's send_response / send_error / _queue.
"""

from __future__ import annotations

import logging

import triton_python_backend_utils as pb_utils
from kernel.backends.python import messages
from kernel.backends.python.worker_log import format_exception

log = logging.getLogger("kernel.worker")


class ExecuteResults:
    def _failed_prefix(self) -> str:
        """How the Python backend frames an error from a model's execute (Triton's words)."""
        return f"Failed to process the request(s) for model '{self.instance_name}', message: "

    def _finish(self, keys, result, exc) -> None:
        if exc is not None:
            message = (
                f"Failed to process the request(s) for model '{self.instance_name}', "
                f"message: {format_exception(exc)}"
            )
            log.error("%s", message)
            self._fail_open(keys, message)
            return
        if result is None:
            # Responses go (or went) through the response senders.
            self._reschedule_released(keys)
            return
        if self.decoupled:
            self._fail_open(
                keys,
                f"Python model '{self.instance_name}' is using the decoupled mode and the "
                "execute function must return None.",
            )
            return
        if not isinstance(result, list):
            self._fail_open(keys, f"{self._failed_prefix()}Expected a list in the execute return, found type '{type(result)}'.")
            return
        if len(result) != len(keys):
            self._fail_open(
                keys,
                f"{self._failed_prefix()}Number of InferenceResponse objects do not match the number of InferenceRequest "
                f"objects. InferenceRequest(s) size is:{len(keys)}, and InferenceResponse(s) size is:{len(result)}\n",
            )
            return
        requests = getattr(keys, "requests", None) or [None] * len(keys)
        for key, response, request in zip(keys, result, requests):
            sink = self.sinks.get(key)
            if sink is None:
                continue
            if request is not None and request._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
                self.sinks.pop(key, None)
                sink.regions = None
                if response is None:
                    self._queue(messages.Response(key, final=True, has_response=False, reschedule=True))
                else:
                    self.send_error(sink, "INTERNAL", (
                        "Expected a None object in the execute function return list for reschduled request, "
                        f"found type '{type(response)}'."))
                continue
            if response is None:
                # As in Triton: this request is answered through its response sender, before
                # execute returned or later (from a thread): nothing to send for it here.
                continue
            try:
                sink.sender._update_state(response, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except pb_utils.TritonModelException as exc:
                self.send_error(sink, "INTERNAL", str(exc))
                continue
            self.send_response(sink, response, True)

    def _fail_open(self, keys, message: str) -> None:
        """Fail every request whose response sender is still open."""
        for sink in [self.sinks[k] for k in keys if k in self.sinks]:
            if not sink.sender._is_closed():
                sink.sender._close()
                self.send_error(sink, "INTERNAL", message)

    def _reschedule_released(self, keys) -> None:
        """Decoupled: requests released with RELEASE_RESCHEDULE before execute returned."""
        for key, request in zip(keys, getattr(keys, "requests", ())):
            if request._release_flags != pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
                continue
            sink = self.sinks.pop(key, None)
            if sink is not None:
                sink.regions = None
                if not sink.sender._is_closed():
                    self._queue(messages.Response(key, final=True, has_response=False, reschedule=True))

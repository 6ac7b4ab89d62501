"""InferenceResponse and InferenceResponseSender: what a model answers with,
and the per-request sender that enforces Triton's sending rules."""

from __future__ import annotations

import threading

from ._errors import TritonError, TritonModelException
from ._parameters import parameters_to_json
from ._tensor import Tensor
from ._types import TRITONSERVER_RESPONSE_COMPLETE_FINAL


class InferenceResponse:
    """``InferenceResponse(output_tensors=[], error=None, parameters=None)``.

    ``parameters`` is a dict with str keys and bool/int/str values;
    ``parameters()`` returns it as a JSON string.
    """

    __slots__ = ("_output_tensors", "_error", "_parameters")

    def __init__(self, output_tensors=(), error=None, parameters=None):
        if output_tensors is None or isinstance(output_tensors, (str, bytes)):
            raise TypeError("output_tensors must be a list of Tensor objects, got "
                            + type(output_tensors).__name__)
        tensors = list(output_tensors)
        for tensor in tensors:
            if tensor is None:
                raise TritonModelException(
                    "Output tensor for inference response should not be empty."
                )
            if not isinstance(tensor, Tensor):
                raise TypeError(
                    "output_tensors must contain Tensor objects, found "
                    + type(tensor).__name__
                )
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(
                "error must be a TritonError or None, found " + type(error).__name__
            )
        self._output_tensors = tensors
        self._error = error
        self._parameters = parameters_to_json(parameters)

    @classmethod
    def _server_side(cls, output_tensors, error=None, parameters_json="{}"):
        """Worker hook: a response from already-validated parts (BLS results).

        ``parameters_json`` is the JSON string ``parameters()`` returns.
        """
        response = cls.__new__(cls)
        response._output_tensors = list(output_tensors)
        response._error = error
        response._parameters = parameters_json
        return response

    def output_tensors(self):
        return self._output_tensors

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error

    def parameters(self):
        return self._parameters

    def _prune_outputs(self, requested_output_names):
        """Worker hook: drop outputs the client did not request (in place)."""
        self._output_tensors = [
            t for t in self._output_tensors if t._name in requested_output_names
        ]

    def __repr__(self):
        return "InferenceResponse(outputs=%s, error=%r)" % (
            [t.name() for t in self._output_tensors], self._error)


class InferenceResponseSender:
    """Sends responses for one request (``request.get_response_sender()``).

    Created by the worker::

        InferenceResponseSender(callback, decoupled, requested_output_names=None)

    * ``callback`` -- object with ``send(response, flags)`` (``response`` is an
      InferenceResponse or None, ``flags`` 0 or
      TRITONSERVER_RESPONSE_COMPLETE_FINAL; outputs are already pruned) and
      ``is_cancelled() -> bool``.  May be None for a sender that cannot send.
    * ``decoupled`` -- whether the model is decoupled.  None means "unknown"
      (requests a model builds for BLS); sending then fails, as in Triton.
    * ``requested_output_names`` -- when given, outputs not named are removed
      from a response before it reaches ``callback``.

    Validation (flags, one-response rule for non-decoupled models, closed
    sender) happens here and raises TritonModelException with Triton's
    messages.  The worker applies the same rules to responses returned from
    ``execute`` through ``_update_state(response, FINAL)``.
    """

    __slots__ = ("_callback", "_decoupled", "_requested", "_closed", "_sent", "_lock")

    def __init__(self, callback, decoupled, requested_output_names=None):
        self._callback = callback
        self._decoupled = decoupled
        self._requested = (
            None if requested_output_names is None else frozenset(requested_output_names)
        )
        self._closed = False
        self._sent = 0
        self._lock = threading.Lock()

    def send(self, response=None, flags=0):
        if response is not None and not isinstance(response, InferenceResponse):
            raise TypeError(
                "send(): 'response' must be an InferenceResponse or None, found "
                + type(response).__name__
            )
        if isinstance(flags, float) or not isinstance(flags, int) or flags < 0:
            raise TypeError("send(): 'flags' must be a non-negative int, got " + repr(flags))
        if flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL and flags != 0:
            raise TritonModelException(
                "Unable to send response. Unsupported flag provided."
            )
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response "
                "flags is set to zero."
            )
        self._update_state(response, flags)
        if response is not None and self._requested is not None:
            response._prune_outputs(self._requested)
        self._callback.send(response, flags)

    def is_cancelled(self):
        if self._callback is None:
            return False
        return bool(self._callback.is_cancelled())

    # -- worker hooks -------------------------------------------------------

    def _update_state(self, response, flags):
        """Account for one response about to be delivered; raises when the
        delivery would break the sender's rules."""
        if self._decoupled is None:
            raise TritonModelException(
                "Unable to send response. Response sender has no reference to "
                "the decoupled state of the model."
            )
        with self._lock:
            if not self._decoupled:
                if response is not None and self._sent > 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot "
                        "send more than one response."
                    )
                if (
                    response is None
                    and flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
                    and self._sent == 0
                ):
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot "
                        "send complete final before sending a response."
                    )
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self._closed = True
            self._sent += 1

    def _close(self):
        """Refuse further sends (e.g. after execute failed)."""
        with self._lock:
            self._closed = True

    def _is_closed(self):
        return self._closed

    def _responses_sent(self):
        return self._sent

"""Blocking clients: ModelClient (HTTP or gRPC) and DecoupledModelClient (gRPC streaming).

Both sit on tritonclient's synchronous clients and take their timeouts from it: HTTP
applies them per client (connection and network timeouts), gRPC per call
(`client_timeout`). That is why an HTTP client holds two tritonclient clients, one
for readiness and configuration calls and one for inference.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Dict, Iterator, Optional

import numpy as np
import tritonclient.grpc
import tritonclient.http
from tritonclient.utils import InferenceServerException

from kernel.client import failures
from kernel.client import request as req
from kernel.client.base import BaseModelClient, Deadline
from kernel.client.exceptions import (
    PyTritonClientInferenceServerError,
    PyTritonClientTimeoutError,
)
from kernel.client.failures import TRANSPORT_ERRORS, infer_failure
from kernel.model_config.triton_model_config import TritonModelConfig

_CONTROL_TIMEOUT_CAP_S = 60.0  # readiness and config calls never wait longer than this each


class ModelClient(BaseModelClient):
    """Synchronous client for one model on a KServe v2 server (Kernel or Triton)."""

    def _start(self) -> None:
        address = self._triton_url.without_scheme
        if self._grpc:
            self._lib = tritonclient.grpc
            self._infer_client = self._control = tritonclient.grpc.InferenceServerClient(address)
            self._infer_kwargs = {"client_timeout": self._inference_timeout_s}
        else:
            self._lib = tritonclient.http
            control_s = min(_CONTROL_TIMEOUT_CAP_S, self._init_timeout_s)
            self._control = tritonclient.http.InferenceServerClient(
                address, connection_timeout=control_s, network_timeout=control_s
            )
            self._infer_client = tritonclient.http.InferenceServerClient(
                address, connection_timeout=self._inference_timeout_s, network_timeout=self._inference_timeout_s
            )
            self._infer_kwargs = {}
        if not self._lazy_init:
            try:
                self._ready_config()
            except BaseException:
                self.close()
                raise

    # ---- lifecycle ---------------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for client in {id(c): c for c in (self._control, self._infer_client)}.values():
            client.close()

    # ---- readiness and configuration ---------------------------------------------------

    def _call_kwargs(self, timeout_s: float) -> dict:
        kwargs = {"headers": self._headers or None}
        if self._grpc:
            kwargs["client_timeout"] = max(min(timeout_s, _CONTROL_TIMEOUT_CAP_S), 0.001)
        return kwargs

    def _answers_yes(self, call, timeout_s: float) -> bool:
        try:
            return bool(call(**self._call_kwargs(timeout_s)))
        except TRANSPORT_ERRORS:
            return False

    @staticmethod
    def _poll(is_ready, timeout_s: float) -> bool:
        """Calls is_ready(remaining_s) until it answers True or timeout_s passes."""
        deadline = Deadline(timeout_s)
        while not is_ready(deadline.remaining_s()):
            pause = deadline.next_pause_s()
            if pause is None:
                return False
            time.sleep(pause)
        return True

    def _model_is_ready(self, timeout_s: float) -> bool:
        control = self._control
        return self._answers_yes(control.is_server_live, timeout_s) and self._answers_yes(
            lambda **kw: control.is_model_ready(self._model_name, self._version, **kw), timeout_s
        )

    def _not_ready_error(self, timeout_s: float):
        """Why the model was not ready in time: unknown to a live server, or just not yet."""
        if not self._answers_yes(self._control.is_server_live, 5.0):
            return failures.server_not_live(self._triton_url.with_scheme, timeout_s)
        try:
            self._control.get_model_metadata(self._model_name, self._version, **self._call_kwargs(5.0))
        except InferenceServerException as exc:
            return failures.unknown_after_wait(self._label, exc.message(), timeout_s)
        except TRANSPORT_ERRORS:
            pass
        return failures.model_not_ready(self._label, timeout_s)

    def wait_for_model(self, timeout_s: float) -> None:
        """Blocks until the server is live and the model ready."""
        self._check_open()
        if not self._poll(self._model_is_ready, timeout_s):
            raise self._not_ready_error(timeout_s)

    def wait_for_server(self, timeout_s: float) -> None:
        """Blocks until the server reports itself live and ready."""
        self._check_open()
        control = self._control

        def server_ready(remaining: float) -> bool:
            return self._answers_yes(control.is_server_live, remaining) and self._answers_yes(
                control.is_server_ready, remaining
            )

        if not self._poll(server_ready, timeout_s):
            raise PyTritonClientTimeoutError(
                f"Server {self._triton_url.with_scheme} did not become ready within {timeout_s} s"
            )

    def _fetch_config(self, timeout_s: float) -> TritonModelConfig:
        try:
            answer = self._control.get_model_config(
                self._model_name, self._version, **self._config_call_kwargs(), **self._call_kwargs(timeout_s)
            )
        except TRANSPORT_ERRORS as exc:
            raise failures.config_failure(exc, self._label) from exc
        return self._config_from_answer(answer)

    def _ready_config(self) -> TritonModelConfig:
        """The model's configuration, once it is known the model is ready (waiting up to init_timeout_s)."""
        self._check_open()
        deadline = Deadline(self._init_timeout_s)
        if not self._ready_checked:
            self.wait_for_model(self._init_timeout_s)
            self._ready_checked = True
        if self._model_config is None:
            self._model_config = self._fetch_config(deadline.remaining_s())
        return self._model_config

    @property
    def model_config(self) -> TritonModelConfig:
        return self._ready_config()

    @property
    def is_batching_supported(self) -> bool:
        return self.model_config.max_batch_size > 0

    # ---- model repository ------------------------------------------------------------

    def load_model(self, config: Optional[str] = None, files: Optional[dict] = None) -> None:
        self._check_open()
        try:
            self._control.load_model(self._model_name, headers=self._headers or None, config=config, files=files)
        except TRANSPORT_ERRORS as exc:
            raise infer_failure(exc, self._model_name, self._init_timeout_s) from exc

    def unload_model(self) -> None:
        self._check_open()
        try:
            self._control.unload_model(self._model_name, headers=self._headers or None)
        except TRANSPORT_ERRORS as exc:
            raise infer_failure(exc, self._model_name, self._init_timeout_s) from exc

    # ---- inference ---------------------------------------------------------------------

    def infer_sample(
        self, *inputs, parameters: req.Parameters = None, headers: req.Parameters = None, **named_inputs
    ):
        """One sample without the batch axis; the axis is added and removed here when the model batches."""
        req.check_call(inputs, named_inputs, parameters, headers)
        config = self._ready_config()
        data, batching = self._sample_inputs(config, inputs, named_inputs)
        return self._run(config, data, parameters, headers, batching)

    def infer_batch(
        self, *inputs, parameters: req.Parameters = None, headers: req.Parameters = None, **named_inputs
    ):
        """A batch: every input carries the batch axis first."""
        req.check_call(inputs, named_inputs, parameters, headers)
        config = self._ready_config()
        return self._run(config, self._batch_inputs(config, inputs, named_inputs), parameters, headers, False)

    def _run(self, config, data, parameters, headers, strip_batch: bool) -> Dict[str, np.ndarray]:
        self._check_decoupled(config, False, "DecoupledModelClient")
        try:
            result = self._infer_client.infer(
                **self._request(config, data, parameters),
                headers=req.merge_headers(self._headers, headers, self._triton_url.scheme),
                **self._infer_kwargs,
            )
        except TRANSPORT_ERRORS as exc:
            raise infer_failure(exc, self._model_name, self._inference_timeout_s) from exc
        arrays = req.result_arrays(result)
        return req.strip_batch_axis(arrays) if strip_batch else arrays


class DecoupledModelClient(ModelClient):
    """Synchronous client for decoupled models: each call returns an iterator of responses (gRPC only).

    inference_timeout_s does not limit the wait for responses: PyTriton 0.7's DecoupledModelClient
    returns every response however long the model takes between them, and programs rely on that."""

    _needs_grpc = True

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: Optional[str] = None,
        *,
        lazy_init: bool = True,
        init_timeout_s: Optional[float] = None,
        inference_timeout_s: Optional[float] = None,
        model_config: Optional[TritonModelConfig] = None,
        ensure_model_is_ready: bool = True,
    ):
        self._stream_lock = threading.Lock()
        self._stream: Optional[_ResponseStream] = None
        super().__init__(
            url,
            model_name,
            model_version,
            lazy_init=lazy_init,
            init_timeout_s=init_timeout_s,
            inference_timeout_s=inference_timeout_s,
            model_config=model_config,
            ensure_model_is_ready=ensure_model_is_ready,
        )

    def close(self) -> None:
        stream = self._stream
        if stream is not None:
            stream.close()
        super().close()

    def _run(self, config, data, parameters, headers, strip_batch: bool) -> Iterator[Dict[str, np.ndarray]]:
        self._check_decoupled(config, True, "ModelClient")
        if not self._stream_lock.acquire(blocking=False):
            raise PyTritonClientInferenceServerError(
                "Inference is already in progress: read the previous call's responses to the end first"
            )
        responses: queue.SimpleQueue = queue.SimpleQueue()
        client = self._infer_client
        stream = self._stream = _ResponseStream(self, responses, strip_batch)
        try:
            client.start_stream(
                callback=lambda result, error: responses.put((result, error)),
                headers=req.merge_headers(self._headers, headers, "grpc"),
            )
            client.async_stream_infer(
                **self._request(config, data, parameters),
                enable_empty_final_response=True,  # tells the end of a request's responses apart
            )
        except BaseException as exc:
            stream.close()
            if isinstance(exc, TRANSPORT_ERRORS):
                cause = _error_from_callback(responses) or exc
                raise infer_failure(cause, self._model_name, self._inference_timeout_s) from cause
            raise
        return stream

    def _end_stream(self, cancel: bool) -> None:
        self._stream = None
        try:
            self._infer_client.stop_stream(cancel_requests=cancel)
        finally:
            self._stream_lock.release()


def _error_from_callback(responses: queue.SimpleQueue) -> Optional[BaseException]:
    """A stream the server ended at once reports why through the callback, not the failed send."""
    try:
        _, error = responses.get(timeout=1.0)
    except queue.Empty:
        return None
    return error


class _ResponseStream:
    """The responses of one decoupled request; closing it early cancels the request."""

    def __init__(self, owner: DecoupledModelClient, responses: queue.SimpleQueue, strip_batch: bool):
        self._owner = owner
        self._responses = responses
        self._strip_batch = strip_batch
        self._open = True

    def __iter__(self):
        return self

    def __next__(self) -> Dict[str, np.ndarray]:
        owner = self._owner
        while self._open:
            # No time limit here, as in PyTriton 0.7: its DecoupledModelClient waits for each response
            # until the stream ends or fails, whatever inference_timeout_s says (a model may think for
            # long between responses). A stream the server or the network breaks reports an error;
            # close() from another thread wakes this wait.
            result, error = self._responses.get()
            if result is None and error is None:
                break  # closed
            if error is not None:
                self.close()
                raise infer_failure(error, owner._model_name, owner._inference_timeout_s) from error
            arrays = req.result_arrays(result)
            if req.is_final(result):
                self._finish(cancel=False)
            if arrays:
                return req.strip_batch_axis(arrays) if self._strip_batch else arrays
        raise StopIteration

    def _finish(self, cancel: bool) -> None:
        if self._open:
            self._open = False
            self._responses.put((None, None))  # wakes a reader blocked in __next__
            self._owner._end_stream(cancel)

    def close(self) -> None:
        """Stops reading; responses still to come are cancelled."""
        self._finish(cancel=True)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report to at garbage collection
            pass

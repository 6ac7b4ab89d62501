"""asyncio clients: AsyncioModelClient (HTTP or gRPC) and AsyncioDecoupledModelClient (gRPC streaming).

The tritonclient aio clients bind to the running event loop when created, so they
are created on first use inside a coroutine rather than in __init__. Inference
timeouts are tritonclient's (HTTP: the aiohttp session timeout; gRPC:
`client_timeout`); readiness and configuration calls are bounded with
asyncio.wait_for against the init timeout.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import AsyncIterator, Dict, Optional

import numpy as np
import tritonclient.grpc.aio
import tritonclient.http.aio
from tritonclient.utils import InferenceServerException

from kernel.client import failures
from kernel.client import request as req
from kernel.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientValueError,
)
from kernel.client.failures import TRANSPORT_ERRORS, infer_failure
from kernel.client.model_config import config_from_json
from kernel.client.sync import DEFAULT_INFERENCE_TIMEOUT_S, DEFAULT_INIT_TIMEOUT_S
from kernel.client.url import TritonUrl
from kernel.model_config.triton_model_config import TritonModelConfig

_FIRST_PAUSE_S, _MAX_PAUSE_S = 0.05, 1.0


class AsyncioModelClient:
    """asyncio client for one model on a KServe v2 server (Kernel or Triton)."""

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
        self._triton_url = TritonUrl.from_url(url)
        self._grpc = self._triton_url.scheme == "grpc"
        self._lib = tritonclient.grpc.aio if self._grpc else tritonclient.http.aio
        self._model_name = model_name
        self._model_version = model_version
        self._init_timeout_s = DEFAULT_INIT_TIMEOUT_S if init_timeout_s is None else float(init_timeout_s)
        self._inference_timeout_s = (
            DEFAULT_INFERENCE_TIMEOUT_S if inference_timeout_s is None else float(inference_timeout_s)
        )
        self._model_config = model_config
        self._ready_checked = model_config is not None and not ensure_model_is_ready
        self._lazy_init = lazy_init
        self._request_ids = itertools.count()
        self._client = None
        self._closed = False

    @classmethod
    def from_existing_client(cls, existing_client: "AsyncioModelClient"):
        """A new client for the same model that reuses the existing one's configuration."""
        return cls(
            existing_client._triton_url.with_scheme,
            existing_client._model_name,
            existing_client._model_version,
            init_timeout_s=existing_client._init_timeout_s,
            inference_timeout_s=existing_client._inference_timeout_s,
            model_config=existing_client._model_config,
            ensure_model_is_ready=existing_client._model_config is None,
        )

    # ---- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self):
        if not self._lazy_init:
            try:
                await self._ready_config()
            except BaseException:
                await self.close()
                raise
        return self

    async def __aexit__(self, *_):
        await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def _connection(self):
        if self._closed:
            raise PyTritonClientClosedError(f"{type(self).__name__} for model {self._model_name} is closed")
        if self._client is None:
            address = self._triton_url.without_scheme
            if self._grpc:
                self._client = tritonclient.grpc.aio.InferenceServerClient(address)
            else:
                self._client = tritonclient.http.aio.InferenceServerClient(
                    address, conn_timeout=self._inference_timeout_s
                )
        return self._client

    # ---- readiness and configuration ---------------------------------------------------

    @property
    def _version(self) -> str:
        return self._model_version or ""

    @property
    def _label(self) -> str:
        version = f" version {self._model_version}" if self._model_version else ""
        return f"{self._model_name}{version} at {self._triton_url.with_scheme}"

    @staticmethod
    async def _answers_yes(call, timeout_s: float) -> bool:
        try:
            return bool(await asyncio.wait_for(call(), max(timeout_s, 0.001)))
        except TRANSPORT_ERRORS:
            return False

    async def _model_is_ready(self, client, timeout_s: float) -> bool:
        return await self._answers_yes(client.is_server_live, timeout_s) and await self._answers_yes(
            lambda: client.is_model_ready(self._model_name, self._version), timeout_s
        )

    async def wait_for_model(self, timeout_s: float) -> None:
        """Waits until the server is live and the model ready."""
        client = self._connection()
        deadline = time.monotonic() + timeout_s
        pause = _FIRST_PAUSE_S
        while not await self._model_is_ready(client, deadline - time.monotonic()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise await self._not_ready_error(client, timeout_s)
            await asyncio.sleep(min(pause, remaining))
            pause = min(pause * 2, _MAX_PAUSE_S)

    async def _not_ready_error(self, client, timeout_s: float):
        if not await self._answers_yes(client.is_server_live, 5.0):
            return failures.server_not_live(self._triton_url.with_scheme, timeout_s)
        try:
            await asyncio.wait_for(client.get_model_metadata(self._model_name, self._version), 5.0)
        except InferenceServerException as exc:
            return failures.model_unavailable(self._label, exc.message())
        except TRANSPORT_ERRORS:
            pass
        return failures.model_not_ready(self._label, timeout_s)

    async def _fetch_config(self, timeout_s: float) -> TritonModelConfig:
        client = self._connection()
        try:
            if self._grpc:
                call = client.get_model_config(self._model_name, self._version, as_json=True)
                doc = (await asyncio.wait_for(call, timeout_s))["config"]
            else:
                doc = await asyncio.wait_for(client.get_model_config(self._model_name, self._version), timeout_s)
        except TRANSPORT_ERRORS as exc:
            raise failures.config_failure(exc, self._label) from exc
        return config_from_json(doc)

    async def _ready_config(self) -> TritonModelConfig:
        self._connection()  # raises once closed
        deadline = time.monotonic() + self._init_timeout_s
        if not self._ready_checked:
            await self.wait_for_model(self._init_timeout_s)
            self._ready_checked = True
        if self._model_config is None:
            self._model_config = await self._fetch_config(max(deadline - time.monotonic(), 0.001))
        return self._model_config

    @property
    async def model_config(self) -> TritonModelConfig:
        return await self._ready_config()

    # ---- inference ---------------------------------------------------------------------

    async def infer_sample(
        self, *inputs, parameters: req.Parameters = None, headers: req.Parameters = None, **named_inputs
    ):
        req.check_call(inputs, named_inputs, parameters, headers)
        config = await self._ready_config()
        data = req.name_inputs(config, inputs, named_inputs)
        batching = config.max_batch_size > 0
        if batching:
            data = req.add_batch_axis(data)
        result = await self._infer(config, data, parameters, headers)
        return req.strip_batch_axis(result) if batching else result

    async def infer_batch(
        self, *inputs, parameters: req.Parameters = None, headers: req.Parameters = None, **named_inputs
    ):
        req.check_call(inputs, named_inputs, parameters, headers)
        config = await self._ready_config()
        _require_batching(config, self._model_name)
        return await self._infer(config, req.name_inputs(config, inputs, named_inputs), parameters, headers)

    async def _infer(self, config, data, parameters, headers) -> Dict[str, np.ndarray]:
        if config.decoupled:
            raise PyTritonClientInferenceServerError(
                f"Model {self._model_name} is decoupled; use AsyncioDecoupledModelClient for it"
            )
        client = self._connection()
        extra = {"client_timeout": self._inference_timeout_s} if self._grpc else {}
        try:
            result = await client.infer(
                self._model_name,
                req.infer_inputs(self._lib, data),
                model_version=self._version,
                outputs=req.requested_outputs(self._lib, config),
                request_id=str(next(self._request_ids)),
                parameters=parameters,
                headers=req.merge_headers({}, headers, self._triton_url.scheme),
                **extra,
            )
        except TRANSPORT_ERRORS as exc:
            raise infer_failure(exc, self._model_name, self._inference_timeout_s) from exc
        return req.result_arrays(result)


def _require_batching(config: TritonModelConfig, model_name: str) -> None:
    if config.max_batch_size <= 0:
        raise PyTritonClientModelDoesntSupportBatchingError(
            f"Model {model_name} does not support batching (max_batch_size is 0); use infer_sample"
        )


class AsyncioDecoupledModelClient(AsyncioModelClient):
    """asyncio client for decoupled models: each call is an async iterator of responses (gRPC only).

    inference_timeout_s bounds the wait for each response, not the whole stream.
    """

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
        if not self._grpc:
            raise PyTritonClientValueError(
                "AsyncioDecoupledModelClient needs a grpc:// url: decoupled models stream over gRPC"
            )

    async def infer_sample(
        self, *inputs, parameters: req.Parameters = None, headers: req.Parameters = None, **named_inputs
    ):
        req.check_call(inputs, named_inputs, parameters, headers)
        config = await self._ready_config()
        data = req.name_inputs(config, inputs, named_inputs)
        batching = config.max_batch_size > 0
        if batching:
            data = req.add_batch_axis(data)
        async for result in self._stream(config, data, parameters, headers):
            yield req.strip_batch_axis(result) if batching else result

    async def infer_batch(
        self, *inputs, parameters: req.Parameters = None, headers: req.Parameters = None, **named_inputs
    ):
        req.check_call(inputs, named_inputs, parameters, headers)
        config = await self._ready_config()
        _require_batching(config, self._model_name)
        async for result in self._stream(config, req.name_inputs(config, inputs, named_inputs), parameters, headers):
            yield result

    async def _stream(self, config, data, parameters, headers) -> AsyncIterator[Dict[str, np.ndarray]]:
        if not config.decoupled:
            raise PyTritonClientInferenceServerError(
                f"Model {self._model_name} is not decoupled; use AsyncioModelClient for it"
            )
        request = {
            "model_name": self._model_name,
            "model_version": self._version,
            "inputs": req.infer_inputs(self._lib, data),
            "outputs": req.requested_outputs(self._lib, config),
            "request_id": str(next(self._request_ids)),
            "parameters": parameters,
        }

        async def one_request():
            yield request

        responses = self._connection().stream_infer(one_request(), headers=req.merge_headers({}, headers, "grpc"))
        try:
            while True:
                try:
                    result, error = await asyncio.wait_for(responses.__anext__(), self._inference_timeout_s)
                except StopAsyncIteration:
                    return  # the server closed the stream: every response has arrived
                except TRANSPORT_ERRORS as exc:
                    raise infer_failure(exc, self._model_name, self._inference_timeout_s) from exc
                if error is not None:
                    raise infer_failure(error, self._model_name, self._inference_timeout_s) from error
                arrays = req.result_arrays(result)
                if arrays:
                    yield arrays
        finally:
            responses.cancel()  # no-op once the call has ended; cancels the request if we stop early

"""asyncio clients: AsyncioModelClient (HTTP or gRPC) and AsyncioDecoupledModelClient (gRPC streaming).

The tritonclient aio clients bind to the running event loop when created, so they
are created on first use inside a coroutine rather than in __init__. Inference
timeouts are tritonclient's (HTTP: the aiohttp session timeout; gRPC:
`client_timeout`); readiness and configuration calls are bounded with
asyncio.wait_for against the init timeout.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Dict, Optional

import numpy as np
import tritonclient.grpc.aio
import tritonclient.http.aio
from tritonclient.utils import InferenceServerException

from kernel.client import failures
from kernel.client import request as req
from kernel.client.base import BaseModelClient, Deadline
from kernel.client.exceptions import PyTritonClientTimeoutError
from kernel.client.failures import TRANSPORT_ERRORS, infer_failure
from kernel.model_config.triton_model_config import TritonModelConfig


class AsyncioModelClient(BaseModelClient):
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

    @staticmethod
    def _copied_access_token(existing_client: BaseModelClient) -> dict:
        return {}  # the asyncio clients take no access_token

    def _start(self) -> None:
        self._lib = tritonclient.grpc.aio if self._grpc else tritonclient.http.aio
        self._client = None  # made by _connection(), inside the event loop it binds to

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
        self._check_open()
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
        deadline = Deadline(timeout_s)
        while not await self._model_is_ready(client, deadline.remaining_s()):
            pause = deadline.next_pause_s()
            if pause is None:
                raise await self._not_ready_error(client, timeout_s)
            await asyncio.sleep(pause)

    async def _not_ready_error(self, client, timeout_s: float):
        if not await self._answers_yes(client.is_server_live, 5.0):
            return failures.server_not_live(self._triton_url.with_scheme, timeout_s)
        try:
            await asyncio.wait_for(client.get_model_metadata(self._model_name, self._version), 5.0)
        except InferenceServerException as exc:
            return failures.unknown_after_wait(self._label, exc.message(), timeout_s)
        except TRANSPORT_ERRORS:
            pass
        return failures.model_not_ready(self._label, timeout_s)

    async def _fetch_config(self, timeout_s: float) -> TritonModelConfig:
        call = self._connection().get_model_config(self._model_name, self._version, **self._config_call_kwargs())
        try:
            answer = await asyncio.wait_for(call, timeout_s)
        except TRANSPORT_ERRORS as exc:
            raise failures.config_failure(exc, self._label) from exc
        return self._config_from_answer(answer)

    async def _ready_config(self) -> TritonModelConfig:
        self._check_open()
        deadline = Deadline(self._init_timeout_s)
        if not self._ready_checked:
            await self.wait_for_model(self._init_timeout_s)
            self._ready_checked = True
        if self._model_config is None:
            self._model_config = await self._fetch_config(deadline.remaining_s())
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
        data, batching = self._sample_inputs(config, inputs, named_inputs)
        result = await self._infer(config, data, parameters, headers)
        return req.strip_batch_axis(result) if batching else result

    async def infer_batch(
        self, *inputs, parameters: req.Parameters = None, headers: req.Parameters = None, **named_inputs
    ):
        req.check_call(inputs, named_inputs, parameters, headers)
        config = await self._ready_config()
        return await self._infer(config, self._batch_inputs(config, inputs, named_inputs), parameters, headers)

    async def _infer(self, config, data, parameters, headers) -> Dict[str, np.ndarray]:
        self._check_decoupled(config, False, "AsyncioDecoupledModelClient")
        client = self._connection()
        extra = {"client_timeout": self._inference_timeout_s} if self._grpc else {}
        try:
            result = await client.infer(
                **self._request(config, data, parameters),
                headers=req.merge_headers(self._headers, headers, self._triton_url.scheme),
                **extra,
            )
        except TRANSPORT_ERRORS as exc:
            raise infer_failure(exc, self._model_name, self._inference_timeout_s) from exc
        return req.result_arrays(result)


class AsyncioDecoupledModelClient(AsyncioModelClient):
    """asyncio client for decoupled models: each call is an async iterator of responses (gRPC only).

    inference_timeout_s bounds the wait for each response, not the whole stream (as PyTriton 0.7's
    asyncio client does; its blocking DecoupledModelClient sets no limit at all).
    """

    _needs_grpc = True

    async def infer_sample(
        self, *inputs, parameters: req.Parameters = None, headers: req.Parameters = None, **named_inputs
    ):
        req.check_call(inputs, named_inputs, parameters, headers)
        config = await self._ready_config()
        data, batching = self._sample_inputs(config, inputs, named_inputs)
        async for result in self._stream(config, data, parameters, headers):
            yield req.strip_batch_axis(result) if batching else result

    async def infer_batch(
        self, *inputs, parameters: req.Parameters = None, headers: req.Parameters = None, **named_inputs
    ):
        req.check_call(inputs, named_inputs, parameters, headers)
        config = await self._ready_config()
        async for result in self._stream(config, self._batch_inputs(config, inputs, named_inputs), parameters, headers):
            yield result

    async def _stream(self, config, data, parameters, headers) -> AsyncIterator[Dict[str, np.ndarray]]:
        self._check_decoupled(config, True, "AsyncioModelClient")
        request = self._request(config, data, parameters)

        async def one_request():
            yield request

        responses = self._connection().stream_infer(
            one_request(), headers=req.merge_headers(self._headers, headers, "grpc")
        )
        try:
            while True:
                try:
                    result, error = await asyncio.wait_for(responses.__anext__(), self._inference_timeout_s)
                except StopAsyncIteration:
                    return  # the server closed the stream: every response has arrived
                except asyncio.TimeoutError:
                    raise PyTritonClientTimeoutError(  # PyTriton 0.7's words for this wait
                        f"Timeout while waiting for model {self._model_name} to return next response "
                        f"{self._inference_timeout_s}s"
                    ) from None
                except TRANSPORT_ERRORS as exc:
                    raise infer_failure(exc, self._model_name, self._inference_timeout_s) from exc
                if error is not None:
                    raise infer_failure(error, self._model_name, self._inference_timeout_s) from error
                arrays = req.result_arrays(result)
                if arrays:
                    yield arrays
        finally:
            responses.cancel()  # no-op once the call has ended; cancels the request if we stop early

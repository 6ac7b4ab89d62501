"""BaseModelClient: what the blocking and asyncio clients share, everything but the I/O.

Settings and their defaults, the model's label in messages, the closed check, turning a
call's arguments into a tritonclient request, and the deadline arithmetic of readiness
polling. ModelClient (sync.py) and AsyncioModelClient (aio.py) add how they wait and talk.
"""

from __future__ import annotations

import itertools
import time
from typing import Dict, Optional, Tuple

import numpy as np

from kernel.client import request as req
from kernel.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientValueError,
)
from kernel.client.model_config import config_from_json
from kernel.client.url import TritonUrl
from kernel.model_config.triton_model_config import TritonModelConfig

DEFAULT_INIT_TIMEOUT_S = 300.0
DEFAULT_INFERENCE_TIMEOUT_S = 60.0
_FIRST_PAUSE_S, _MAX_PAUSE_S = 0.05, 1.0  # readiness polling backs off between these
_MIN_TIMEOUT_S = 0.001  # a call bounded by a spent deadline still gets a (failing) chance


class Deadline:
    """When a wait must end, and the growing pauses of a readiness poll until then."""

    def __init__(self, timeout_s: float):
        self._at = time.monotonic() + timeout_s
        self._pause = _FIRST_PAUSE_S

    def remaining_s(self) -> float:
        return max(self._at - time.monotonic(), _MIN_TIMEOUT_S)

    def next_pause_s(self) -> Optional[float]:
        """How long to wait before polling again (doubling each time); None once the deadline has passed."""
        left = self._at - time.monotonic()
        if left <= 0:
            return None
        pause = min(self._pause, left)
        self._pause = min(self._pause * 2, _MAX_PAUSE_S)
        return pause


class BaseModelClient:
    """Settings and request building shared by every client of one model."""

    # Decoupled clients read response streams, which only gRPC carries.
    _needs_grpc = False

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
        access_token: Optional[str] = None,
    ):
        self._triton_url = TritonUrl.from_url(url)
        self._grpc = self._triton_url.scheme == "grpc"
        if self._needs_grpc and not self._grpc:
            raise PyTritonClientValueError(
                f"{type(self).__name__} needs a grpc:// url: decoupled models stream over gRPC"
            )
        self._model_name = model_name
        self._model_version = model_version
        self._init_timeout_s = DEFAULT_INIT_TIMEOUT_S if init_timeout_s is None else float(init_timeout_s)
        self._inference_timeout_s = (
            DEFAULT_INFERENCE_TIMEOUT_S if inference_timeout_s is None else float(inference_timeout_s)
        )
        self._headers = req.auth_headers(access_token, self._triton_url.scheme)
        self._model_config = model_config
        # A config handed in by the caller may skip the readiness check, never a fetched one.
        self._ready_checked = model_config is not None and not ensure_model_is_ready
        self._lazy_init = lazy_init
        self._request_ids = itertools.count()
        self._closed = False
        self._start()

    def _start(self) -> None:
        """Transport set-up at the end of __init__: must set `_lib`, the tritonclient module to build requests with."""
        raise NotImplementedError

    @classmethod
    def from_existing_client(cls, existing_client: "BaseModelClient"):
        """A new client for the same model that reuses the existing one's configuration."""
        return cls(
            existing_client._triton_url.with_scheme,
            existing_client._model_name,
            existing_client._model_version,
            init_timeout_s=existing_client._init_timeout_s,
            inference_timeout_s=existing_client._inference_timeout_s,
            model_config=existing_client._model_config,
            ensure_model_is_ready=existing_client._model_config is None,
            **cls._copied_access_token(existing_client),
        )

    @staticmethod
    def _copied_access_token(existing_client: "BaseModelClient") -> dict:
        """access_token= for a copy of existing_client, when that one sends a token."""
        headers = existing_client._headers
        token = headers.get(req.ACCESS_TOKEN_HEADER) or headers.get(req.GRPC_HEADER_PREFIX + req.ACCESS_TOKEN_HEADER)
        return {"access_token": token} if token else {}

    def _check_open(self) -> None:
        if self._closed:
            raise PyTritonClientClosedError(f"{type(self).__name__} for model {self._model_name} is closed")

    @property
    def _version(self) -> str:
        return self._model_version or ""

    @property
    def _label(self) -> str:
        version = f" version {self._model_version}" if self._model_version else ""
        return f"{self._model_name}{version} at {self._triton_url.with_scheme}"

    # ---- model configuration ------------------------------------------------------------

    def _config_call_kwargs(self) -> dict:
        return {"as_json": True} if self._grpc else {}

    def _config_from_answer(self, answer: dict) -> TritonModelConfig:
        """The config from a get_model_config answer (gRPC wraps it in {"config": ...})."""
        return config_from_json(answer["config"] if self._grpc else answer)

    # ---- building a request -------------------------------------------------------------

    def _sample_inputs(self, config: TritonModelConfig, inputs, named_inputs) -> Tuple[Dict[str, np.ndarray], bool]:
        """One sample's inputs by name, with the batch axis added when the model batches; and whether it does."""
        data = req.name_inputs(config, inputs, named_inputs)
        batching = config.max_batch_size > 0
        return (req.add_batch_axis(data) if batching else data), batching

    def _batch_inputs(self, config: TritonModelConfig, inputs, named_inputs) -> Dict[str, np.ndarray]:
        if config.max_batch_size <= 0:
            raise PyTritonClientModelDoesntSupportBatchingError(
                f"Model {self._model_name} does not support batching (max_batch_size is 0); use infer_sample"
            )
        return req.name_inputs(config, inputs, named_inputs)

    def _check_decoupled(self, config: TritonModelConfig, decoupled: bool, use_instead: str) -> None:
        """Ordinary and decoupled models need different clients; say which one to use."""
        if config.decoupled != decoupled:
            kind = "decoupled" if config.decoupled else "not decoupled"
            raise PyTritonClientInferenceServerError(f"Model {self._model_name} is {kind}; use {use_instead} for it")

    def _request(self, config: TritonModelConfig, data: Dict[str, np.ndarray], parameters) -> dict:
        """The arguments every tritonclient infer call (and gRPC stream request) takes, by keyword."""
        return {
            "model_name": self._model_name,
            "inputs": req.infer_inputs(self._lib, data),
            "model_version": self._version,
            "outputs": req.requested_outputs(self._lib, config),
            "request_id": str(next(self._request_ids)),
            "parameters": parameters,
        }

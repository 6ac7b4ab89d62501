"""Turns what tritonclient, grpc, sockets and aiohttp raise into the clients' own errors."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import grpc
from tritonclient.utils import InferenceServerException

from kernel.client.exceptions import (
    PyTritonClientError,
    PyTritonClientInferenceServerError,
    PyTritonClientModelNotReadyError,
    PyTritonClientModelUnavailableError,
    PyTritonClientTimeoutError,
)

_TIMEOUTS = (TimeoutError, asyncio.TimeoutError, socket.timeout)
# What a request raises when it cannot reach the server at all; PyTriton reports these as timeouts.
_UNREACHABLE = (OSError, aiohttp.ClientConnectionError)
# Everything the libraries raise for a failed call, for `except` clauses.
TRANSPORT_ERRORS = (InferenceServerException, grpc.RpcError, *_TIMEOUTS, *_UNREACHABLE)


def infer_failure(exc: BaseException, model: str, timeout_s: float) -> PyTritonClientError:
    """The client error for an inference call that raised `exc`."""
    if isinstance(exc, InferenceServerException):
        status, message = str(exc.status() or ""), exc.message() or str(exc)
    elif isinstance(exc, grpc.RpcError):
        status, message = str(exc.code()), exc.details() or str(exc)
    elif isinstance(exc, _TIMEOUTS):
        return PyTritonClientTimeoutError(f"Model {model} did not answer within {timeout_s} s")
    elif isinstance(exc, _UNREACHABLE):
        return PyTritonClientTimeoutError(f"Cannot reach the server for model {model}: {exc}")
    else:
        return PyTritonClientInferenceServerError(f"Inference request to model {model} failed: {exc!r}")
    if "DEADLINE_EXCEEDED" in status:
        return PyTritonClientTimeoutError(f"Model {model} did not answer within {timeout_s} s ({message})")
    return PyTritonClientInferenceServerError(f"Inference request to model {model} failed: {message}")


def server_not_live(url: str, timeout_s: float) -> PyTritonClientTimeoutError:
    return PyTritonClientTimeoutError(f"Server {url} did not become live within {timeout_s} s")


def model_unavailable(label: str, server_message: str) -> PyTritonClientModelUnavailableError:
    return PyTritonClientModelUnavailableError(f"Model {label} is unavailable: {server_message}")


def unknown_after_wait(label: str, server_message: str, timeout_s: float) -> PyTritonClientModelNotReadyError:
    """A model the server does not know, after init_timeout_s of waiting: a timeout, as PyTriton raises."""
    return PyTritonClientModelNotReadyError(
        f"Model {label} did not become ready within {timeout_s} s: it is unavailable: {server_message}"
    )


def model_not_ready(label: str, timeout_s: float) -> PyTritonClientTimeoutError:
    return PyTritonClientTimeoutError(f"Model {label} did not become ready within {timeout_s} s")


def config_failure(exc: BaseException, label: str) -> PyTritonClientError:
    """The client error for a model-configuration request that raised `exc`."""
    if isinstance(exc, InferenceServerException) and "DEADLINE_EXCEEDED" not in str(exc.status()):
        return model_unavailable(label, exc.message())
    return PyTritonClientTimeoutError(f"No configuration for model {label}: {exc!r}")

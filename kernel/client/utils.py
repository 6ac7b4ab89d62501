"""Helpers around plain tritonclient clients (`pytriton.client.utils` -> `kernel.client.utils`).

Programs written for PyTriton use these to make a tritonclient client from a url, wait
for a server or a model to become ready, and read a model's state or configuration. They
take tritonclient's own synchronous HTTP and gRPC clients, so they work against any KServe
v2 server (Kernel, real Triton); names, signatures, defaults and errors are PyTriton 0.7's.
"""

from __future__ import annotations

import enum
import logging
import pathlib
import socket
import time
import warnings
from typing import Dict, Optional, Tuple, Union

import tritonclient.grpc
import tritonclient.http
from grpc import RpcError
from tritonclient.utils import InferenceServerException

from kernel.client.exceptions import PyTritonClientInvalidUrlError, PyTritonClientTimeoutError
from kernel.client.model_config import config_from_json
from kernel.client.url import DEFAULT_GRPC_PORT, DEFAULT_HTTP_PORT, TritonUrl
from kernel.client.warnings import NotSupportedTimeoutWarning
from kernel.model_config.triton_model_config import TritonModelConfig

__all__ = [
    "DEFAULT_GRPC_PORT", "DEFAULT_HTTP_PORT", "InferenceServerException", "LATEST_MODEL_VERSION", "ModelConfigParser",
    "ModelState", "NotSupportedTimeoutWarning", "PyTritonClientInvalidUrlError", "PyTritonClientTimeoutError",
    "RpcError", "TritonUrl", "create_client_from_url", "get_model_config", "get_model_state", "parse_grpc_response",
    "parse_http_response", "wait_for_model_ready", "wait_for_server_ready",
]

LOGGER = logging.getLogger("kernel.client.utils")

#: How a message names "the newest version" when the caller gave none.
LATEST_MODEL_VERSION = "<latest>"

DEFAULT_NETWORK_TIMEOUT_S = 60.0
DEFAULT_WAIT_FOR_SERVER_READY_TIMEOUT_S = 60.0
DEFAULT_WAIT_FOR_MODEL_TIMEOUT_S = 300.0
_POLL_S = 1.0  # pause between readiness checks (at most)

SyncClient = Union[tritonclient.grpc.InferenceServerClient, tritonclient.http.InferenceServerClient]


class ModelState(enum.Enum):
    """A model version's state as the repository index reports it."""

    LOADING = "LOADING"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"
    READY = "READY"


class ModelConfigParser:
    """Reads a model configuration (protobuf JSON as servers report it, or a config.pbtxt) as a TritonModelConfig."""

    @classmethod
    def from_dict(cls, model_config_dict: Dict) -> TritonModelConfig:
        return config_from_json(model_config_dict)

    @classmethod
    def from_file(cls, *, config_path: pathlib.Path) -> TritonModelConfig:
        from google.protobuf import json_format, text_format

        from kernel.protos import model_config_pb2

        message = text_format.Parse(pathlib.Path(config_path).read_text(), model_config_pb2.ModelConfig())
        return cls.from_dict(json_format.MessageToDict(message, preserving_proto_field_name=True))


def _states(entries) -> Dict[Tuple[str, str], ModelState]:
    """(name, version) -> state for the index entries that name a version; no state yet reads as LOADING."""
    states = {}
    for name, version, state in entries:
        LOGGER.debug("repository index entry: name=%s version=%s state=%s", name, version, state)
        if version:
            states[(name, version)] = ModelState(state) if state else ModelState.LOADING
    return states


def parse_http_response(models) -> Dict[Tuple[str, str], ModelState]:
    """States from an HTTP repository index (the list of dicts tritonclient.http returns)."""
    return _states((m.get("name"), m.get("version"), m.get("state")) for m in models)


def parse_grpc_response(models) -> Dict[Tuple[str, str], ModelState]:
    """States from a gRPC repository index (the `models` of tritonclient.grpc's answer)."""
    return _states((m.name, m.version, m.state) for m in models)


def get_model_state(
    client: SyncClient,
    model_name: str,
    model_version: Optional[str] = None,
    headers: Optional[dict] = None,
) -> ModelState:
    """The state of a model version (the numerically highest one when model_version is None); UNAVAILABLE
    when the repository index does not list it."""
    index = client.get_model_repository_index(headers=headers)
    states = parse_http_response(index) if isinstance(index, list) else parse_grpc_response(index.models)
    if model_version is not None:
        return states.get((model_name, model_version), ModelState.UNAVAILABLE)
    versions = [(int(version), state) for (name, version), state in states.items() if name == model_name]
    if not versions:
        return ModelState.UNAVAILABLE
    return max(versions, key=lambda item: item[0])[1]


def get_model_config(
    client: SyncClient,
    model_name: str,
    model_version: Optional[str] = None,
    timeout_s: Optional[float] = None,
    headers: Optional[dict] = None,
) -> TritonModelConfig:
    """The model's configuration, once it is ready (waits up to timeout_s, default 300 s).

    Raises PyTritonClientTimeoutError when the server or model is not ready in time.
    """
    wait_for_model_ready(client, model_name=model_name, model_version=model_version, timeout_s=timeout_s,
                         headers=headers)
    version = model_version or ""
    if isinstance(client, tritonclient.grpc.InferenceServerClient):
        doc = client.get_model_config(model_name, version, as_json=True, headers=headers)["config"]
    else:
        doc = client.get_model_config(model_name, version, headers=headers)
    return ModelConfigParser.from_dict(doc)


def wait_for_server_ready(
    client: SyncClient,
    timeout_s: Optional[float] = None,
    headers: Optional[dict] = None,
) -> None:
    """Poll until the server reports live and ready (default 60 s); connection errors count as not ready.

    Raises PyTritonClientTimeoutError when it is not ready in time.
    """
    timeout_s = DEFAULT_WAIT_FOR_SERVER_READY_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s

    def ready() -> bool:
        try:
            return bool(client.is_server_ready(headers=headers) and client.is_server_live(headers=headers))
        except (InferenceServerException, RpcError, ConnectionError, socket.gaierror):
            return False

    LOGGER.debug("waiting up to %s s for the server to be ready", timeout_s)
    while not ready():
        left = deadline - time.monotonic()
        if left <= 0:
            raise PyTritonClientTimeoutError("Waiting for server to be ready timed out.")
        time.sleep(min(_POLL_S, left))


def wait_for_model_ready(
    client: SyncClient,
    model_name: str,
    model_version: Optional[str] = None,
    timeout_s: Optional[float] = None,
    headers: Optional[dict] = None,
) -> None:
    """Poll until the server and then the model (its newest version when none is given) are ready
    (default 300 s in all). Raises PyTritonClientTimeoutError when they are not ready in time."""
    version = model_version or ""
    shown = version or LATEST_MODEL_VERSION
    timeout_s = DEFAULT_WAIT_FOR_MODEL_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    wait_for_server_ready(client, timeout_s=timeout_s, headers=headers)
    LOGGER.debug("waiting for model %s/%s to be ready", model_name, shown)
    while not client.is_model_ready(model_name, version, headers=headers):
        left = deadline - time.monotonic()
        if left <= 0:
            raise PyTritonClientTimeoutError(f"Waiting for model {model_name}/{shown} to be ready timed out.")
        time.sleep(min(_POLL_S, left))


def create_client_from_url(url: str, network_timeout_s: Optional[float] = None) -> SyncClient:
    """A tritonclient client for `url` ("host[:port]" means HTTP; default ports 8000 / 8001).

    network_timeout_s bounds HTTP connections and calls (tritonclient's own default when None).
    tritonclient.grpc cannot bound calls other than infer, so for grpc:// urls it is ignored with a
    NotSupportedTimeoutWarning. Raises PyTritonClientInvalidUrlError for a url it cannot use.
    """
    parsed = TritonUrl.from_url(url)
    if parsed.scheme == "grpc":
        shown = DEFAULT_NETWORK_TIMEOUT_S if network_timeout_s is None else network_timeout_s
        warnings.warn(
            f"tritonclient.grpc doesn't support timeout for other commands than infer. Ignoring network_timeout: "
            f"{shown}.",
            NotSupportedTimeoutWarning,
            stacklevel=2,
        )
        return tritonclient.grpc.InferenceServerClient(parsed.without_scheme)
    kwargs = {}
    if network_timeout_s is not None:
        kwargs = {"connection_timeout": network_timeout_s, "network_timeout": network_timeout_s}
    return tritonclient.http.InferenceServerClient(parsed.without_scheme, **kwargs)

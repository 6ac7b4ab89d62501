"""TritonConfig, TritonSecurityConfig and TritonLifecyclePolicy (`pytriton.triton` names).

A TritonConfig holds tritonserver's options (all None = the server's default).
`server_argv()` turns the ones that are set into `kernel serve` flags, so an
option behaves exactly as the same flag does on the command line; options that
only tune Triton's C++ internals, or name features Kernel does not have, are
accepted and reported once in the log.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import re
import secrets
import typing
from typing import Any, Dict, List, Optional

from kernel.exceptions import PyTritonValidationError

LOGGER = logging.getLogger("kernel.triton")

ENV_PREFIX = "PYTRITON_TRITON_CONFIG_"

# Endpoint groups tritonserver can restrict, and those PyTriton 0.7 restricts by default.
VALID_TRITON_ENDPOINTS = {
    "health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics",
    "trace", "logging",
}
DEFAULT_PROTECTED_ENDPOINTS = ["shared-memory", "model-repository", "statistics", "trace", "logging"]
TRITON_ACCESS_HEADER = "triton-access-token"


@dataclasses.dataclass(kw_only=True)
class TritonConfig:
    """tritonserver options for a Triton() object; None leaves the server's default."""

    model_repository: Optional[pathlib.Path] = None
    id: Optional[str] = None
    log_verbose: Optional[int] = None
    log_file: Optional[pathlib.Path] = None
    exit_timeout_secs: Optional[int] = None
    exit_on_error: Optional[bool] = None
    strict_readiness: Optional[bool] = None
    allow_http: Optional[bool] = None
    http_address: Optional[str] = None
    http_port: Optional[int] = None
    http_header_forward_pattern: Optional[str] = None
    http_thread_count: Optional[int] = None
    http_restricted_api: Optional[str] = None
    allow_grpc: Optional[bool] = None
    grpc_address: Optional[str] = None
    grpc_port: Optional[int] = None
    grpc_header_forward_pattern: Optional[str] = None
    grpc_infer_allocation_pool_size: Optional[int] = None
    grpc_use_ssl: Optional[bool] = None
    grpc_use_ssl_mutual: Optional[bool] = None
    grpc_server_cert: Optional[pathlib.Path] = None
    grpc_server_key: Optional[pathlib.Path] = None
    grpc_root_cert: Optional[pathlib.Path] = None
    grpc_infer_response_compression_level: Optional[str] = None
    grpc_keepalive_time: Optional[int] = None
    grpc_keepalive_timeout: Optional[int] = None
    grpc_keepalive_permit_without_calls: Optional[bool] = None
    grpc_http2_max_pings_without_data: Optional[int] = None
    grpc_http2_min_recv_ping_interval_without_data: Optional[int] = None
    grpc_http2_max_ping_strikes: Optional[int] = None
    grpc_restricted_protocol: Optional[str] = None
    allow_metrics: Optional[bool] = None
    allow_gpu_metrics: Optional[bool] = None
    allow_cpu_metrics: Optional[bool] = None
    metrics_interval_ms: Optional[int] = None
    metrics_port: Optional[int] = None
    metrics_address: Optional[str] = None
    allow_sagemaker: Optional[bool] = None
    sagemaker_port: Optional[int] = None
    sagemaker_safe_port_range: Optional[str] = None
    sagemaker_thread_count: Optional[int] = None
    allow_vertex_ai: Optional[bool] = None
    vertex_ai_port: Optional[int] = None
    vertex_ai_thread_count: Optional[int] = None
    vertex_ai_default_model: Optional[str] = None
    metrics_config: Optional[List[str]] = None
    trace_config: Optional[List[str]] = None
    cache_config: Optional[List[str]] = None
    cache_directory: Optional[str] = None
    buffer_manager_thread_count: Optional[int] = None
    #: Processes of this user on this host may bind models with RemoteTriton (None: yes, as in PyTriton;
    #: False turns it off). Kernel's own field; `kernel serve` needs --allow-remote-binding instead.
    allow_remote_binding: Optional[bool] = None
    #: Kernel's own: serve the OpenAI-compatible API on this port (`kernel serve --openai-port`; off when None).
    openai_port: Optional[int] = None
    #: Kernel's own: the address of the OpenAI-compatible API (None: http_address).
    openai_address: Optional[str] = None

    def __post_init__(self):
        if self.allow_http not in (True, None) and self.allow_grpc not in (True, None):
            raise PyTritonValidationError("The `http` or `grpc` endpoint has to be allowed.")

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, config: Dict[str, Any]) -> "TritonConfig":
        """A TritonConfig from a dict of (possibly string) values; unknown names are warned about and ignored."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        known = {}
        for name, value in config.items():
            if name not in fields:
                LOGGER.warning(
                    "Ignoring %s=%s: TritonConfig has no such field (fields: %s)", name, value, ", ".join(fields)
                )
                continue
            known[name] = _convert(name, _field_type(cls, name), value)
        return cls(**known)

    @classmethod
    def from_env(cls) -> "TritonConfig":
        """A TritonConfig from PYTRITON_TRITON_CONFIG_<FIELD> variables.

        List fields take a comma-separated value or numbered variables
        (PYTRITON_TRITON_CONFIG_METRICS_CONFIG_0, _1, ...).
        """
        list_fields = {f.name for f in dataclasses.fields(cls) if _is_list(_field_type(cls, f.name))}
        values: Dict[str, Any] = {}
        indexed: Dict[str, Dict[int, str]] = {}
        for name, value in os.environ.items():
            if not name.startswith(ENV_PREFIX):
                continue
            key = name[len(ENV_PREFIX):].lower()
            match = re.fullmatch(r"(.+?)_(\d+)", key)
            if match and match.group(1) in list_fields:
                indexed.setdefault(match.group(1), {})[int(match.group(2))] = value
            else:
                values[key] = value
        for key, items in indexed.items():
            values[key] = [items[i] for i in sorted(items)]
        return cls.from_dict(values)


_TYPE_CACHE: Dict[str, Any] = {}


def _field_type(cls, name: str):
    if not _TYPE_CACHE:
        _TYPE_CACHE.update(typing.get_type_hints(cls))
    return _TYPE_CACHE[name]


def _is_list(hint) -> bool:
    return any(typing.get_origin(a) in (list, List) for a in typing.get_args(hint))


def _convert(name: str, hint, value: Any) -> Any:
    if value is None:
        return None
    target = next(a for a in typing.get_args(hint) if a is not type(None))
    try:
        if typing.get_origin(target) in (list, List):
            if isinstance(value, str):
                return [v for v in value.split(",") if v]
            return [str(v) for v in value]
        if target is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
            raise ValueError(f"expected true or false, got '{value}'")
        return target(value)
    except (TypeError, ValueError) as exc:
        raise PyTritonValidationError(f"Invalid value {value!r} for TritonConfig.{name}: {exc}") from None


@dataclasses.dataclass
class TritonLifecyclePolicy:
    """When the server starts (on entering the context, or at run()/serve()) and where models are stored."""

    launch_triton_on_startup: bool = True
    local_model_store: bool = False


DefaultTritonLifecyclePolicy = TritonLifecyclePolicy()
VertextAILifecyclePolicy = TritonLifecyclePolicy(launch_triton_on_startup=False, local_model_store=True)


@dataclasses.dataclass
class TritonSecurityConfig:
    """Token-protected endpoints: requests to them must carry header `triton-access-token: <token>`.

    restricted_endpoints None protects PyTriton's defaults (shared-memory,
    model-repository, statistics, trace, logging) with a generated token; []
    protects nothing.
    """

    access_token: Optional[str] = None
    restricted_endpoints: Optional[List[str]] = None

    def __post_init__(self):
        if self.restricted_endpoints is None:
            self.restricted_endpoints = list(DEFAULT_PROTECTED_ENDPOINTS)
        invalid = set(self.restricted_endpoints) - VALID_TRITON_ENDPOINTS
        if invalid:
            raise PyTritonValidationError(
                f"Invalid endpoint names: {', '.join(sorted(invalid))}. "
                f"Valid endpoints are: {', '.join(sorted(VALID_TRITON_ENDPOINTS))}"
            )
        if self.access_token is None and self.restricted_endpoints:
            self.access_token = secrets.token_urlsafe(32)


def merged_config(config: Optional[TritonConfig]) -> TritonConfig:
    """Explicit values over PYTRITON_TRITON_CONFIG_* over defaults, as PyTriton resolves them."""
    def set_values(c: TritonConfig) -> Dict[str, Any]:
        return {k: v for k, v in c.to_dict().items() if v is not None}

    merged = {**set_values(TritonConfig.from_env()), **(set_values(config) if config else {})}
    return TritonConfig(**merged)


# ---- to `kernel serve` flags ------------------------------------------------------------------

_warned: set[str] = set()


def _warn_once(field: str, why: str) -> None:
    if field not in _warned:
        _warned.add(field)
        LOGGER.warning("TritonConfig.%s %s", field, why)


def server_argv(config: TritonConfig, model_store: pathlib.Path,
                security: Optional[TritonSecurityConfig]) -> list[str]:
    """`kernel serve` arguments for this configuration, serving `model_store` (and config.model_repository)."""
    from kernel.serve import cli

    argv = ["serve", f"--model-repository={model_store}"]
    security_flags = _security_flags(security)
    for field in dataclasses.fields(config):
        name = field.name
        value = getattr(config, name)
        if value is None:
            continue
        if name == "model_repository":
            argv.append(f"--model-repository={value}")
            continue
        if name == "allow_remote_binding":
            continue  # Triton() opens the remote-binding socket itself
        flag = name.replace("_", "-")
        if flag in cli.NOT_YET_FLAGS:
            _warn_once(name, "is not supported by Kernel yet; ignored")
            continue
        if flag in cli.NO_EFFECT_FLAGS:
            _warn_once(name, "only tunes tritonserver internals; it has no effect in Kernel")
            continue
        if name in ("http_restricted_api", "grpc_restricted_protocol") and security_flags:
            # As in PyTriton, the security config's restriction takes this flag's place.
            _warn_once(name, "is replaced by the restriction of the Triton security_config")
            continue
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, bool):
                item = "true" if item else "false"
            argv.append(f"--{flag}={item}")
    argv += security_flags
    return argv


def _security_flags(security: Optional[TritonSecurityConfig]) -> list[str]:
    if security is None or not security.access_token or not security.restricted_endpoints:
        return []
    value = f"{','.join(security.restricted_endpoints)}:{TRITON_ACCESS_HEADER}={security.access_token}"
    return [f"--http-restricted-api={value}", f"--grpc-restricted-protocol={value}"]

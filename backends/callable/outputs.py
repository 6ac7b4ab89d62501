"""What a bound callable returns, checked and turned into core responses.

The checks follow PyTriton's: a list with one dict of numpy arrays per request,
arrays of kinds Triton can carry, bytes (not str) in object arrays; with
strict=True each output must also be declared, with the declared dtype and
shape. Outputs the callable returns but the request did not ask for are
dropped, and each kept array is cast to the dtype the model config declares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from kernel.core import datatypes
from kernel.core.request import InferRequest, InferResponse, InferTensor

_ALLOWED_KINDS = "biufOSU"
_BYTES_TYPES = (bytes, object, np.bytes_, np.object_, np.str_, str)


class OutputError(ValueError):
    """The callable's result does not fit the model; the message says how."""


@dataclass(frozen=True)
class OutputSpec:
    name: str
    datatype: str  # KServe v2 name
    declared: Any  # the dtype given to Tensor(...), for strict checks
    dims: tuple
    cast_to: Optional[np.dtype]  # None for BYTES


def output_spec(name: str, dtype: Any, shape) -> OutputSpec:
    datatype = datatypes.numpy_to_datatype(np.dtype(dtype))
    if datatype is None:
        raise OutputError(f"output '{name}': numpy dtype {dtype} has no Triton equivalent")
    cast_to = None if datatype == "BYTES" else datatypes.datatype_to_numpy(datatype)
    return OutputSpec(name, datatype, dtype, tuple(shape), cast_to)


class ResultConverter:
    """Checks one model's callable results and builds its responses."""

    def __init__(self, model_name: str, version: str, outputs: list[OutputSpec], batching: bool, strict: bool):
        self.model_name = model_name
        self.version = version
        self.outputs = {o.name: o for o in outputs}
        self.batching = batching
        self.strict = strict

    # ---- checks on the whole result ---------------------------------------------

    def check(self, results: Any, request_count: int) -> None:
        name = self.model_name
        if not isinstance(results, list):
            raise OutputError(
                f"the inference callable of model '{name}' must return a list with one dict of numpy arrays "
                f"per request; it returned {type(results).__name__}"
            )
        if len(results) != request_count:
            raise OutputError(
                f"the inference callable of model '{name}' returned {len(results)} responses "
                f"for {request_count} requests"
            )
        for result in results:
            if not isinstance(result, dict):
                raise OutputError(
                    f"the inference callable of model '{name}' must return one dict of numpy arrays per request; "
                    f"got an item of type {type(result).__name__}"
                )
            for key, value in result.items():
                self._check_value(key, value)
                if self.strict:
                    self._check_declared(key, value)
            if self.strict:
                missing = [o for o in self.outputs if o not in result]
                if missing:
                    raise OutputError(
                        f"the inference callable of model '{name}' did not return output(s) "
                        + ", ".join(f"'{m}'" for m in missing)
                    )

    def _check_value(self, key: Any, value: Any) -> None:
        name = self.model_name
        if not isinstance(key, str):
            raise OutputError(f"output names returned by model '{name}' must be strings; got {key!r}")
        if not isinstance(value, np.ndarray):
            raise OutputError(
                f"output '{key}' of model '{name}' must be a numpy array; got {type(value).__name__}"
            )
        kind = value.dtype.kind
        if kind not in _ALLOWED_KINDS:
            raise OutputError(
                f"output '{key}' of model '{name}' has dtype {value.dtype} (kind '{kind}'); Triton carries only "
                "bool, integer, float, bytes and string arrays"
            )
        if kind == "O" and value.size:
            first = value.flat[0]
            if isinstance(first, str):
                raise OutputError(
                    f"output '{key}' of model '{name}' is an object array of str; use a bytes (np.bytes_) "
                    "or str (np.str_) array for strings"
                )
            if not isinstance(first, bytes):
                raise OutputError(
                    f"output '{key}' of model '{name}' is an object array of {type(first).__name__}; "
                    "object arrays may hold bytes only"
                )

    def _check_declared(self, key: str, value: np.ndarray) -> None:
        name = self.model_name
        spec = self.outputs.get(key)
        if spec is None:
            raise OutputError(f"output '{key}' returned by model '{name}' is not declared in its outputs")
        string_like = value.dtype.kind in "OSU"
        if string_like:
            ok = spec.declared in _BYTES_TYPES or spec.datatype == "BYTES"
        else:
            ok = spec.datatype != "BYTES" and np.issubdtype(value.dtype, spec.declared)
        if not ok:
            raise OutputError(
                f"output '{key}' of model '{name}' has dtype {value.dtype}; the model declares {np.dtype(spec.declared)}"
            )
        shape = value.shape[1:] if self.batching else value.shape
        if len(shape) != len(spec.dims) or any(d != -1 and d != s for s, d in zip(shape, spec.dims)):
            raise OutputError(
                f"output '{key}' of model '{name}' has shape {list(shape)}"
                f"{' after the batch dimension' if self.batching else ''}; the model declares {list(spec.dims)}"
            )

    # ---- responses ------------------------------------------------------------------

    def response(self, result: dict, request: InferRequest, final: bool) -> InferResponse:
        """The core response for one request; raises OutputError when an array cannot take its declared type."""
        wanted = request.outputs
        names = None if wanted is None else {o.name for o in wanted}
        specs = self.outputs
        tensors = []
        for key, value in result.items():
            spec = specs.get(key)
            if spec is None or (names is not None and key not in names):
                continue
            tensors.append(_tensor(spec, value, self.model_name))
        return InferResponse(self.model_name, self.version, request.id, tensors, final=final)


def _tensor(spec: OutputSpec, value: np.ndarray, model_name: str) -> InferTensor:
    if spec.cast_to is not None and value.dtype != spec.cast_to:
        try:
            value = value.astype(spec.cast_to)
        except (ValueError, TypeError) as exc:
            raise OutputError(
                f"output '{spec.name}' of model '{model_name}' (dtype {value.dtype}) cannot be converted to "
                f"its declared type {spec.datatype}: {exc}"
            ) from None
    tensor = InferTensor(spec.name, spec.datatype, value.shape, array=value)
    # The wire form is built here, on the callable's thread, not on the front loop.
    try:
        tensor.raw
    except (ValueError, TypeError, UnicodeError) as exc:
        raise OutputError(f"output '{spec.name}' of model '{model_name}' cannot be serialized: {exc}") from None
    return tensor

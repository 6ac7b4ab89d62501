"""What every client does with a call, whatever its transport and concurrency model:
check the arguments, name positional inputs, add or strip the batch axis, wrap numpy
arrays for tritonclient and read its results back as numpy arrays.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple, Union

import numpy as np
import tritonclient.utils

from kernel.client.exceptions import PyTritonClientValueError
from kernel.model_config.triton_model_config import TritonModelConfig

# Header PyTriton's TritonSecurityConfig protects endpoints with; gRPC metadata carries it with
# Triton's restricted-protocol prefix.
ACCESS_TOKEN_HEADER = "triton-access-token"
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

_PARAMETER_TYPES = (str, int, bool, float)
# What parameters= and headers= take: names to str, int, bool (or, for parameters, float) values.
Parameters = Optional[Dict[str, Union[str, int, bool, float]]]


def check_inputs(inputs: Tuple, named_inputs: Mapping) -> None:
    if not inputs and not named_inputs:
        raise PyTritonClientValueError("Provide input data")
    if inputs and named_inputs:
        raise PyTritonClientValueError("Pass inputs either all positionally or all by name, not both")


def check_mapping(what: str, mapping: Optional[Mapping]) -> None:
    """parameters= and headers= must map strings to str, int, bool or float values."""
    if mapping is None:
        return
    if not isinstance(mapping, dict):
        raise PyTritonClientValueError(f"{what} must be a dict, got {type(mapping).__name__}")
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise PyTritonClientValueError(f"{what} keys must be strings, got {key!r}")
        if not isinstance(value, _PARAMETER_TYPES):
            raise PyTritonClientValueError(
                f"{what} value for {key!r} must be a string, integer, boolean or float, got {type(value).__name__}"
            )


def check_call(inputs: Tuple, named_inputs: Mapping, parameters: Optional[Mapping], headers: Optional[Mapping]):
    check_inputs(inputs, named_inputs)
    check_mapping("parameters", parameters)
    check_mapping("headers", headers)


def name_inputs(config: TritonModelConfig, inputs: Tuple, named_inputs: Mapping) -> Dict[str, np.ndarray]:
    """Positional inputs take the model's input names in config order."""
    if named_inputs:
        data = dict(named_inputs)
    else:
        specs = config.inputs or []
        if len(inputs) > len(specs):
            names = ", ".join(spec.name for spec in specs) or "none"
            raise PyTritonClientValueError(
                f"Model {config.model_name} has {len(specs)} inputs ({names}) but {len(inputs)} were given"
            )
        data = {spec.name: array for spec, array in zip(specs, inputs)}
    for name, array in data.items():
        if not isinstance(array, np.ndarray):
            raise PyTritonClientValueError(f"Input {name} must be a numpy array, got {type(array).__name__}")
        if array.dtype.kind == "U":
            raise PyTritonClientValueError(
                f"Input {name} holds unicode strings; encode them to bytes first "
                "(e.g. np.char.encode(array, 'utf-8'))"
            )
    return data


def add_batch_axis(data: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    return {name: array[np.newaxis, ...] for name, array in data.items()}


def strip_batch_axis(result: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    return {name: array[0] for name, array in result.items()}


def infer_inputs(lib, data: Dict[str, np.ndarray]) -> list:
    wrapped = []
    for name, array in data.items():
        triton_dtype = tritonclient.utils.np_to_triton_dtype(array.dtype)
        if triton_dtype is None:
            raise PyTritonClientValueError(f"Input {name}: numpy dtype {array.dtype} has no Triton data type")
        tensor = lib.InferInput(name, list(array.shape), triton_dtype)
        tensor.set_data_from_numpy(array)
        wrapped.append(tensor)
    return wrapped


def requested_outputs(lib, config: TritonModelConfig) -> Optional[list]:
    """Ask for every output the config names (None: the server sends all it has)."""
    return [lib.InferRequestedOutput(spec.name) for spec in config.outputs] if config.outputs else None


def result_arrays(result) -> Dict[str, np.ndarray]:
    """An HTTP or gRPC InferResult as name -> numpy array (BYTES as object arrays of bytes)."""
    response = result.get_response()
    if isinstance(response, dict):
        names = [output["name"] for output in response.get("outputs", ())]
    else:
        names = [output.name for output in response.outputs]
    return {name: result.as_numpy(name) for name in names}


def is_final(result) -> bool:
    """Whether a gRPC stream response carries Triton's triton_final_response flag."""
    parameters = result.get_response().parameters
    return "triton_final_response" in parameters and parameters["triton_final_response"].bool_param


def auth_headers(access_token: Optional[str], scheme: str) -> Dict[str, str]:
    if access_token is None:
        return {}
    if not access_token:
        raise PyTritonClientValueError("access_token must not be empty")
    prefix = GRPC_HEADER_PREFIX if scheme == "grpc" else ""
    return {prefix + ACCESS_TOKEN_HEADER: access_token}


def merge_headers(base: Mapping[str, str], extra: Optional[Mapping[str, Any]], scheme: str) -> Optional[dict]:
    """Request headers as strings; gRPC metadata keys must be lower case."""
    if not extra:
        return dict(base) or None
    merged = dict(base)
    for key, value in extra.items():
        merged[key.lower() if scheme == "grpc" else key] = str(value).lower() if isinstance(value, bool) else str(value)
    return merged

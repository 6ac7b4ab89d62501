"""Flag constants and the datatype tables: Triton's numeric type codes, config
type names and numpy dtypes, and the conversions between them."""

from __future__ import annotations

import numpy as np

from ._errors import TritonModelException

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# config.pbtxt data_type name -> numpy type (same table Triton publishes).
TRITON_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType enum values.
TYPE_CODE_OF_DATATYPE = {
    "INVALID": 0,
    "BOOL": 1,
    "UINT8": 2,
    "UINT16": 3,
    "UINT32": 4,
    "UINT64": 5,
    "INT8": 6,
    "INT16": 7,
    "INT32": 8,
    "INT64": 9,
    "FP16": 10,
    "FP32": 11,
    "FP64": 12,
    "BYTES": 13,
    "BF16": 14,
}

_NUMPY_OF_TYPE_CODE = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}

# numpy dtype -> KServe datatype, for fixed-size element types.
DATATYPE_OF_NUMPY = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.uint16): "UINT16",
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.int8): "INT8",
    np.dtype(np.int16): "INT16",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16",
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
}


def triton_to_numpy_type(data_type):
    """TRITONSERVER_DataType integer -> numpy type; None when unknown."""
    return _NUMPY_OF_TYPE_CODE.get(data_type)


def numpy_to_triton_type(data_type):
    """numpy dtype (or scalar type) -> TRITONSERVER_DataType integer.

    Object, bytes and str dtypes are BYTES (13).  Returns None when the type
    has no Triton equivalent.
    """
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in "OSU":
        return 13
    datatype = DATATYPE_OF_NUMPY.get(dtype)
    if datatype is None:
        return None
    return TYPE_CODE_OF_DATATYPE[datatype]


def triton_string_to_numpy(triton_type_string):
    """'TYPE_FP32' -> np.float32 (KeyError for names not in the table)."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def datatype_of_array(array: np.ndarray) -> str:
    dtype = array.dtype
    datatype = DATATYPE_OF_NUMPY.get(dtype)
    if datatype is not None:
        return datatype
    if dtype.kind in "OSU":
        return "BYTES"
    raise TritonModelException("NumPy dtype is not supported.")

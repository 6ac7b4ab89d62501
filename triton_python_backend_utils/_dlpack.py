"""Minimal DLPack plumbing for ``Tensor.to_dlpack`` / ``Tensor.from_dlpack``.

numpy can consume and produce DLPack capsules, but not for every case a
Triton model relies on: it cannot describe bfloat16, it refuses to export
read-only arrays through the legacy protocol, and it marks arrays imported
from legacy capsules read-only.  This module reads and writes the DLPack C
structures directly with ctypes so that those cases work, zero-copy.

Only CPU memory is handled here; GPU tensors go through CuPy in the caller.

Layout reference: dlpack.h (DLPack 0.8 legacy ``DLManagedTensor`` and DLPack
1.x ``DLManagedTensorVersioned``).
"""

from __future__ import annotations

import ctypes
from ctypes import (
    CFUNCTYPE,
    POINTER,
    c_char_p,
    c_int,
    c_int32,
    c_int64,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)

import numpy as np

# DLDeviceType values used here.
DEVICE_CPU = 1
DEVICE_CUDA = 2
DEVICE_CUDA_HOST = 3

# DLDataTypeCode values.
_CODE_INT = 0
_CODE_UINT = 1
_CODE_FLOAT = 2
_CODE_BFLOAT = 4
_CODE_BOOL = 6

# Flag bit in DLManagedTensorVersioned.flags marking read-only memory.
_FLAG_READ_ONLY = 1

_NAME_LEGACY = b"dltensor"
_NAME_VERSIONED = b"dltensor_versioned"
_NAME_LEGACY_USED = b"used_dltensor"
_NAME_VERSIONED_USED = b"used_dltensor_versioned"


class _Device(ctypes.Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", _Device),
        ("ndim", c_int32),
        ("dtype", _DType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class _Managed(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", _DLTensor),
        ("manager_ctx", c_void_p),
        ("deleter", c_void_p),
    ]


class _Version(ctypes.Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [
        ("version", _Version),
        ("manager_ctx", c_void_p),
        ("deleter", c_void_p),
        ("flags", c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_DeleterFn = CFUNCTYPE(None, c_void_p)

# Capsule C-API entry points.  The "_raw" variants take a bare PyObject*
# because they are used from the capsule destructor, while the object is
# being torn down and must not be touched as a Python object.
_api = ctypes.pythonapi
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, c_void_p, c_char_p, c_void_p)(
    ("PyCapsule_New", _api)
)
_capsule_get_name = ctypes.PYFUNCTYPE(c_char_p, ctypes.py_object)(
    ("PyCapsule_GetName", _api)
)
_capsule_get_pointer = ctypes.PYFUNCTYPE(c_void_p, ctypes.py_object, c_char_p)(
    ("PyCapsule_GetPointer", _api)
)
_capsule_set_name = ctypes.PYFUNCTYPE(c_int, ctypes.py_object, c_char_p)(
    ("PyCapsule_SetName", _api)
)
_capsule_is_valid_raw = ctypes.PYFUNCTYPE(c_int, c_void_p, c_char_p)(
    ("PyCapsule_IsValid", _api)
)
_capsule_get_pointer_raw = ctypes.PYFUNCTYPE(c_void_p, c_void_p, c_char_p)(
    ("PyCapsule_GetPointer", _api)
)

# ---------------------------------------------------------------------------
# dtype mapping (KServe datatype string <-> DLPack code/bits)
# ---------------------------------------------------------------------------

_DLPACK_OF_DATATYPE = {
    "BOOL": (_CODE_BOOL, 8),
    "UINT8": (_CODE_UINT, 8),
    "UINT16": (_CODE_UINT, 16),
    "UINT32": (_CODE_UINT, 32),
    "UINT64": (_CODE_UINT, 64),
    "INT8": (_CODE_INT, 8),
    "INT16": (_CODE_INT, 16),
    "INT32": (_CODE_INT, 32),
    "INT64": (_CODE_INT, 64),
    "FP16": (_CODE_FLOAT, 16),
    "FP32": (_CODE_FLOAT, 32),
    "FP64": (_CODE_FLOAT, 64),
    "BF16": (_CODE_BFLOAT, 16),
}
_DATATYPE_OF_DLPACK = {v: k for k, v in _DLPACK_OF_DATATYPE.items()}

# numpy storage dtype for each datatype; BF16 is carried as raw uint16.
STORAGE_DTYPE = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(np.uint16),
}


class DLPackError(Exception):
    """Raised for malformed or unsupported DLPack input; the caller rewraps."""


def datatype_from_dlpack(code: int, bits: int, lanes: int) -> str | None:
    """Map a DLPack dtype triple to a datatype name, None when unsupported."""
    if lanes != 1:
        return None
    if code == _CODE_BFLOAT and bits != 16:
        raise DLPackError(
            "Expected BF16 tensor to have 16 bits, but had: " + str(bits)
        )
    return _DATATYPE_OF_DLPACK.get((code, bits))


# ---------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------

# Exported tensors still referenced by some consumer, keyed by the address
# of their DLManagedTensor.  Each entry keeps the struct, the shape buffer and
# the source array alive until the consumer calls the deleter.
_live_exports: dict[int, tuple] = {}


def _release_export(managed_ptr, _live=_live_exports):
    _live.pop(managed_ptr, None)


_release_export_fn = _DeleterFn(_release_export)
_release_export_addr = ctypes.cast(_release_export_fn, c_void_p).value


def _drop_unconsumed_capsule(capsule_ptr, _is_valid=_capsule_is_valid_raw,
                             _get=_capsule_get_pointer_raw, _name=_NAME_LEGACY,
                             _live=_live_exports):
    # A capsule that nobody consumed still owns its tensor: free it here.
    # Consumers rename the capsule when they take ownership, so a renamed
    # capsule is left alone.
    if _is_valid(capsule_ptr, _name):
        managed_ptr = _get(capsule_ptr, _name)
        _live.pop(managed_ptr, None)


_capsule_destructor_fn = _DeleterFn(_drop_unconsumed_capsule)
_capsule_destructor_addr = ctypes.cast(_capsule_destructor_fn, c_void_p).value


def export_cpu(array: np.ndarray, datatype: str):
    """Wrap a C-contiguous CPU numpy array in a legacy "dltensor" capsule.

    No data is copied; the array stays alive until the consumer releases it.
    """
    code, bits = _DLPACK_OF_DATATYPE[datatype]
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    ndim = array.ndim
    shape = (c_int64 * max(ndim, 1))(*array.shape)
    managed = _Managed()
    tensor = managed.dl_tensor
    tensor.data = array.ctypes.data
    tensor.device.device_type = DEVICE_CPU
    tensor.device.device_id = 0
    tensor.ndim = ndim
    tensor.dtype.code = code
    tensor.dtype.bits = bits
    tensor.dtype.lanes = 1
    tensor.shape = ctypes.cast(shape, POINTER(c_int64))
    tensor.strides = None
    tensor.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _release_export_addr
    address = ctypes.addressof(managed)
    _live_exports[address] = (managed, shape, array)
    return _capsule_new(address, _NAME_LEGACY, _capsule_destructor_addr)


# ---------------------------------------------------------------------------
# Import
# ---------------------------------------------------------------------------


class CapsuleView:
    """What a capsule describes, read without taking ownership."""

    __slots__ = (
        "capsule", "versioned", "managed_ptr", "device_type", "device_id",
        "code", "bits", "lanes", "shape", "strides", "data", "read_only",
        "deleter",
    )

    def dlpack_device(self):
        return (self.device_type, self.device_id)


def is_capsule(obj) -> bool:
    return type(obj).__name__ == "PyCapsule"


def inspect_capsule(capsule) -> CapsuleView:
    name = _capsule_get_name(capsule)
    if name == _NAME_LEGACY:
        versioned = False
    elif name == _NAME_VERSIONED:
        versioned = True
    elif name in (_NAME_LEGACY_USED, _NAME_VERSIONED_USED):
        raise DLPackError("DLPack capsule has already been consumed.")
    else:
        raise DLPackError(
            "Provided tensor is not supported. Tensor must be a DLPack capsule "
            "or have `__dlpack__` and `__dlpack_device__` attributes"
        )
    ptr = _capsule_get_pointer(capsule, name)
    view = CapsuleView()
    view.capsule = capsule
    view.versioned = versioned
    view.managed_ptr = ptr
    if versioned:
        managed = _ManagedVersioned.from_address(ptr)
        view.read_only = bool(managed.flags & _FLAG_READ_ONLY)
    else:
        managed = _Managed.from_address(ptr)
        view.read_only = False
    view.deleter = managed.deleter
    tensor = managed.dl_tensor
    view.device_type = tensor.device.device_type
    view.device_id = tensor.device.device_id
    view.code = tensor.dtype.code
    view.bits = tensor.dtype.bits
    view.lanes = tensor.dtype.lanes
    ndim = tensor.ndim
    view.shape = tuple(tensor.shape[i] for i in range(ndim))
    if tensor.strides:
        view.strides = tuple(tensor.strides[i] for i in range(ndim))
    else:
        view.strides = None
    view.data = (tensor.data or 0) + tensor.byte_offset
    return view


def is_c_contiguous(shape, strides) -> bool:
    """C-order contiguity in elements; size-1 dimensions may have any stride."""
    if strides is None or 0 in shape:
        return True  # no strides given, or no elements to lay out
    expected = 1
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim != 1:
            if stride != expected:
                return False
            expected *= dim
    return True


class _Owner:
    """Calls the producer's deleter once the imported numpy view is gone."""

    __slots__ = ("_deleter", "_ptr")

    def __init__(self, deleter_addr, managed_ptr):
        self._deleter = deleter_addr
        self._ptr = managed_ptr

    def __del__(self, _fn=_DeleterFn):
        deleter, self._deleter = self._deleter, None
        if deleter:
            _fn(deleter)(self._ptr)


def consume_cpu(view: CapsuleView, storage_dtype: np.dtype) -> np.ndarray:
    """Take ownership of a CPU capsule and return a numpy view of its data."""
    _capsule_set_name(
        view.capsule, _NAME_VERSIONED_USED if view.versioned else _NAME_LEGACY_USED
    )
    owner = _Owner(view.deleter, view.managed_ptr)
    count = 1
    for dim in view.shape:
        count *= dim
    nbytes = count * storage_dtype.itemsize
    if nbytes == 0 or not view.data:
        # Nothing to share; owner is released right away.
        return np.empty(view.shape, dtype=storage_dtype)
    buffer = (ctypes.c_char * nbytes).from_address(view.data)
    buffer._kernel_dlpack_owner = owner
    array = np.frombuffer(buffer, dtype=storage_dtype).reshape(view.shape)
    if view.read_only:
        array.flags.writeable = False
    return array


class CapsuleSource:
    """Gives a bare capsule the ``__dlpack__`` protocol (for CuPy)."""

    def __init__(self, capsule, device):
        self._capsule = capsule
        self._device = device

    def __dlpack__(self, *args, **kwargs):
        return self._capsule

    def __dlpack_device__(self):
        return self._device

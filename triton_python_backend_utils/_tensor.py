"""pb_utils.Tensor: a named numpy (or, on GPU, CuPy) array, and its DLPack
exchange with other frameworks."""

from __future__ import annotations

import numpy as np

from . import _dlpack
from ._errors import TritonModelException
from ._types import DATATYPE_OF_NUMPY, TYPE_CODE_OF_DATATYPE, datatype_of_array


def _tensor_name_type(name):
    """The name as str; bytes are decoded, as Triton's binding converts them."""
    if isinstance(name, bytes):
        name = name.decode("utf-8")
    if not isinstance(name, str):
        raise TypeError("Tensor name must be a str, got " + type(name).__name__)
    return name


def _check_tensor_name(name):
    name = _tensor_name_type(name)
    if name == "":
        raise TritonModelException("Tensor name cannot be an empty string.")
    return name


def _cupy():
    try:
        import cupy  # noqa: PLC0415 - optional, only for GPU tensors
    except ImportError:
        return None
    return cupy


class Tensor:
    """A named tensor.

    ``Tensor(name, numpy_array)`` wraps the array (no copy unless it is not
    C-contiguous, in which case a contiguous copy is taken).  Arrays of
    object, bytes or str dtype are BYTES tensors.

    Internals used by the worker: ``_array`` is the numpy array (for BF16 the
    raw uint16 bits; for GPU tensors a CuPy array) and ``_datatype`` the
    KServe v2 datatype string ("FP32", "BYTES", "BF16", ...). ``_lent`` is set
    by the worker when the array's memory went out as a response without a
    copy (it is read-only from then on): the model's next look at the array
    gets its own writable copy (``_own``), as a model's arrays always are in
    Triton.
    """

    __slots__ = ("_name", "_array", "_datatype", "_lent", "__weakref__")

    def __init__(self, name, numpy_array):
        name = _tensor_name_type(name)
        if not isinstance(numpy_array, np.ndarray):
            # Triton's binding takes numpy arrays only: a list is a TypeError, not converted. Both
            # arguments' types are checked before the name's value: Tensor("", None) is a TypeError.
            raise TypeError(
                "Tensor(): 'numpy_array' must be a numpy.ndarray, got " + type(numpy_array).__name__
            )
        if name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        datatype = datatype_of_array(numpy_array)
        if not numpy_array.flags.c_contiguous:
            numpy_array = np.ascontiguousarray(numpy_array)
        self._name = name
        self._array = numpy_array
        self._datatype = datatype
        self._lent = False

    @classmethod
    def _wrap(cls, name, array, datatype):
        """Worker hook: build a tensor from trusted parts without checks.

        ``array`` must be C-contiguous; for "BYTES" an object array of bytes,
        for "BF16" a uint16 array holding the raw bits, for GPU data a CuPy
        array.
        """
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._datatype = datatype
        tensor._lent = False
        return tensor

    def _own(self):
        """The array, made the model's own again if its memory was lent out (see ``_lent``)."""
        array = self._array
        if self._lent:
            array = self._array = array.copy()
            self._lent = False
        return array

    def name(self):
        return self._name

    def is_cpu(self):
        return isinstance(self._array, np.ndarray)

    def as_numpy(self):
        if not isinstance(self._array, np.ndarray):
            raise TritonModelException(
                "Tensor is stored in GPU and cannot be converted to NumPy."
            )
        if self._datatype == "BF16":
            raise TritonModelException(
                "Tensor dtype is BF16 and cannot be converted to NumPy. Use "
                "to_dlpack() and from_dlpack() instead."
            )
        return self._own() if self._lent else self._array

    def shape(self):
        return list(self._array.shape)

    def triton_dtype(self):
        """The TRITONSERVER_DataType value of this tensor (e.g. 11 for FP32)."""
        return TYPE_CODE_OF_DATATYPE[self._datatype]

    def to_dlpack(self):
        if self._datatype == "BYTES":
            raise TritonModelException(
                "DLPack does not have support for string tensors."
            )
        if isinstance(self._array, np.ndarray):
            return _dlpack.export_cpu(self._own(), self._datatype)
        return self._array.__dlpack__()

    def __dlpack__(self, *args, **kwargs):
        return self.to_dlpack()

    def __dlpack_device__(self):
        if isinstance(self._array, np.ndarray):
            return (_dlpack.DEVICE_CPU, 0)
        return tuple(self._array.__dlpack_device__())

    @staticmethod
    def from_dlpack(name, tensor):
        """Tensor sharing the memory of a DLPack capsule or DLPack-capable
        object (``__dlpack__`` and ``__dlpack_device__``)."""
        name = _check_tensor_name(name)
        try:
            return _tensor_from_dlpack(name, tensor)
        except _dlpack.DLPackError as exc:
            raise TritonModelException(str(exc)) from None

    def __repr__(self):
        return "Tensor(name=%r, datatype=%s, shape=%s)" % (
            self._name, self._datatype, list(self._array.shape))


_NOT_CONTIGUOUS = (
    "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are "
    "stored in C-Order are supported."
)


def _unsupported_device(device_type):
    return TritonModelException(
        "DLDevice type " + str(device_type) + " is not support by Python backend."
    )


def _tensor_from_gpu(name, source):
    cupy = _cupy()
    if cupy is None:
        raise TritonModelException(
            "DLPack capsule passed pointer to memory allocated on GPU device, "
            "when GPU is not available"
        )
    array = cupy.from_dlpack(source)
    if not array.flags.c_contiguous:
        raise TritonModelException(_NOT_CONTIGUOUS)
    datatype = DATATYPE_OF_NUMPY.get(np.dtype(array.dtype))
    if datatype is None:
        raise TritonModelException("Dtype is invalid.")
    return Tensor._wrap(name, array, datatype)


def _tensor_from_dlpack(name, source):
    if _dlpack.is_capsule(source):
        capsule = source
        view = _dlpack.inspect_capsule(capsule)
        if view.device_type == _dlpack.DEVICE_CUDA:
            return _tensor_from_gpu(
                name, _dlpack.CapsuleSource(capsule, view.dlpack_device())
            )
    else:
        if not (hasattr(source, "__dlpack__") and hasattr(source, "__dlpack_device__")):
            raise TritonModelException(
                # Triton's message, with the run of spaces it has.
                "Provided tensor is not supported. Tensor must be a DLPack "
                "capsule         or have `__dlpack__` and `__dlpack_device__` attributes"
            )
        device_type = int(source.__dlpack_device__()[0])
        if device_type == _dlpack.DEVICE_CUDA:
            return _tensor_from_gpu(name, source)
        if device_type not in (_dlpack.DEVICE_CPU, _dlpack.DEVICE_CUDA_HOST):
            raise _unsupported_device(device_type)
        if isinstance(source, np.ndarray):
            # Share the array directly: numpy refuses to export read-only
            # arrays through DLPack, and there is nothing to convert.
            if not source.flags.c_contiguous:
                raise TritonModelException(_NOT_CONTIGUOUS)
            datatype = DATATYPE_OF_NUMPY.get(source.dtype)
            if datatype is None:
                raise TritonModelException("Dtype is invalid.")
            return Tensor._wrap(name, source, datatype)
        if isinstance(source, Tensor):
            if source._datatype == "BYTES":
                raise TritonModelException(
                    "DLPack does not have support for string tensors."
                )
            return Tensor._wrap(name, source._own(), source._datatype)
        try:
            capsule = source.__dlpack__(stream=None)
        except TypeError:  # producers predating the stream argument
            capsule = source.__dlpack__()
        view = _dlpack.inspect_capsule(capsule)

    if view.device_type not in (_dlpack.DEVICE_CPU, _dlpack.DEVICE_CUDA_HOST):
        raise _unsupported_device(view.device_type)
    if not _dlpack.is_c_contiguous(view.shape, view.strides):
        raise TritonModelException(_NOT_CONTIGUOUS)
    datatype = _dlpack.datatype_from_dlpack(view.code, view.bits, view.lanes)
    if datatype is None:
        raise TritonModelException("Dtype is invalid.")
    array = _dlpack.consume_cpu(view, _dlpack.STORAGE_DTYPE[datatype])
    return Tensor._wrap(name, array, datatype)

"""Kernel's implementation of the ``triton_python_backend_utils`` module.

Models written for Triton's Python backend do
``import triton_python_backend_utils as pb_utils`` and use the classes and
helpers below.  Names, signatures, error codes and user-visible messages
follow Triton's documented behaviour so such models run unmodified; the
implementation is Kernel's own and keeps tensors as plain numpy arrays.

Hooks for the Kernel worker process (not part of the model-facing API):

* ``_bls_handler`` -- object serving BLS calls, ``None`` when unavailable.
  Contract::

      exec(request, decoupled) -> InferenceResponse | iterator of responses
      async_exec(request, decoupled) -> awaitable of the same
      load_model(model_name, config, files)            # optional
      unload_model(model_name, unload_dependents)      # optional
      is_model_ready(model_name, model_version) -> bool  # optional

* ``InferenceRequest._server_side(...)`` -- builds the requests handed to
  ``execute``.
* ``InferenceResponseSender(callback, decoupled, requested_output_names)`` --
  the per-request sender; ``callback`` does the actual transport.
* ``Tensor._wrap(name, array, datatype)`` -- tensor from trusted data;
  ``tensor._array`` / ``tensor._datatype`` read it back.
* ``_set_log_verbosity(n)``, ``_configure_logging(...)``, ``_set_model_dir(p)``.

The implementation lives in one module per job (``_types``, ``_bytes``,
``_lookup``, ``_errors``, ``_tensor``, ``_parameters``, ``_response``,
``_request``, ``_model_control``, ``_logger``, ``_model_config``,
``_metrics``); this package gathers their public names, plus the private
hooks above, under the one name models import.
"""

from __future__ import annotations

# Triton's module has these at top level; ``from triton_python_backend_utils
# import *`` in a model brings them along, so keep them here.
import json  # noqa: F401
import struct  # noqa: F401

import numpy as np  # noqa: F401

from . import _dlpack  # noqa: F401
from ._bytes import deserialize_bytes_tensor, serialize_byte_tensor
from ._errors import TritonError, TritonModelException
from ._logger import LogLevel, Logger
from ._logger import configure_logging as _configure_logging
from ._logger import log_settings as _log_settings
from ._logger import set_log_verbosity as _set_log_verbosity
from ._lookup import (
    get_input_config_by_name,
    get_input_tensor_by_name,
    get_model_dir,
    get_output_config_by_name,
    get_output_tensor_by_name,
    using_decoupled_model_transaction_policy,
)
from ._lookup import set_model_dir as _set_model_dir
from ._metrics import Metric, MetricFamily, MetricKind
from ._model_config import ModelConfig
from ._model_control import is_model_ready, load_model, unload_model
from ._request import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_GPU,
    InferenceRequest,
    InferenceTrace,
    PreferredMemory,
)
from ._response import InferenceResponse, InferenceResponseSender
from ._tensor import Tensor
from ._types import (
    TRITON_STRING_TO_NUMPY,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    numpy_to_triton_type,
    triton_string_to_numpy,
    triton_to_numpy_type,
)

# Installed by the worker (see _hooks.py): the BLS / model-control handler, the
# custom-metrics handler, and the directory get_model_dir() returns.
_bls_handler = None
_metrics_handler = None
_model_dir = None

# The public classes keep this package as their module (repr, pickling, tracebacks), as before
# the implementation was split into submodules.
for _public in (TritonError, TritonModelException, LogLevel, Logger, Metric, MetricFamily, MetricKind,
                ModelConfig, InferenceRequest, InferenceTrace, PreferredMemory, InferenceResponse,
                InferenceResponseSender, Tensor):
    _public.__module__ = __name__
del _public

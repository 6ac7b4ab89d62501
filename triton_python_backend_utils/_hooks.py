"""Where the submodules find what the worker installs on the package.

The worker (and tests) set ``pb_utils._bls_handler``, ``pb_utils._metrics_handler``
and ``pb_utils._model_dir`` as attributes of the package itself, so that one
assignment is seen everywhere; the submodules read them from there at call time.
"""

from __future__ import annotations

import sys

from ._errors import TritonModelException


def package():
    """The triton_python_backend_utils package module."""
    return sys.modules[__package__]


def bls_handler():
    """The installed BLS handler; raises when this process has none."""
    handler = package()._bls_handler
    if handler is None:
        raise TritonModelException("BLS is not available in this process")
    return handler


def metrics_handler():
    """The installed metrics handler, or None (values then stay in this process)."""
    return package()._metrics_handler

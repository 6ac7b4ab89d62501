"""The Python backend: Triton `model.py` models, one worker process per instance.

`PythonBackend` is resolved on first use (PEP 562) rather than imported here: every worker process
imports this package on its way to `kernel.backends.python.worker`, and the front-side backend
(execenv, instance, kernel.core.request, tarfile, ...) would otherwise cost each worker ~40 ms of
start-up and ~3 MB of resident memory for code it never runs.
"""

__all__ = ["PythonBackend"]


def __getattr__(name: str):
    if name == "PythonBackend":
        from kernel.backends.python.backend import PythonBackend

        return PythonBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

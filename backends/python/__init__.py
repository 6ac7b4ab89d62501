"""The Python backend: Triton `model.py` models, one worker process per instance."""

from kernel.backends.python.backend import PythonBackend

__all__ = ["PythonBackend"]

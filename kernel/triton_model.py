"""One model bound with Triton.bind(): its checks, its TritonModelConfig and its folder in the model store."""

from __future__ import annotations

import copy
import inspect
import logging
import pathlib
import re
import shutil
from collections.abc import Sequence
from typing import Any, Callable, List, Union

import numpy as np

from kernel.core import datatypes
from kernel.decorators import TritonContext
from kernel.exceptions import PyTritonBadParameterError, PyTritonValidationError
from kernel.model_config.common import DeviceKind
from kernel.model_config.generator import ModelConfigGenerator
from kernel.model_config.model_config import ModelConfig
from kernel.model_config.tensor import Tensor
from kernel.model_config.triton_model_config import ResponseCache, TensorSpec, TritonModelConfig

LOGGER = logging.getLogger("kernel.triton")

_MODEL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")


def validate_model_name(model_name: str) -> None:
    if not model_name:
        raise PyTritonValidationError("Model name cannot be empty")
    if not isinstance(model_name, str) or not _MODEL_NAME.match(model_name):
        raise PyTritonValidationError(
            "Model name can only contain alphanumeric characters, dots, underscores and dashes"
        )


class BoundCallables:
    """The callables, tensors and settings given to one bind() call."""

    def __init__(
        self,
        model_name: str,
        model_version: int,
        infer_func: Union[Callable, Sequence[Callable]],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        config: ModelConfig,
        strict: bool,
        workspace_path: pathlib.Path,
    ):
        validate_model_name(model_name)
        if callable(infer_func):
            callables = [infer_func]
        elif isinstance(infer_func, Sequence) and infer_func and all(callable(f) for f in infer_func):
            callables = list(infer_func)
        else:
            raise PyTritonValidationError("inference_fn has to be either callable or sequence of callables")
        if not isinstance(model_version, int) or isinstance(model_version, bool) or model_version < 0:
            raise PyTritonValidationError(f"model_version must be a non-negative integer, got {model_version!r}")
        self.model_name = model_name
        self.model_version = model_version
        self.infer_functions: List[Callable] = callables
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.config = config if config is not None else ModelConfig()
        self.strict = strict
        if any(getattr(o, "optional", False) for o in self.outputs):
            raise PyTritonValidationError("Output tensors cannot be optional.")
        self.triton_model_config = self._triton_model_config(workspace_path)
        self.model_config_dict()  # raises PyTritonBadParameterError for settings the config cannot hold

    # ---- TritonModelConfig ------------------------------------------------------------------

    def _triton_model_config(self, workspace_path: pathlib.Path) -> TritonModelConfig:
        c = self.config
        inputs = [_spec(t, f"INPUT_{i}", "input") for i, t in enumerate(self.inputs, start=1)]
        outputs = [_spec(t, f"OUTPUT_{i}", "output") for i, t in enumerate(self.outputs, start=1)]
        for kind, specs in (("input", inputs), ("output", outputs)):
            names = [s.name for s in specs]
            dup = next((n for n in names if names.count(n) > 1), None)
            if dup is not None:
                raise PyTritonValidationError(f"Model '{self.model_name}' has two {kind}s named '{dup}'.")
        return TritonModelConfig(
            model_name=self.model_name,
            model_version=self.model_version,
            batching=c.batching,
            batcher=c.batcher,
            max_batch_size=c.max_batch_size,
            decoupled=c.decoupled,
            backend_parameters={"workspace-path": workspace_path.as_posix()},
            instance_group={DeviceKind.KIND_CPU: len(self.infer_functions)},
            inputs=inputs,
            outputs=outputs,
            response_cache=ResponseCache(enable=True) if c.response_cache else None,
        )

    def model_config_dict(self) -> dict:
        return ModelConfigGenerator(self.triton_model_config).get_config()

    # ---- the model store --------------------------------------------------------------------

    def write(self, model_store: pathlib.Path) -> pathlib.Path:
        """Write <store>/<name>/config.pbtxt and the version folder; returns the model folder."""
        folder = model_store / self.model_name
        config_path = folder / "config.pbtxt"
        if config_path.exists():
            LOGGER.warning("The config file %s is going to be overridden.", config_path)
        ModelConfigGenerator(self.triton_model_config).to_file(config_path)
        (folder / str(self.model_version)).mkdir(parents=True, exist_ok=True)
        return folder

    def remove(self, model_store: pathlib.Path) -> None:
        shutil.rmtree(model_store / self.model_name, ignore_errors=True)

    # ---- decorators' view of the model --------------------------------------------------------

    def inject_context(self, context: TritonContext) -> None:
        """Let decorators find the model config: callable -> config in the context, context on the callable."""
        for fn in self.infer_functions:
            context.model_configs[fn] = copy.deepcopy(self.triton_model_config)
            target = fn.__self__ if inspect.ismethod(fn) else fn
            try:
                target.__triton_context__ = context
            except (AttributeError, TypeError):
                LOGGER.debug("cannot set __triton_context__ on %r", target)

    def warmup(self) -> None:
        """Run the callables on ModelConfig.model_warmup data before the model is served (as PyTriton)."""
        if not self.config.model_warmup:
            return
        from kernel.proxy.types import Request

        for warmup in self.config.model_warmup:
            for _ in range(warmup.count):
                data = {name: _warmup_array(spec, warmup.batch_size) for name, spec in warmup.inputs.items()}
                for i, fn in enumerate(self.infer_functions):
                    try:
                        result = fn([Request(data=data)])
                        if inspect.isgenerator(result):
                            for _ in result:
                                pass
                    except Exception as exc:  # noqa: BLE001 - a failed warmup does not stop the model
                        LOGGER.warning("Warmup of model '%s' (callable %d) failed: %s", self.model_name, i, exc)


def _spec(tensor: Any, default_name: str, kind: str) -> TensorSpec:
    if not isinstance(tensor, Tensor):
        raise PyTritonBadParameterError(
            f"Model {kind}s must be kernel.model_config.Tensor objects, got {type(tensor).__name__}."
        )
    name = tensor.name or default_name
    try:
        shape = tuple(int(d) for d in tensor.shape)
    except (TypeError, ValueError):
        raise PyTritonBadParameterError(
            f"Shape of {kind} '{name}' must be a sequence of integers, got {tensor.shape!r}."
        ) from None
    try:
        ok = datatypes.numpy_to_datatype(np.dtype(tensor.dtype)) is not None
    except TypeError:
        ok = False
    if not ok:
        raise PyTritonBadParameterError(f"Data type {tensor.dtype!r} of {kind} '{name}' has no Triton equivalent.")
    return TensorSpec(name=name, shape=shape, dtype=tensor.dtype, optional=bool(tensor.optional))


def _warmup_array(spec, batch_size: int) -> np.ndarray:
    """One warmup input as PyTriton 0.7 makes it: (batch_size, *shape) of zeros, of random values
    (integers over the dtype's range, floats in [0, 1), random booleans, random alphanumeric
    strings of 8-32 characters), or a .npy file's array given the batch dimension when it lacks one."""
    shape = (batch_size, *spec.shape)
    dtype = np.dtype(spec.dtype)
    if spec.input_data_file:
        data = np.load(spec.input_data_file, allow_pickle=dtype.kind == "O")
        item = tuple(spec.shape)
        if data.shape != shape:
            if data.shape == item:
                data = np.broadcast_to(data, shape)
            elif data.shape[1:] == item and data.shape[0] > 0:
                data = np.resize(data, shape)  # repeats or truncates along the batch dimension
            else:
                raise PyTritonBadParameterError(
                    f"Warmup input data file {spec.input_data_file} holds shape {data.shape}, "
                    f"which does not fit {shape}")
        return np.array(data, dtype=dtype)
    if not spec.random_data:
        return np.full(shape, b"", dtype=np.object_) if dtype.kind in "OSU" else np.zeros(shape, dtype=dtype)
    rng = _WARMUP_RNG
    if dtype.kind in "OSU":
        letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8)
        values = [rng.choice(letters, rng.integers(8, 33)).tobytes() for _ in range(int(np.prod(shape)))]
        return np.array(values, dtype=np.object_).reshape(shape)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.random(shape).astype(dtype)


_WARMUP_RNG = np.random.default_rng()

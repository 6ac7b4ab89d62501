"""Decorators for inference callables (`pytriton.decorators` -> `kernel.decorators`).

A bound callable receives a list of requests (dict-like name -> numpy array) and
returns one dict of outputs per request. These decorators adapt that shape to
what model code wants: `@batch` stacks the requests into one batch per input,
`@sample` unpacks a single request into keyword arguments, the `group_by_*`
decorators split a call into consistent sub-calls, and so on. Names, signatures,
semantics and exception classes follow PyTriton 0.7.

Beyond PyTriton, results may also be coroutines (`async def`) or async
generators at any level of the stack, so async models can use the decorators;
generators (decoupled models) work through the decorators that map results one
to one (@batch, @sample and the pass-through ones).

Decorators reach the model configuration through `__triton_context__`, which
`Triton.bind()` sets on the callable (on `__self__` for bound methods) after
registering its `TritonModelConfig` in `TritonContext.model_configs`.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import logging
import struct
from bisect import bisect_left
from collections.abc import MutableMapping
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import wrapt

from kernel.exceptions import PyTritonBadParameterError, PyTritonRuntimeError, PyTritonValidationError
from kernel.model_config.triton_model_config import TritonModelConfig

LOGGER = logging.getLogger(__name__)

InputNames = List[str]
InferenceRequest = Dict[str, np.ndarray]
InferenceRequests = Union[List[InferenceRequest], Tuple[InferenceRequest, ...]]
InferenceResult = Dict[str, np.ndarray]
InferenceResults = Union[List[InferenceResult], Tuple[InferenceResult, ...]]

# Keyword argument under which @triton_context passes the context.
TRITON_CONTEXT_FIELD_NAME = "triton_context"
# Keyword arguments that are not model inputs: decorators that treat kwargs as
# inputs (group_by_values, pad_batch, first_value) pass them through untouched.
_SPECIAL_KEYS = frozenset({"__triton_context__", TRITON_CONTEXT_FIELD_NAME})


def get_inference_request_batch_size(inference_request: InferenceRequest) -> int:
    """Batch size of a request: the first dimension of its first input."""
    first_input = next(iter(inference_request.values()))
    return first_input.shape[0]


# ---------------------------------------------------------------- model config access


class ModelConfigDict(MutableMapping):
    """Model configs keyed by inference callable.

    Entries are keyed by `str(callable)`, so a wrapt wrapper and the function it
    wraps find the same entry, and a bound `__call__` finds its object's entry.
    """

    def __init__(self):
        self._configs: Dict[str, TritonModelConfig] = {}
        self._callables: Dict[str, Callable] = {}

    @staticmethod
    def _get_model_config_key(infer_callable: Callable) -> str:
        if inspect.ismethod(infer_callable) and infer_callable.__name__ == "__call__":
            infer_callable = infer_callable.__self__
        return str(infer_callable)

    def __getitem__(self, infer_callable: Callable) -> TritonModelConfig:
        return self._configs[self._get_model_config_key(infer_callable)]

    def __setitem__(self, infer_callable: Callable, config: TritonModelConfig) -> None:
        key = self._get_model_config_key(infer_callable)
        self._configs[key] = config
        self._callables[key] = infer_callable

    def __delitem__(self, infer_callable: Callable) -> None:
        key = self._get_model_config_key(infer_callable)
        del self._configs[key]
        del self._callables[key]

    def __len__(self) -> int:
        return len(self._configs)

    def __iter__(self) -> Iterator[Callable]:
        return iter(list(self._callables.values()))


@dataclasses.dataclass
class TritonContext:
    """What the Triton side shares with decorators: the model config of each bound callable."""

    model_configs: ModelConfigDict = dataclasses.field(default_factory=ModelConfigDict)


def get_triton_context(wrapped, instance) -> TritonContext:
    """The TritonContext that Triton.bind() attached to the callable (or to its object)."""
    owner = instance if instance is not None else wrapped
    context = getattr(owner, "__triton_context__", None)
    if context is None:
        raise PyTritonValidationError(
            "Wrapped function or object must be bound with Triton (Triton.bind) to have __triton_context__"
        )
    return context


def get_model_config(wrapped, instance) -> TritonModelConfig:
    """The TritonModelConfig the callable was bound with; for use in custom decorators."""
    return get_triton_context(wrapped, instance).model_configs[wrapped]


def convert_output(
    outputs: Union[Dict, List, Tuple], wrapped=None, instance=None, model_config: Optional[TritonModelConfig] = None
):
    """Return outputs as a dict; a list/tuple is matched by position to the model config's outputs."""
    if isinstance(outputs, dict):
        return outputs
    if isinstance(outputs, (list, tuple)):
        if model_config is None:
            model_config = get_model_config(wrapped, instance)
        specs = model_config.outputs or []
        if len(outputs) != len(specs):
            names = ", ".join(spec.name for spec in specs)
            raise PyTritonValidationError(
                f"Outputs length different than config outputs length: the inference callable returned "
                f"{len(outputs)} outputs, the model config declares {len(specs)} ({names})"
            )
        return {spec.name: output for spec, output in zip(specs, outputs)}
    raise PyTritonValidationError(f"Unsupported output type {type(outputs)}.")


# ---------------------------------------------------------------- result kinds


def _map_result(result, transform: Callable):
    """Apply `transform` to a result, or to each item/awaited value of a (async) generator or coroutine."""
    if isinstance(result, (dict, list, tuple)):
        return transform(result)
    if inspect.isgenerator(result):
        return _map_generator(result, transform)
    if inspect.isasyncgen(result):
        return _map_async_generator(result, transform)
    if inspect.isawaitable(result):
        return _map_awaitable(result, transform)
    return transform(result)


def _map_generator(generator, transform):
    try:
        for item in generator:
            yield transform(item)
    finally:
        generator.close()


async def _map_async_generator(generator, transform):
    try:
        async for item in generator:
            yield transform(item)
    finally:
        await generator.aclose()


async def _map_awaitable(awaitable, transform):
    return transform(await awaitable)


def _call_per_group(decorator_name: str, call: Callable, groups: Sequence, merge: Callable):
    """Call `call(group)` for each group in turn and `merge([(group, result), ...])`.

    When the callable is async the whole thing becomes a coroutine that awaits
    each group's call before starting the next one, as the sync path does.
    """
    done: List[Tuple[Any, Any]] = []
    for position, group in enumerate(groups):
        result = call(group)
        if inspect.isgenerator(result) or inspect.isasyncgen(result):
            if inspect.isgenerator(result):
                result.close()
            raise PyTritonRuntimeError(
                f"The @{decorator_name} decorator does not support generator (decoupled) inference callables."
            )
        if inspect.isawaitable(result):
            return _call_per_group_async(result, groups[position:], call, done, merge)
        done.append((group, result))
    return merge(done)


async def _call_per_group_async(first_awaitable, groups, call, done, merge):
    done.append((groups[0], await first_awaitable))
    for group in groups[1:]:
        done.append((group, await call(group)))
    return merge(done)


# ---------------------------------------------------------------- @batch, @sample


@wrapt.decorator
def batch(wrapped, instance, args, kwargs):
    """Stack the requests into one batch per input, passed as keyword arguments; split the outputs back.

    All requests must carry the same inputs (use @group_by_keys first otherwise).
    Raises PyTritonValidationError for differing input sets and ValueError when
    an output's batch size differs from the sum of the requests' batch sizes.
    """
    requests, *other_args = args
    input_names = requests[0].keys()
    for request in requests[1:]:
        if request.keys() != input_names:
            raise PyTritonValidationError("Cannot batch requests with different set of inputs keys")
    batch_sizes = [get_inference_request_batch_size(request) for request in requests]

    call_kwargs = dict(kwargs)
    for name in input_names:
        call_kwargs[name] = np.concatenate([request[name] for request in requests])
    result = wrapped(*other_args, **call_kwargs)

    def split(outputs):
        return _split_batch(convert_output(outputs, wrapped, instance), batch_sizes)

    return _map_result(result, split)


def _split_batch(outputs: InferenceResult, batch_sizes: List[int]) -> List[InferenceResult]:
    expected = sum(batch_sizes)
    for name, tensor in outputs.items():
        if not isinstance(tensor, np.ndarray):
            raise PyTritonValidationError(f"Output {name!r} must be a numpy array, got {type(tensor).__name__}")
    wrong = {name: tensor.shape for name, tensor in outputs.items() if tensor.shape[:1] != (expected,)}
    if wrong:
        listed = ", ".join(f"{name}: {shape}" for name, shape in wrong.items())
        raise ValueError(
            f"Received output tensors with different batch sizes: {listed}. Expected batch size: {expected}. "
        )
    bounds = list(itertools.accumulate(batch_sizes, initial=0))
    return [
        {name: tensor[start:end] for name, tensor in outputs.items()} for start, end in zip(bounds, bounds[1:])
    ]


@wrapt.decorator
def sample(wrapped, instance, args, kwargs):
    """Pass the inputs of the first (only) request as keyword arguments; for models without batching."""
    requests, *other_args = args
    kwargs.update(requests[0])
    result = wrapped(*other_args, **kwargs)
    return _map_result(result, lambda outputs: [convert_output(outputs, wrapped, instance)])


# ---------------------------------------------------------------- grouping


@wrapt.decorator
def group_by_keys(wrapped, instance, args, kwargs):
    """Call the callable once per group of requests that carry the same set of inputs.

    Place it before @batch when requests may leave optional inputs out.
    """
    requests, *other_args = args
    groups: Dict[Tuple[str, ...], List[int]] = {}
    for index, request in enumerate(requests):
        groups.setdefault(tuple(sorted(request.keys())), []).append(index)
    ordered = [groups[key] for key in sorted(groups)]

    def call(indices):
        return wrapped([requests[index] for index in indices], *other_args, **kwargs)

    def merge(results):
        merged = [None] * len(requests)
        for indices, group_outputs in results:
            for index, outputs in zip(indices, group_outputs):
                merged[index] = outputs
        return merged

    return _call_per_group("group_by_keys", call, ordered, merge)


def _byte_tensor_key(array: np.ndarray) -> bytes:
    """Bytes identifying a BYTES tensor's content: each item length-prefixed, total length first."""
    parts = []
    for item in array.flat:
        if isinstance(item, np.bytes_):
            item = bytes(item)
        elif not isinstance(item, bytes):
            item = str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(item)) + item)
    body = b"".join(parts)
    return struct.pack("<I", len(body)) + body if parts else b""


def _value_key(value):
    if isinstance(value, np.ndarray):
        if value.dtype == np.object_ or value.dtype.type == np.bytes_:
            return _byte_tensor_key(value)
        return value.tobytes()
    return value


def _group_sample_indices(inputs: InferenceRequest, keys: Sequence[str], batch_size: int) -> List[np.ndarray]:
    """Indices of the samples sharing the same values of `keys`, one array per group, groups in key order."""
    present = [inputs[key] for key in keys if key in inputs]
    groups: Dict[tuple, List[int]] = {}
    for index in range(batch_size):
        groups.setdefault(tuple(_value_key(values[index]) for values in present), []).append(index)
    return [np.array(groups[key]) for key in sorted(groups)]


def _scatter_groups(
    indices_per_group: Sequence[np.ndarray], results: Sequence[InferenceResult], batch_size: int
) -> InferenceResult:
    """Reassemble per-group outputs into one batch, each sample back at its original position."""
    merged: InferenceResult = {}
    for name in results[0]:
        parts = [result[name] for result in results if name in result]
        trailing = parts[0].shape[1:]
        if any(part.shape[1:] != trailing for part in parts):
            shapes = ", ".join(str(part.shape) for part in parts)
            raise PyTritonRuntimeError(
                f"Output {name!r} has different shapes in different groups ({shapes}); "
                "pass pad_fn=ConstantPadder() to @group_by_values to pad them to one shape."
            )
        dtype = parts[0].dtype
        if dtype.kind in "SU":  # fixed-width strings: widen to the longest so nothing is truncated
            dtype = max((part.dtype for part in parts), key=lambda part_dtype: part_dtype.itemsize)
        merged[name] = np.zeros((batch_size,) + trailing, dtype=dtype)
    for indices, result in zip(indices_per_group, results):
        for name, data in result.items():
            merged[name][indices, ...] = data
    return merged


def group_by_values(*keys, pad_fn: Optional[Callable[[InferenceRequests], InferenceRequests]] = None):
    """Split the batch into sub-batches whose samples share the values of `keys`; call once per sub-batch.

    Use it below @batch (it receives batched keyword arguments). The sub-batch
    outputs are put back together in the original sample order; `pad_fn` (e.g.
    ConstantPadder()) first makes them the same shape when they differ.
    """

    @wrapt.decorator
    def _group_by_values(wrapped, instance, args, kwargs):
        if _has_wrapper(wrapped, batch.__wrapped__):
            raise PyTritonRuntimeError("The @group_by_values decorator must be used after the @batch decorator.")
        inputs = {name: value for name, value in kwargs.items() if name not in _SPECIAL_KEYS}
        special = {name: value for name, value in kwargs.items() if name in _SPECIAL_KEYS}
        batch_size = get_inference_request_batch_size(inputs)
        groups = _group_sample_indices(inputs, keys, batch_size)

        def call(indices):
            sub_batch = {name: value[indices, ...] for name, value in inputs.items()}
            return wrapped(*args, **sub_batch, **special)

        def merge(results):
            indices_per_group = [indices for indices, _ in results]
            outputs = [convert_output(result, wrapped, instance) for _, result in results]
            if pad_fn is not None:
                outputs = pad_fn(outputs)
            return _scatter_groups(indices_per_group, outputs, batch_size)

        return _call_per_group("group_by_values", call, groups, merge)

    return _group_by_values


def _has_wrapper(wrapped, wrapper_function) -> bool:
    """Whether a wrapt decorator built from `wrapper_function` is applied anywhere in wrapped's chain."""
    layer = wrapped
    while layer is not None:
        if getattr(layer, "_self_wrapper", None) is wrapper_function:
            return True
        layer = getattr(layer, "__wrapped__", None)
    return False


class ConstantPadder:
    """pad_fn for @group_by_values: pads every output to the largest shape in the group results with a constant.

    Fixed-width string outputs are widened to the longest; bytes/strings are
    padded with b"". All results of one output must share a dtype (kind for strings).
    """

    def __init__(self, pad_value=0):
        self.pad_value = pad_value

    def __call__(self, batches_list: InferenceResults) -> InferenceResults:
        names = list(dict.fromkeys(name for batch_ in batches_list for name in batch_))
        padded: List[Dict[str, np.ndarray]] = [{} for _ in batches_list]
        for name in names:
            arrays = [batch_.get(name) for batch_ in batches_list]
            present = [array for array in arrays if array is not None]
            target_shape = tuple(np.max([array.shape[1:] for array in present], axis=0))
            target_dtype = self._common_dtype([array.dtype for array in present])
            pad_value = b"" if target_dtype.kind in "SUO" else self.pad_value
            for position, array in enumerate(arrays):
                if array is None:
                    continue
                widths = [(0, 0)] + [(0, target - size) for size, target in zip(array.shape[1:], target_shape)]
                padded[position][name] = np.pad(array, widths, mode="constant", constant_values=pad_value).astype(
                    target_dtype
                )
        return padded

    @staticmethod
    def _common_dtype(dtypes: List[np.dtype]) -> np.dtype:
        first = dtypes[0]
        same = (
            all(dtype.kind == first.kind for dtype in dtypes)
            if first.kind in "SU"
            else all(dtype == first for dtype in dtypes)
        )
        if not same:
            raise PyTritonRuntimeError("All input arrays for given input name must have the same dtype.")
        if first.kind in "SU":
            return max(dtypes, key=lambda dtype: dtype.itemsize)
        return first


# ---------------------------------------------------------------- inputs


_BYTES_DTYPES = (bytes, np.bytes_, object, np.object_)


def _dtype_matches(default: np.ndarray, spec_dtype) -> bool:
    if spec_dtype in _BYTES_DTYPES:  # BYTES input: bytes or object arrays both serve
        return default.dtype.kind in "SO"
    return default.dtype == np.dtype(spec_dtype)


def _shape_matches(shape: tuple, spec_shape: tuple) -> bool:
    return len(shape) == len(spec_shape) and all(want == -1 or have == want for have, want in zip(shape, spec_shape))


def _verify_defaults(defaults: Dict[str, Any], model_config: TritonModelConfig) -> None:
    """Check fill_optionals defaults against the model's inputs; PyTritonBadParameterError naming each mismatch."""
    specs = {spec.name: spec for spec in model_config.inputs or []}
    unknown = sorted(set(defaults) - set(specs))
    if unknown:
        raise PyTritonBadParameterError(f"Could not found {', '.join(unknown)} inputs")
    not_arrays = {name: value for name, value in defaults.items() if not isinstance(value, np.ndarray)}
    if not_arrays:
        listed = ", ".join(f"{name}={value}" for name, value in not_arrays.items())
        raise PyTritonBadParameterError(f"Could not use {listed} defaults as they are not NumPy arrays")
    wrong_dtypes = [
        f"{name}: dtype={value.dtype} expected_dtype={specs[name].dtype}"
        for name, value in defaults.items()
        if not _dtype_matches(value, specs[name].dtype)
    ]
    if wrong_dtypes:
        raise PyTritonBadParameterError(
            f"Could not use {', '.join(wrong_dtypes)} defaults as they have different than input signature dtypes"
        )
    wrong_shapes = [
        f"{name}: shape={value.shape} expected_shape={tuple(specs[name].shape)}"
        for name, value in defaults.items()
        if not _shape_matches(value.shape, tuple(specs[name].shape))
    ]
    if wrong_shapes:
        raise PyTritonBadParameterError(
            f"Could not use {', '.join(wrong_shapes)} defaults as they have different than input signature shapes"
        )
    required = sorted(name for name in defaults if not specs[name].optional)
    if required:
        # Kept as a warning: PyTriton accepts it, but the server rejects requests
        # missing a required input before they reach the callable.
        LOGGER.warning(
            "@fill_optionals defaults for %s are never used: these inputs are not declared optional=True",
            ", ".join(required),
        )


def fill_optionals(**defaults):
    """Fill inputs missing from a request with defaults (numpy arrays without the batch axis).

    Put it first (outermost) so later grouping decorators see complete requests.
    Defaults are checked against the model's inputs (name, dtype, shape) at the
    first call; a mismatch raises PyTritonBadParameterError.
    """
    verified_configs: List[TritonModelConfig] = []  # checked once per config, not per request

    @wrapt.decorator
    def _fill_optionals(wrapped, instance, args, kwargs):
        model_config = get_model_config(wrapped, instance)
        if not any(config is model_config for config in verified_configs):
            _verify_defaults(defaults, model_config)
            verified_configs.append(model_config)

        (requests,) = args
        for request in requests:
            missing = [name for name in defaults if name not in request]
            if not missing:
                continue
            batch_size = get_inference_request_batch_size(request) if model_config.batching else None
            for name in missing:
                default = defaults[name]
                if batch_size is not None:  # repeat along a new batch axis
                    default = np.tile(default, (batch_size,) + (1,) * default.ndim)
                request[name] = default
        return wrapped(*args, **kwargs)

    return _fill_optionals


@wrapt.decorator
def triton_context(wrapped, instance, args, kwargs):
    """Pass the TritonContext as the `triton_context` keyword argument."""
    kwargs[TRITON_CONTEXT_FIELD_NAME] = get_triton_context(wrapped, instance)
    return wrapped(*args, **kwargs)


@wrapt.decorator
def pad_batch(wrapped, instance, args, kwargs):
    """Pad the batch up to the nearest preferred batch size (or max_batch_size) by repeating the last sample."""
    inputs = {name: value for name, value in kwargs.items() if name not in _SPECIAL_KEYS}
    current = next(iter(inputs.values())).shape[0]
    config = get_model_config(wrapped, instance)
    preferred = config.batcher.preferred_batch_size if config.batcher is not None else None
    sizes = sorted(preferred or []) + [config.max_batch_size]
    position = bisect_left(sizes, current)
    if position == len(sizes):
        raise PyTritonRuntimeError(
            f"Cannot pad a batch of {current} samples: it exceeds max_batch_size={config.max_batch_size}"
        )
    target = sizes[position]
    for name, array in inputs.items():
        kwargs[name] = np.concatenate([array, np.repeat(array[-1:], target - current, axis=0)])
    return wrapped(*args, **kwargs)


def first_value(*keys: str, squeeze_single_values=True, strict: bool = True):
    """Replace the selected inputs with their first sample, e.g. a per-batch parameter such as temperature.

    Works on batched keyword arguments (below @batch) or on a list of requests.
    One-element values become numpy scalars unless `squeeze_single_values=False`.
    With `strict`, differing values across the batch raise PyTritonRuntimeError.
    Only for models with batching; raises PyTritonBadParameterError for reserved keys.
    """
    reserved = [key for key in keys if key in _SPECIAL_KEYS]
    if reserved:
        raise PyTritonBadParameterError(
            f"The keys {', '.join(reserved)} are not allowed as keys for @first_value wrapper. "
            f"The set of not allowed keys are {', '.join(sorted(_SPECIAL_KEYS))}"
        )

    def take_first(inputs):
        for name in keys:
            if name not in inputs:
                continue
            values = inputs[name]
            if strict and not np.all(values == values[:1]):
                raise PyTritonRuntimeError(
                    f"The values on the {name!r} input are not equal. "
                    "To proceed, either disable strict mode in @first_value wrapper "
                    "or ensure that the values always are consistent. "
                    f"The current values of {name!r} are {values!r}."
                )
            value = values[0]
            if squeeze_single_values and not np.isscalar(value) and all(dim == 1 for dim in value.shape):
                value = np.squeeze(value)[()]
            inputs[name] = value
        return inputs

    @wrapt.decorator
    def _first_value(wrapped, instance, args, kwargs):
        if not get_model_config(wrapped, instance).batching:
            raise PyTritonRuntimeError("The @first_value decorator can only be used with models that support batching.")
        if any(name not in _SPECIAL_KEYS for name in kwargs):  # batched keyword arguments
            return wrapped(*args, **take_first(kwargs))
        requests, *other_args = args
        return wrapped([take_first(request) for request in requests], *other_args, **kwargs)

    return _first_value


__all__ = [
    "ConstantPadder", "InferenceRequest", "InferenceRequests", "InferenceResult", "InferenceResults", "InputNames",
    "ModelConfigDict", "TRITON_CONTEXT_FIELD_NAME", "TritonContext", "batch", "convert_output", "fill_optionals",
    "first_value", "get_inference_request_batch_size", "get_model_config", "get_triton_context", "group_by_keys",
    "group_by_values", "pad_batch", "sample", "triton_context",
]

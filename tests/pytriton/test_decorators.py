"""kernel.decorators: PyTriton-compatible decorators for bound inference callables.

These are library functions, so they are called directly with the request
objects the in-process backend hands to a bound callable.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from kernel.decorators import (
    TRITON_CONTEXT_FIELD_NAME,
    ConstantPadder,
    ModelConfigDict,
    TritonContext,
    batch,
    convert_output,
    fill_optionals,
    first_value,
    get_inference_request_batch_size,
    get_model_config,
    group_by_keys,
    group_by_values,
    pad_batch,
    sample,
    triton_context,
)
from kernel.exceptions import PyTritonBadParameterError, PyTritonRuntimeError, PyTritonValidationError
from kernel.model_config import DynamicBatcher
from kernel.model_config.triton_model_config import TensorSpec, TritonModelConfig
from kernel.proxy.types import Request


def bind(infer_fn, config: TritonModelConfig) -> TritonContext:
    """What Triton.bind() does for decorators: register the config and attach the context."""
    context = TritonContext()
    context.model_configs[infer_fn] = config
    owner = infer_fn.__self__ if hasattr(infer_fn, "__self__") else infer_fn
    owner.__triton_context__ = context
    return context


def add_sub_config(**overrides) -> TritonModelConfig:
    spec = dict(
        model_name="AddSub",
        inputs=[TensorSpec("a", (-1,), np.float32), TensorSpec("b", (-1,), np.float32)],
        outputs=[TensorSpec("add", (-1,), np.float32), TensorSpec("sub", (-1,), np.float32)],
        max_batch_size=16,
    )
    spec.update(overrides)
    return TritonModelConfig(**spec)


def f32(*rows):
    return np.array(rows, dtype=np.float32)


def three_requests():
    """Batch sizes 2, 3 and 1, the way the dynamic batcher hands them over."""
    return [
        Request({"a": f32([1, 2], [3, 4]), "b": f32([10, 20], [30, 40])}),
        Request({"a": f32([5, 6], [7, 8], [9, 10]), "b": f32([1, 1], [1, 1], [1, 1])}),
        Request({"a": f32([0, 0]), "b": f32([2, 2])}),
    ]


def assert_outputs_equal(actual: dict, expected: dict):
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=name)
        assert np.asarray(actual[name]).dtype == np.asarray(value).dtype, name


# ---------------------------------------------------------------- @batch


def test_batch_stacks_requests_and_splits_outputs_by_request_batch_size():
    seen = {}

    @batch
    def add_sub(a, b):
        seen["a"], seen["b"] = a, b
        return {"add": a + b, "sub": a - b}

    requests = three_requests()
    responses = add_sub(requests)

    assert seen["a"].shape == (6, 2) and seen["b"].shape == (6, 2)
    assert len(responses) == 3
    for request, response in zip(requests, responses):
        assert_outputs_equal(response, {"add": request["a"] + request["b"], "sub": request["a"] - request["b"]})
    assert [get_inference_request_batch_size(r) for r in responses] == [2, 3, 1]


def test_batch_handles_bytes_tensors():
    @batch
    def identity(text):
        assert text.dtype == np.object_ and text.shape == (3, 1)
        return {"echo": np.char.upper(text.astype(bytes))}

    responses = identity([
        Request({"text": np.array([[b"ab"], [b"cd"]], dtype=object)}),
        Request({"text": np.array([[b"xyz"]], dtype=object)}),
    ])
    np.testing.assert_array_equal(responses[0]["echo"], np.array([[b"AB"], [b"CD"]]))
    np.testing.assert_array_equal(responses[1]["echo"], np.array([[b"XYZ"]]))


def test_batch_refuses_requests_with_different_inputs():
    @batch
    def infer(**inputs):
        raise AssertionError("must not be called")

    requests = [Request({"a": f32([1, 2]), "b": f32([1, 2])}), Request({"a": f32([1, 2])})]
    with pytest.raises(PyTritonValidationError, match="different set of inputs keys"):
        infer(requests)


def test_batch_reports_outputs_with_wrong_batch_size():
    @batch
    def infer(a, b):
        return {"add": a + b, "short": a[:2]}

    with pytest.raises(ValueError, match=r"short: \(2, 2\).*Expected batch size: 6"):
        infer(three_requests())


def test_batch_passes_missing_and_extra_outputs_through_unchanged():
    @batch
    def infer(a, b):
        return {"add": a + b, "debug": a * 0}  # no "sub", one undeclared output

    responses = infer(three_requests())
    assert [sorted(r) for r in responses] == [["add", "debug"]] * 3


def test_batch_maps_list_and_tuple_outputs_to_config_names():
    @batch
    def as_list(a, b):
        return [a + b, a - b]

    @batch
    def as_tuple(a, b):
        return a + b, a - b

    for infer in (as_list, as_tuple):
        bind(infer, add_sub_config())
        responses = infer(three_requests())
        assert_outputs_equal(responses[2], {"add": f32([2, 2]), "sub": f32([-2, -2])})


def test_batch_list_output_of_wrong_length_and_unbound_callable_are_clear_errors():
    @batch
    def one_output(a, b):
        return [a + b]

    bind(one_output, add_sub_config())
    with pytest.raises(PyTritonValidationError, match=r"returned 1 outputs.*declares 2 \(add, sub\)"):
        one_output(three_requests())

    @batch
    def unbound(a, b):
        return [a + b, a - b]

    with pytest.raises(PyTritonValidationError, match="__triton_context__"):
        unbound(three_requests())


def test_batch_rejects_non_array_output():
    @batch
    def infer(a, b):
        return {"add": (a + b).tolist()}

    with pytest.raises(PyTritonValidationError, match="'add' must be a numpy array, got list"):
        infer(three_requests())


def test_batch_splits_each_yield_of_a_decoupled_generator():
    @batch
    def stream(a, b):
        for step in range(3):
            yield {"add": a + b + step}

    requests = three_requests()
    steps = list(stream(requests))
    assert len(steps) == 3
    for step, responses in enumerate(steps):
        assert [r["add"].shape[0] for r in responses] == [2, 3, 1]
        np.testing.assert_array_equal(responses[1]["add"], requests[1]["a"] + requests[1]["b"] + step)


def test_batch_with_async_callable_returns_coroutine_of_split_outputs():
    @batch
    async def add(a, b):
        await asyncio.sleep(0)
        return [a + b, a - b]

    bind(add, add_sub_config())
    responses = asyncio.run(add(three_requests()))
    assert [r["add"].shape[0] for r in responses] == [2, 3, 1]
    np.testing.assert_array_equal(responses[0]["sub"], f32([-9, -18], [-27, -36]))


def test_batch_with_async_generator_splits_each_yield():
    @batch
    async def stream(a, b):
        for step in range(2):
            await asyncio.sleep(0)
            yield {"add": a + step}

    async def collect():
        return [responses async for responses in stream(three_requests())]

    steps = asyncio.run(collect())
    assert len(steps) == 2
    np.testing.assert_array_equal(steps[1][2]["add"], f32([1, 1]))


def test_batch_on_callable_object_reads_config_from_the_object():
    class AddSub:
        @batch
        def __call__(self, a, b):
            return [a + b, a - b]

    model = AddSub()
    bind(model, add_sub_config())
    responses = model(three_requests())
    assert_outputs_equal(responses[2], {"add": f32([2, 2]), "sub": f32([-2, -2])})


# ---------------------------------------------------------------- @sample


def test_sample_passes_first_request_as_kwargs():
    @sample
    def infer(a, b):
        return {"add": a + b}

    responses = infer([Request({"a": f32(1, 2), "b": f32(3, 4)})])
    assert len(responses) == 1
    np.testing.assert_array_equal(responses[0]["add"], f32(4, 6))


def test_sample_list_output_and_generator():
    @sample
    def as_list(a, b):
        return [a + b, a - b]

    bind(as_list, add_sub_config(batching=False, max_batch_size=0))
    responses = as_list([Request({"a": f32(1, 2), "b": f32(3, 4)})])
    assert_outputs_equal(responses[0], {"add": f32(4, 6), "sub": f32(-2, -2)})

    @sample
    def tokens(text):
        for word in text[0].split():
            yield {"token": np.array([word], dtype=object)}

    steps = list(tokens([Request({"text": np.array([b"hello big world"], dtype=object)})]))
    assert [step[0]["token"][0] for step in steps] == [b"hello", b"big", b"world"]


# ---------------------------------------------------------------- @group_by_keys


def test_group_by_keys_calls_once_per_input_set_and_keeps_request_order():
    calls = []

    @group_by_keys
    def infer(requests):
        key_sets = {tuple(sorted(r.keys())) for r in requests}
        assert len(key_sets) == 1
        calls.append(key_sets.pop())
        return [{"n": np.array([len(r.keys())])} for r in requests]

    requests = [
        Request({"a": f32([1]), "b": f32([1])}),
        Request({"a": f32([1])}),
        Request({"b": f32([1]), "a": f32([1])}),
        Request({"a": f32([1]), "c": f32([1])}),
    ]
    responses = infer(requests)
    assert sorted(calls) == [("a",), ("a", "b"), ("a", "c")]
    assert [int(r["n"][0]) for r in responses] == [2, 1, 2, 2]


def test_group_by_keys_before_batch_with_optional_input():
    @group_by_keys
    @batch
    def infer(a, b=None):
        out = a if b is None else a + b
        return {"out": out}

    responses = infer([Request({"a": f32([1])}), Request({"a": f32([1]), "b": f32([5])}), Request({"a": f32([2])})])
    assert [float(r["out"][0, 0]) for r in responses] == [1.0, 6.0, 2.0]


def test_group_by_keys_with_async_callable():
    @group_by_keys
    @batch
    async def infer(a, b=None):
        await asyncio.sleep(0)
        return {"out": a if b is None else a + b}

    responses = asyncio.run(infer([Request({"a": f32([1]), "b": f32([5])}), Request({"a": f32([2])})]))
    assert [float(r["out"][0, 0]) for r in responses] == [6.0, 2.0]


def test_group_by_keys_refuses_generators_clearly():
    @group_by_keys
    def stream(requests):
        yield [{"x": r["a"]} for r in requests]

    with pytest.raises(PyTritonRuntimeError, match="does not support generator"):
        stream([Request({"a": f32([1])})])


# ---------------------------------------------------------------- @group_by_values and ConstantPadder


def test_group_by_values_splits_by_value_and_restores_sample_order():
    calls = []

    @group_by_values("temperature")
    def infer(prompt, temperature):
        assert len(np.unique(temperature)) == 1
        calls.append(temperature.shape[0])
        return {"scaled": prompt * temperature}

    prompt = f32([1], [2], [3], [4], [5])
    temperature = f32([0.5], [1.0], [0.5], [2.0], [1.0])
    result = infer(prompt=prompt, temperature=temperature)
    assert sorted(calls) == [1, 2, 2]
    np.testing.assert_array_equal(result["scaled"], prompt * temperature)
    assert result["scaled"].dtype == np.float32


def test_group_by_values_on_bytes_and_two_keys():
    calls = []

    @group_by_values("mode", "k")
    def infer(x, mode, k):
        calls.append((mode[0, 0], int(k[0])))
        return {"y": x * k[:, None]}

    mode = np.array([[b"fast"], [b"slow"], [b"fast"], [b"fast"]], dtype=object)
    k = np.array([1, 1, 2, 1], dtype=np.int64)
    x = np.arange(4, dtype=np.int64)[:, None]
    result = infer(x=x, mode=mode, k=k)
    assert sorted(calls) == [(b"fast", 1), (b"fast", 2), (b"slow", 1)]
    np.testing.assert_array_equal(result["y"], [[0], [1], [4], [3]])


def test_group_by_values_different_shapes_need_a_padder():
    @group_by_values("n")
    def make(n):
        return {"seq": np.ones((n.shape[0], int(n[0])), dtype=np.int32)}

    with pytest.raises(PyTritonRuntimeError, match=r"'seq' has different shapes.*ConstantPadder"):
        make(n=np.array([1, 3, 1]))


def test_group_by_values_with_constant_padder_pads_shapes_and_widens_strings():
    @group_by_values("n", pad_fn=ConstantPadder(-1))
    def make(n):
        width = int(n[0])
        return {
            "seq": np.full((n.shape[0], width), width, dtype=np.int32),
            "word": np.array([[b"x" * width]] * n.shape[0]),
        }

    result = make(n=np.array([1, 3, 1]))
    np.testing.assert_array_equal(result["seq"], [[1, -1, -1], [3, 3, 3], [1, -1, -1]])
    assert result["seq"].dtype == np.int32
    assert result["word"].dtype == np.dtype("S3")
    assert result["word"][:, 0].tolist() == [b"x", b"xxx", b"x"]


def test_constant_padder_directly():
    padded = ConstantPadder(pad_value=7)([
        {"a": np.zeros((1, 2), np.float32), "s": np.array([["ab"]])},
        {"a": np.zeros((2, 3), np.float32)},
        {"s": np.array([["abcd"], ["e"]])},
    ])
    assert [sorted(p) for p in padded] == [["a", "s"], ["a"], ["s"]]
    np.testing.assert_array_equal(padded[0]["a"], [[0, 0, 7]])
    assert padded[0]["a"].dtype == np.float32 and padded[1]["a"].shape == (2, 3)
    assert padded[0]["s"].dtype == np.dtype("<U4") and padded[2]["s"].dtype == np.dtype("<U4")

    with pytest.raises(PyTritonRuntimeError, match="same dtype"):
        ConstantPadder()([{"a": np.zeros((1, 1), np.float32)}, {"a": np.zeros((1, 1), np.int32)}])


def test_group_by_values_must_sit_below_batch():
    @group_by_values("a")
    @batch
    def infer(a):
        return {"a": a}

    with pytest.raises(PyTritonRuntimeError, match="must be used after the @batch decorator"):
        infer(a=f32([1], [2]))


def test_batch_over_group_by_values_async():
    calls = []

    @batch
    @group_by_values("t")
    async def infer(x, t):
        await asyncio.sleep(0)
        calls.append(float(t[0, 0]))
        return {"y": x * t}

    requests = [
        Request({"x": f32([1], [2]), "t": f32([2], [3])}),
        Request({"x": f32([4]), "t": f32([2])}),
    ]
    responses = asyncio.run(infer(requests))
    assert sorted(calls) == [2.0, 3.0]
    np.testing.assert_array_equal(responses[0]["y"], f32([2], [6]))
    np.testing.assert_array_equal(responses[1]["y"], f32([8]))


# ---------------------------------------------------------------- @first_value


FIRST_VALUE_CONFIG = TritonModelConfig(model_name="fv", inputs=[], outputs=[])


def test_first_value_on_batched_kwargs_squeezes_single_values():
    seen = {}

    @first_value("temperature", "shape", "absent")
    def infer(**inputs):
        seen.update(inputs)
        return inputs

    bind(infer, FIRST_VALUE_CONFIG)
    infer(x=f32([1], [2]), temperature=f32([[0.7]], [[0.7]]), shape=np.array([[1, 2], [1, 2]]))
    assert seen["temperature"] == np.float32(0.7) and isinstance(seen["temperature"], np.float32)
    np.testing.assert_array_equal(seen["shape"], [1, 2])
    assert seen["x"].shape == (2, 1) and "absent" not in seen


def test_first_value_without_squeeze_and_with_strings():
    @first_value("t", squeeze_single_values=False)
    def keep(**inputs):
        return inputs

    @first_value("word")
    def words(**inputs):
        return inputs

    bind(keep, FIRST_VALUE_CONFIG)
    bind(words, FIRST_VALUE_CONFIG)
    np.testing.assert_array_equal(keep(t=f32([0.5], [0.5]))["t"], f32(0.5))
    assert words(word=np.array([[b"hi"], [b"hi"]], dtype=object))["word"] == b"hi"


def test_first_value_strict_mismatch_is_an_error_unless_disabled():
    @first_value("t")
    def strict(**inputs):
        return inputs

    @first_value("t", strict=False)
    def lenient(**inputs):
        return inputs

    bind(strict, FIRST_VALUE_CONFIG)
    bind(lenient, FIRST_VALUE_CONFIG)
    with pytest.raises(PyTritonRuntimeError, match="values on the 't' input are not equal"):
        strict(t=f32([1], [2]))
    with pytest.raises(PyTritonRuntimeError, match="not equal"):
        strict(t=np.array([b"a", b"b"], dtype=object))
    assert lenient(t=f32([1], [2]))["t"] == 1.0


def test_first_value_on_request_list():
    @first_value("t")
    def infer(requests):
        return [{"t": np.array([r["t"]])} for r in requests]

    bind(infer, FIRST_VALUE_CONFIG)
    responses = infer([Request({"t": f32([3], [3])}), Request({"t": f32([4])})])
    assert [float(r["t"][0]) for r in responses] == [3.0, 4.0]


def test_first_value_rejects_reserved_keys_and_non_batching_models():
    with pytest.raises(PyTritonBadParameterError, match="not allowed as keys for @first_value"):
        first_value("__triton_context__")

    @first_value("t")
    def infer(**inputs):
        return inputs

    bind(infer, TritonModelConfig(model_name="nb", batching=False, inputs=[], outputs=[]))
    with pytest.raises(PyTritonRuntimeError, match="only be used with models that support batching"):
        infer(t=f32([1]))


def test_batch_over_first_value():
    @batch
    @first_value("w")
    def infer(a, w):
        return {"out": a * w}

    bind(infer, add_sub_config())
    responses = infer([Request({"a": f32([1, 2]), "w": f32([3])}), Request({"a": f32([4, 5]), "w": f32([3])})])
    np.testing.assert_array_equal(responses[1]["out"], f32([12, 15]))
    with pytest.raises(PyTritonRuntimeError, match="not equal"):
        infer([Request({"a": f32([1, 2]), "w": f32([3])}), Request({"a": f32([4, 5]), "w": f32([2])})])


# ---------------------------------------------------------------- @fill_optionals


def optional_config(batching=True):
    return TritonModelConfig(
        model_name="opt",
        batching=batching,
        max_batch_size=8 if batching else 0,
        inputs=[
            TensorSpec("a", (-1,), np.float32),
            TensorSpec("t", (1,), np.float32, optional=True),
            TensorSpec("name", (1,), bytes, optional=True),
        ],
        outputs=[TensorSpec("out", (-1,), np.float32)],
    )


def test_fill_optionals_tiles_defaults_over_the_batch():
    @fill_optionals(t=np.array([2.0], dtype=np.float32), name=np.array([b"anon"], dtype=object))
    def infer(requests):
        return [dict(r.items()) for r in requests]

    bind(infer, optional_config())
    responses = infer([
        Request({"a": f32([1, 2], [3, 4])}),
        Request({"a": f32([5]), "t": f32([9]), "name": np.array([[b"bob"]], dtype=object)}),
    ])
    np.testing.assert_array_equal(responses[0]["t"], f32([2], [2]))
    assert responses[0]["name"].shape == (2, 1) and responses[0]["name"][1, 0] == b"anon"
    np.testing.assert_array_equal(responses[1]["t"], f32([9]))
    assert responses[1]["name"][0, 0] == b"bob"


def test_fill_optionals_without_batching_uses_default_as_is():
    @fill_optionals(t=np.array([2.0], dtype=np.float32))
    def infer(requests):
        return [dict(r.items()) for r in requests]

    bind(infer, optional_config(batching=False))
    np.testing.assert_array_equal(infer([Request({"a": f32(1, 2)})])[0]["t"], f32(2))


@pytest.mark.parametrize(
    "defaults, message",
    [
        ({"z": np.array([1.0], dtype=np.float32)}, "Could not found z inputs"),
        ({"t": 2.0}, "t=2.0 defaults as they are not NumPy arrays"),
        ({"t": np.array([2.0])}, "t: dtype=float64 expected_dtype=.*float32.*different than input signature dtypes"),
        ({"t": np.array([[2.0]], dtype=np.float32)}, r"t: shape=\(1, 1\) expected_shape=\(1,\)"),
        ({"a": np.array([1.0, 2.0], dtype=np.int32)}, "a: dtype=int32"),
    ],
)
def test_fill_optionals_defaults_not_matching_the_model_are_rejected(defaults, message):
    @fill_optionals(**defaults)
    def infer(requests):
        raise AssertionError("must not be called")

    bind(infer, optional_config())
    with pytest.raises(PyTritonBadParameterError, match=message):
        infer([Request({"a": f32([1])})])


def test_fill_optionals_warns_about_default_for_required_input(caplog):
    @fill_optionals(a=np.array([1.0, 2.0], dtype=np.float32))
    def infer(requests):
        return [dict(r.items()) for r in requests]

    bind(infer, optional_config())
    with caplog.at_level(logging.WARNING, logger="kernel.decorators"):
        infer([Request({"a": f32([1])})])
        infer([Request({"a": f32([1])})])
    warnings = [record.getMessage() for record in caplog.records if "never used" in record.getMessage()]
    assert len(warnings) == 1 and "defaults for a" in warnings[0]


def test_fill_optionals_then_batch_then_first_value_like_pytriton_example():
    @fill_optionals(t=np.array([2.0], dtype=np.float32))
    @batch
    @first_value("w")
    def add_sub(a, b, t, **inputs):
        w = inputs.get("w", 1)
        return {"add": a * w + b + t, "sub": a * w - b + t}

    config = TritonModelConfig(
        model_name="AddSubOptional",
        max_batch_size=128,
        inputs=[
            TensorSpec("a", (-1,), np.float32),
            TensorSpec("b", (-1,), np.float32),
            TensorSpec("t", (-1,), np.float32, optional=True),
            TensorSpec("w", (-1,), np.float32, optional=True),
        ],
        outputs=[TensorSpec("add", (-1,), np.float32), TensorSpec("sub", (-1,), np.float32)],
    )
    bind(add_sub, config)
    responses = add_sub([
        Request({"a": f32([1, 2]), "b": f32([10, 20])}),
        Request({"a": f32([3, 4], [5, 6]), "b": f32([1, 1], [1, 1])}),
    ])
    np.testing.assert_array_equal(responses[0]["add"], f32([13, 24]))
    np.testing.assert_array_equal(responses[1]["sub"], f32([4, 5], [6, 7]))


# ---------------------------------------------------------------- @pad_batch, @triton_context, convert_output


def test_pad_batch_repeats_last_sample_up_to_preferred_or_max_batch_size():
    seen = []

    @pad_batch
    def infer(**inputs):
        seen.append(inputs)
        return inputs

    config = TritonModelConfig("padded", max_batch_size=8, batcher=DynamicBatcher(preferred_batch_size=[6, 2, 4]))
    bind(infer, config)
    infer(a=np.array([[1], [2], [3]]), b=np.array([[1, 2], [1, 2], [9, 9]]))
    np.testing.assert_array_equal(seen[0]["a"], [[1], [2], [3], [3]])
    np.testing.assert_array_equal(seen[0]["b"][-2:], [[9, 9], [9, 9]])
    infer(a=np.array([[1]] * 7))
    assert seen[1]["a"].shape == (8, 1)

    @pad_batch
    def no_preferred(**inputs):
        return inputs

    bind(no_preferred, TritonModelConfig("padded", max_batch_size=4))
    assert no_preferred(a=np.array([[5]]))["a"].tolist() == [[5]] * 4


def test_triton_context_passes_the_bound_context():
    @triton_context
    def infer(requests, **kwargs):
        context = kwargs[TRITON_CONTEXT_FIELD_NAME]
        return context.model_configs[infer].model_name

    context = bind(infer, add_sub_config())
    assert infer([]) == "AddSub"
    assert isinstance(context, TritonContext)

    class Model:
        @triton_context
        def infer(self, requests, triton_context):
            return get_model_config(self.infer, self).model_name, triton_context

    model = Model()
    model_context = bind(model.infer, add_sub_config(model_name="Method"))
    assert model.infer([]) == ("Method", model_context)


def test_triton_context_on_unbound_callable_is_a_clear_error():
    @triton_context
    def infer(requests, **kwargs):
        return []

    with pytest.raises(PyTritonValidationError, match="must be bound with Triton"):
        infer([])


def test_convert_output_dict_list_tuple_and_bad_type():
    config = add_sub_config()
    add, sub = f32([1]), f32([2])
    assert convert_output({"x": add}) == {"x": add}
    assert convert_output([add, sub], model_config=config) == {"add": add, "sub": sub}
    assert convert_output((add, sub), model_config=config) == {"add": add, "sub": sub}
    with pytest.raises(PyTritonValidationError, match="Unsupported output type"):
        convert_output(add, model_config=config)


# ---------------------------------------------------------------- full stack and context keys


def test_documented_full_stack():
    calls = []

    @fill_optionals(temperature=np.array([0.7], dtype=np.float32))
    @group_by_keys
    @batch
    @group_by_values("temperature")
    @first_value("temperature")
    @triton_context
    def infer(triton_context, prompt, temperature, opt=None):
        calls.append((float(temperature), prompt.shape[0], opt is not None))
        assert triton_context.model_configs[infer].model_name == "llm"
        return {"out": prompt * temperature}

    config = TritonModelConfig(
        model_name="llm",
        max_batch_size=8,
        inputs=[
            TensorSpec("prompt", (1,), np.float32),
            TensorSpec("temperature", (1,), np.float32, optional=True),
            TensorSpec("opt", (1,), np.float32, optional=True),
        ],
        outputs=[TensorSpec("out", (1,), np.float32)],
    )
    bind(infer, config)
    responses = infer([
        Request({"prompt": f32([1], [2])}),
        Request({"prompt": f32([3]), "temperature": f32([2.0])}),
        Request({"prompt": f32([4]), "opt": f32([0])}),
        Request({"prompt": f32([5]), "temperature": f32([0.7])}),
    ])
    assert sorted(calls) == sorted([(np.float32(0.7), 3, False), (2.0, 1, False), (np.float32(0.7), 1, True)])
    np.testing.assert_allclose(responses[0]["out"], f32([0.7], [1.4]))
    np.testing.assert_allclose(responses[1]["out"], f32([6.0]))
    np.testing.assert_allclose(responses[2]["out"], f32([2.8]))
    np.testing.assert_allclose(responses[3]["out"], f32([3.5]))


def test_model_config_dict_keys():
    def plain(requests):
        return requests

    wrapped = batch(plain)

    class Model:
        def __call__(self, requests):
            return requests

    model = Model()
    configs = ModelConfigDict()
    configs[wrapped] = TritonModelConfig("wrapped")
    configs[model] = TritonModelConfig("object")
    assert configs[plain].model_name == "wrapped"  # wrapper and wrapped function share an entry
    assert configs[model.__call__].model_name == "object"  # bound __call__ keys by its object
    assert set(configs) == {wrapped, model} and len(configs) == 2
    del configs[model]
    assert len(configs) == 1 and list(configs) == [wrapped]

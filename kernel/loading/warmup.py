"""Model warmup: the `model_warmup` samples of a model's config, run on every instance before
the version is READY.

Why it runs here and this way (what tritonserver 2.51 was seen to do with Python-backend models):

- Each sample runs `count` times (0 means once) on every instance, after the instance has
  started and before the loader makes the version READY, so a client never meets a cold model.
- A sample with `batch_size: N` on a batching model (max_batch_size > 0) is N requests of batch
  size 1 handed to the model in one execution; all N share the sample's data. A model without
  batching gets requests shaped exactly as the sample's dims, and N above its max_batch_size
  fails the load as in Triton ("batch size N for '<instance>', max allowed is M", once per request).
- `zero_data` is zeros (empty strings for BYTES); `random_data` is random bytes, drawn once per
  sample and instance (for BYTES, as in Triton, empty strings: random bytes would not be valid
  length-prefixed strings); `input_data_file` is the raw content of `<model dir>/warmup/<file>`
  (for BYTES, 4-byte little-endian length-prefixed elements).
- The first failing response fails the load with Triton's wording, "failed to run warmup sample
  '<name>': <the model's error>; ", and the sample is not run again.
- Warmup requests go straight to each instance (not through the scheduler: they must reach
  every instance, not whichever is free) and, as in Triton, they count in the model's
  statistics: the backend reports their executions like any other.

Files are read once per load, off the event loop.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from kernel.core import datatypes
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest, InferResponse, InferTensor
from kernel.protos.model_config_pb2 import DataType

WARMUP_FOLDER = "warmup"


class _Sample:
    """One model_warmup entry made into tensors: (name, datatype, shape, bytes) per input."""

    __slots__ = ("name", "batch_size", "count", "tensors")

    def __init__(self, name: str, batch_size: int, count: int, tensors: list[tuple[str, str, tuple, bytes]]):
        self.name = name
        self.batch_size = batch_size
        self.count = count
        self.tensors = tensors

    def requests(self, model) -> list[InferRequest]:
        out = []
        for _ in range(max(1, self.batch_size)):
            request = InferRequest(
                model.name, model.version_str,
                inputs=[InferTensor(name, datatype, shape, raw=data) for name, datatype, shape, data in self.tensors],
            )
            out.append(request)
        return out


def has_warmup(model) -> bool:
    return bool(model.config.model_warmup)


async def run_warmup(model) -> None:
    """Run the model's warmup samples on each of its instances; raise KernelError when one fails."""
    await asyncio.gather(*(_warm_instance(model, inst) for inst in model.instances))


async def _warm_instance(model, instance) -> None:
    samples = await asyncio.to_thread(_build_samples, model)  # random data drawn per instance
    for sample in samples:
        for _ in range(max(1, sample.count)):
            requests = sample.requests(model)
            if len(requests) > max(1, model.max_batch_size):  # each request is refused, as in Triton
                errors = [f"batch size {len(requests)} for '{instance.name}', max allowed is {model.max_batch_size}"
                          ] * len(requests)
            else:
                try:
                    for r in requests:
                        model.validate(r)  # a sample that does not fit the model fails like a bad request would
                except KernelError as exc:
                    errors = [exc.message]
                else:
                    responses = await _execute(instance, requests)
                    errors = [r.error.message for r in responses if r.error is not None]
            if errors:
                raise KernelError(
                    ErrorCode.INVALID_ARG,
                    f"failed to run warmup sample '{sample.name}': " + "".join(f"{e}; " for e in errors),
                )


async def _execute(instance, requests: list[InferRequest]) -> list[InferResponse]:
    """Hand `requests` to `instance` as one execution; their final responses (errors included)."""
    loop = asyncio.get_running_loop()
    futures = []
    for request in requests:
        fut = loop.create_future()

        def on_response(response: InferResponse, fut=fut) -> None:
            if response.final and not fut.done():
                fut.set_result(response)
            elif response.error is not None and not fut.done():
                fut.set_result(response)

        request.on_response = on_response
        request.arrival_ns = time.monotonic_ns()
        futures.append(fut)
    instance.submit(requests)
    return list(await asyncio.gather(*futures))


def _build_samples(model) -> list[_Sample]:
    """The tensors of every warmup sample (reads input_data_file files: run off the event loop)."""
    samples = []
    batching = model.max_batch_size > 0
    for warmup in model.config.model_warmup:
        tensors = []
        for name, spec in sorted(warmup.inputs.items()):
            datatype = datatypes.config_type_to_datatype(DataType.Name(spec.data_type))
            dims = tuple(int(d) for d in spec.dims)
            if any(d < 0 for d in dims):
                raise KernelError(
                    ErrorCode.INVALID_ARG,
                    f"warmup setting expects all variable-size dimensions are specified for input '{name}'",
                )
            count = datatypes.element_count(dims)
            which = spec.WhichOneof("input_data_type")
            if which == "input_data_file":
                data = _read_file(model, warmup.name, name, spec.input_data_file)
            elif datatype == "BYTES":
                data = bytes(4 * count)  # zero_data and random_data alike: empty strings
            elif which == "random_data":
                data = os.urandom(count * datatypes.ELEMENT_SIZE[datatype])
            elif which == "zero_data":
                data = bytes(count * datatypes.ELEMENT_SIZE[datatype])
            else:
                raise KernelError(
                    ErrorCode.INVALID_ARG,
                    f"warmup setting expects input '{name}' to have input_data_type set",
                )
            shape = (1, *dims) if batching else dims
            tensors.append((name, datatype, shape, data))
        samples.append(_Sample(warmup.name, int(warmup.batch_size), int(warmup.count), tensors))
    return samples


def _read_file(model, sample: str, input_name: str, filename: str) -> bytes:
    folder = Path(model.source.model_dir) / WARMUP_FOLDER
    path = folder / filename
    try:
        if folder.resolve() not in path.resolve().parents:
            raise OSError("the file must be inside the model's warmup folder")
        return path.read_bytes()
    except OSError as exc:
        raise KernelError(
            ErrorCode.INVALID_ARG,
            f"failed to run warmup sample '{sample}': failed to read input data file '{path}' for input "
            f"'{input_name}': {exc.strerror or exc}",
        ) from None

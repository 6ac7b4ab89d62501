"""The classification extension: an output asked for with a `classification` parameter of N
comes back as its top N classes instead of its values, as tritonserver answers it.

Each class is the BYTES string "<value>:<index>" (":<label>" added when the output's
`label_filename` in the model config names a label for that index; the file is read from
the model folder, one label per line). The value is printed as C++'s std::to_string prints
it ("%f" for FP32/FP64, the integer for integer types). A batching model's output is
classified per batch item: shape [batch, min(N, classes)], else [min(N, classes)].
Other datatypes are refused with Triton's words. A count of 0 asks for no classification.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest, InferResponse, InferTensor

PARAMETER = "classification"
_FLOATS = frozenset(("FP32", "FP64"))
_INTEGERS = frozenset(("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"))


def requested(request: InferRequest) -> Optional[dict[str, int]]:
    """{output name: class count} for the outputs the request asks to classify; None if none.

    Raises KernelError(INVALID_ARG) for a count that is not a non-negative integer.
    """
    counts = None
    for o in request.outputs:
        params = o.parameters
        if not params or PARAMETER not in params:
            continue
        count = params[PARAMETER]
        if not isinstance(count, int) or isinstance(count, bool) or count < 0 or count > 0xFFFFFFFF:
            raise KernelError(
                ErrorCode.INVALID_ARG,
                f"invalid '{PARAMETER}' parameter for output '{o.name}': expected an unsigned integer, got {count!r}",
            )
        if count:
            counts = counts or {}
            counts[o.name] = count
    return counts


def wrap(request: InferRequest, model, counts: dict[str, int]) -> None:
    """Make the request's responses carry the top classes of the outputs in `counts`."""
    deliver = request.on_response
    labels = _labels(model)
    batching = model.max_batch_size > 0

    def on_response(response: InferResponse) -> None:
        if response.error is None and response.outputs:
            try:  # a new response: the model's own may be kept (response cache)
                response = InferResponse(response.model_name, response.model_version, response.id, [
                    _classify(t, counts[t.name], labels.get(t.name), batching) if t.name in counts else t
                    for t in response.outputs
                ], response.parameters, None, response.final)
            except KernelError as exc:
                response = InferResponse(response.model_name, response.model_version, response.id,
                                         error=exc, final=response.final)
        deliver(response)

    request.on_response = on_response


def _labels(model) -> dict[str, list[str]]:
    """{output name: its labels}, read once per loaded model version."""
    cached = getattr(model, "_classification_labels", None)
    if cached is not None:
        return cached
    out: dict[str, list[str]] = {}
    source = getattr(model, "source", None)
    folder = getattr(source, "model_dir", None)
    for spec in model.config.output:
        if spec.label_filename and folder is not None:
            try:
                text = (Path(folder) / spec.label_filename).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue  # a missing label file was refused at load time, or gives no labels
            out[spec.name] = text.splitlines()
    try:
        model._classification_labels = out
    except AttributeError:
        pass
    return out


def _format(value, datatype: str) -> str:
    if datatype in _FLOATS:
        return "%f" % float(value)
    return str(int(value))


def _classify(tensor: InferTensor, count: int, labels: Optional[list[str]], batching: bool) -> InferTensor:
    datatype = tensor.datatype
    if datatype not in _FLOATS and datatype not in _INTEGERS:
        raise KernelError(
            ErrorCode.INVALID_ARG, f"class result not available for output due to unsupported type '{datatype}'"
        )
    values = tensor.as_numpy()
    shape = tuple(tensor.shape)
    batch = shape[0] if batching and shape else 0
    rows = values.reshape(max(1, batch), -1) if values.size else values.reshape(max(1, batch), 0)
    per_row = rows.shape[1]
    k = min(count, per_row)
    out = []
    for row in rows:
        order = sorted(range(per_row), key=lambda i: row[i], reverse=True)[:k]
        for i in order:
            text = f"{_format(row[i], datatype)}:{i}"
            if labels is not None and i < len(labels) and labels[i]:
                text += ":" + labels[i]
            out.append(text.encode("utf-8"))
    arr = np.empty(len(out), dtype=np.object_)
    arr[:] = out
    new_shape = (batch, k) if batch else (k,)
    return InferTensor(tensor.name, "BYTES", new_shape, array=arr.reshape(new_shape))

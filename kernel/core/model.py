"""A loaded model version: its configuration, its instances, and request checks.

Validation runs on every request, so everything it needs is precomputed here
once per load (per-input datatype and dims, required inputs, output names).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from kernel.core import datatypes
from kernel.core.backend import BackendInstance, ModelSource
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest
from kernel.core.stats import ModelStats


class ModelState(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # KServe v2 name, e.g. "FP32", "BYTES"
    dims: tuple[int, ...]  # from the config, without the batch dimension
    optional: bool = False


def _dims_str(dims) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


class Model:
    """One version of a model. `instances` is empty until the backend has loaded it."""

    def __init__(self, source: ModelSource, config_dict: dict, platform: str):
        self.source = source
        self.name = source.name
        self.version = source.version
        self.version_str = str(source.version)
        self.config = source.config
        self.config_dict = config_dict
        self.platform = platform
        self.state = ModelState.LOADING
        self.reason = ""
        self.instances: list[BackendInstance] = []
        self.scheduler: Any = None
        # The server's kernel.core.cache.ResponseCache when this version's config enables
        # response_cache and the server has a cache (set at load); None: requests go
        # straight to the scheduler.
        self.response_cache: Any = None
        self.is_ensemble = source.config.HasField("ensemble_scheduling")
        self.stats = ModelStats(source.name, str(source.version))
        cfg = source.config
        self.max_batch_size = cfg.max_batch_size
        self.decoupled = cfg.model_transaction_policy.decoupled
        self.inputs = {
            i.name: TensorSpec(
                i.name,
                datatypes.config_type_to_datatype(_enum_name(cfg, "input", i.data_type)),
                tuple(i.dims),
                i.optional,
            )
            for i in cfg.input
        }
        self.outputs = {
            o.name: TensorSpec(o.name, datatypes.config_type_to_datatype(_enum_name(cfg, "output", o.data_type)), tuple(o.dims))
            for o in cfg.output
        }
        self.required_inputs = [n for n, s in self.inputs.items() if not s.optional]
        # Whether any input is BYTES: checking one's elements is linear in their number, so a large
        # one is validated beside the loop (kernel.core.admission).
        self.bytes_inputs = any(s.datatype == "BYTES" for s in self.inputs.values())
        # A model without declared outputs (auto-complete may leave none) accepts any request output.
        self.check_outputs = bool(self.outputs)

    @property
    def ready(self) -> bool:
        if self.is_ensemble:  # no instances of its own
            return self.state is ModelState.READY
        return self.state is ModelState.READY and any(i.healthy for i in self.instances)

    def metadata(self, versions: list[str]) -> dict:
        batch = [-1] if self.max_batch_size > 0 else []
        return {
            "name": self.name,
            "versions": versions,
            "platform": self.platform,
            "inputs": [
                {"name": s.name, "datatype": s.datatype, "shape": batch + list(s.dims)} for s in self.inputs.values()
            ],
            "outputs": [
                {"name": s.name, "datatype": s.datatype, "shape": batch + list(s.dims)} for s in self.outputs.values()
            ],
        }

    def validate_tagged(self, request: InferRequest) -> None:
        """validate(), its errors tagged with the request id as Triton tags request-validation errors
        (all but an unknown requested output's)."""
        try:
            self.validate(request)
        except UnknownOutput:
            raise
        except KernelError as exc:
            exc.message = f"[request id: {request.id or '<id_unknown>'}] {exc.message}"
            exc.args = (exc.message,)
            raise

    def validate(self, request: InferRequest) -> None:
        """Raise KernelError(INVALID_ARG) with Triton's wording if the request does not fit."""
        name = self.name
        specs = self.inputs
        if len(request.inputs) > len(specs) or len(request.inputs) < len(self.required_inputs):
            self._count_error(request)  # tritonserver counts before it looks at any name
        seen = 0
        batch_size = None
        for t in request.inputs:
            spec = specs.get(t.name)
            if spec is None:
                raise KernelError(ErrorCode.INVALID_ARG, f"unexpected inference input '{t.name}' for model '{name}'")
            seen += 1
            if t.datatype != spec.datatype:
                raise KernelError(
                    ErrorCode.INVALID_ARG,
                    f"inference input '{t.name}' data-type is '{t.datatype}', but model '{name}' expects '{spec.datatype}'",
                )
            shape = t.shape
            dims = spec.dims
            if self.max_batch_size > 0:
                if not shape or shape[0] < 1 or shape[0] > self.max_batch_size:
                    if shape and shape[0] > self.max_batch_size:
                        raise KernelError(
                            ErrorCode.INVALID_ARG,
                            f"inference request batch-size must be <= {self.max_batch_size} for '{name}'",
                        )
                    self._shape_error(t.name, [-1] + list(dims), shape)
                if batch_size is None:
                    batch_size = shape[0]
                elif shape[0] != batch_size:
                    raise KernelError(
                        ErrorCode.INVALID_ARG,
                        f"inference request batch-size must be the same for all inputs of '{name}'",
                    )
                item_shape = shape[1:]
            else:
                item_shape = shape
            if len(item_shape) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, item_shape)):
                full = ([-1] if self.max_batch_size > 0 else []) + list(dims)
                self._shape_error(t.name, full, shape)
            if any(s < 0 for s in shape):
                self._shape_error(t.name, list(dims), shape)
            self._check_byte_size(t)
        if seen != len(specs) or seen != len(request.inputs):
            self._check_required(request)
        if request.outputs and self.check_outputs:
            for o in request.outputs:
                if o.name not in self.outputs:
                    raise UnknownOutput(f"unexpected inference output '{o.name}' for model '{name}'")

    def _shape_error(self, input_name: str, expected, got) -> None:
        raise KernelError(
            ErrorCode.INVALID_ARG,
            f"unexpected shape for input '{input_name}' for model '{self.name}'. "
            f"Expected {_dims_str(expected)}, got {_dims_str(got)}. " + (_BATCH_NOTE if self.max_batch_size > 0 else ""),
        )

    def _check_byte_size(self, t) -> None:
        raw = t._raw
        if raw is None:
            if t.device is None:
                return  # built from a numpy array: consistent by construction
            raw = t.device  # a GPU tensor (never BYTES): len() is its size
        count = datatypes.element_count(t.shape)
        if t.datatype == "BYTES":
            try:
                datatypes.check_bytes(raw, count)
            except ValueError as exc:
                raise KernelError(
                    ErrorCode.INVALID_ARG,
                    f"input byte size mismatch for input '{t.name}' for model '{self.name}'. {exc}",
                ) from None
            return
        expected = count * datatypes.ELEMENT_SIZE[t.datatype]
        if len(raw) != expected:
            raise KernelError(
                ErrorCode.INVALID_ARG,
                f"input byte size mismatch for input '{t.name}' for model '{self.name}'. "
                f"Expected {expected}, got {len(raw)}",
            )

    def _check_required(self, request: InferRequest) -> None:
        names = [t.name for t in request.inputs]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise KernelError(
                ErrorCode.INVALID_ARG, f"input '{dup}' was specified more than once for model '{self.name}'"
            )
        if any(n not in names for n in self.required_inputs):
            self._count_error(request)

    def _count_error(self, request: InferRequest) -> None:
        """Triton's words for inputs that do not add up. Its list of given inputs is in the order
        of its std::unordered_map, which for a few names is the reverse of the order sent; with no
        input missing its list of missing ones reads ']' (sic: tritonserver 2.51)."""
        names = [t.name for t in request.inputs]
        missing = [n for n in self.required_inputs if n not in names]
        got = "[" + ",".join(f"'{n}'" for n in reversed(names)) + "]" if names else "[]"
        want = "[" + ",".join(f"'{n}'" for n in missing) + "]" if missing else "]"
        if len(self.required_inputs) == len(self.inputs):
            head = f"expected {len(self.inputs)} inputs but got {len(names)} inputs"
        else:
            head = (
                f"expected number of inputs between {len(self.required_inputs)} and {len(self.inputs)} "
                f"but got {len(names)} inputs"
            )
        raise KernelError(
            ErrorCode.INVALID_ARG,
            f"{head} for model '{self.name}'. Got input(s) {got}, but missing required input(s) {want}. "
            "Please provide all required input(s).",
        )


_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim in "
    "your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
    "more info on max_batch_size."
)


class UnknownOutput(KernelError):
    """A requested output the model does not have: Triton says so without the '[request id: ...]' prefix."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_ARG, message)


def _enum_name(cfg, field: str, value: int) -> str:
    # DataType enum value -> 'TYPE_FP32'
    return cfg.DESCRIPTOR.fields_by_name[field].message_type.fields_by_name["data_type"].enum_type.values_by_number[value].name

"""Completing a config as tritonserver does: server-side defaults (normalize_config) and the
backend's auto-complete result (apply_autocomplete)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


from kernel.core.errors import ErrorCode, KernelError
from kernel.protos.model_config_pb2 import (
    ModelConfig,
)

from kernel.config.constants import PLATFORMS_FOR_BACKEND, ENSEMBLE_PLATFORM, KIND, PYTHON_BACKEND, PYTHON_FILENAME, SEQUENCE_IDLE_DEFAULT_US, invalid


# --------------------------------------------------------------------------- auto-completion

# Platform -> backend that Triton fills in when only the platform is given.
_BACKEND_FOR_PLATFORM = {
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
    "tensorrt_plan": "tensorrt",
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "libtorch": "pytorch",
    "torch_aoti": "pytorch",
}
# Backend -> the platform Triton fills in when only the backend is given.
_PLATFORM_FOR_BACKEND = {"tensorrt": "tensorrt_plan", "onnxruntime": "onnxruntime_onnx", "pytorch": "pytorch_libtorch"}
_DEFAULT_FILENAME_FOR_PLATFORM = {
    "tensorflow_savedmodel": "model.savedmodel",
    "tensorflow_graphdef": "model.graphdef",
    "tensorrt_plan": "model.plan",
    "onnxruntime_onnx": "model.onnx",
    "pytorch_libtorch": "model.pt",
    "libtorch": "model.pt",
    "torch_aoti": "model.pt2",
}
# Backends that start two CPU instances per group by default.
_TWO_CPU_INSTANCE_BACKENDS = frozenset({"tensorflow", "onnxruntime"})


def folder_name_mismatch(folder: str, name: str) -> str:
    """Triton's words for a config whose name is not its folder's (a poll failure there)."""
    return f"unexpected directory name '{folder}' for model '{name}', directory name must equal model name"


def normalize_config(
    cfg: ModelConfig,
    model_name: str,
    *,
    default_max_batch_size: int = 4,
    autocomplete_supports_batching: bool | None = None,
    model_path: Path | None = None,
    gpus: Sequence[int] = (),
) -> None:
    """Fill in what Triton's core fills in before a model loads (in place, idempotent).

    - name from the folder; a different explicit name is an error,
    - backend "python" and default_model_filename "model.py" for Python models
      (detected from model.py in the first version folder when `model_path` is given),
    - version_policy latest{num_versions: 1},
    - dynamic_batching.preferred_batch_size [max_batch_size] when empty,
      sequence_batching idle timeout 1 s and oldest.preferred_batch_size,
    - optimization.{input,output}_pinned_memory.enable = true,
    - instance groups: one default group named after the model, unnamed groups
      named "<model>_<index>", KIND_AUTO resolved (CPU when `gpus` is empty),
      count 1, KIND_GPU groups get every GPU in `gpus`.

    `autocomplete_supports_batching` is what a backend's own auto-complete
    concluded about batching; see apply_default_max_batch_size.
    """
    _complete_backend_fields(cfg, model_name, model_path)
    if cfg.name != model_name:
        raise invalid(folder_name_mismatch(model_name, cfg.name))
    if autocomplete_supports_batching is not None:
        apply_default_max_batch_size(cfg, default_max_batch_size, supports_batching=autocomplete_supports_batching)
    _normalize_scheduling(cfg)
    _normalize_instance_groups(cfg, gpus)


def _first_version_dir(model_path: Path) -> Path | None:
    # Triton inspects the first sub-folder in name order; hidden folders are
    # skipped here so an editor's or notebook's dot-folder cannot hide model.py.
    try:
        subdirs = sorted(p for p in model_path.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return None
    return subdirs[0] if subdirs else None


def _complete_backend_fields(cfg: ModelConfig, model_name: str, model_path: Path | None) -> None:
    if not cfg.name:
        cfg.name = model_name
    if cfg.platform == ENSEMBLE_PLATFORM:
        return
    if not cfg.backend and cfg.platform in _BACKEND_FOR_PLATFORM:
        cfg.backend = _BACKEND_FOR_PLATFORM[cfg.platform]
    if cfg.backend in PLATFORMS_FOR_BACKEND:
        if not cfg.platform and cfg.backend in _PLATFORM_FOR_BACKEND:
            cfg.platform = _PLATFORM_FOR_BACKEND[cfg.backend]
        if not cfg.default_model_filename and cfg.platform in _DEFAULT_FILENAME_FOR_PLATFORM:
            cfg.default_model_filename = _DEFAULT_FILENAME_FOR_PLATFORM[cfg.platform]
        return
    if not cfg.backend:
        if cfg.default_model_filename == PYTHON_FILENAME:
            cfg.backend = PYTHON_BACKEND
        elif not cfg.platform and not cfg.default_model_filename and model_path is not None:
            version_dir = _first_version_dir(model_path)
            if version_dir is not None and (version_dir / PYTHON_FILENAME).exists():
                cfg.backend = PYTHON_BACKEND
    if cfg.backend == PYTHON_BACKEND:
        if not cfg.default_model_filename:
            cfg.default_model_filename = PYTHON_FILENAME
        return
    if not cfg.backend and not cfg.platform and not cfg.default_model_filename and model_path is not None:
        # Last resort, as in Triton: a folder named "<anything>.<backend>".
        _, dot, backend = model_name.partition(".")
        if not dot:
            raise invalid(
                f"Invalid model name: Could not determine backend for model '{model_name}' with no "
                "backend in model configuration. Expected model name of the form 'model.<backend_name>'."
            )
        cfg.backend = backend
        cfg.default_model_filename = f"model.{backend}"


def _normalize_scheduling(cfg: ModelConfig) -> None:
    if not cfg.HasField("version_policy"):
        cfg.version_policy.latest.num_versions = 1
    choice = cfg.WhichOneof("scheduling_choice")
    if choice == "dynamic_batching":
        db = cfg.dynamic_batching
        if not db.preferred_batch_size and cfg.max_batch_size > 0:
            db.preferred_batch_size.append(cfg.max_batch_size)
    elif choice == "sequence_batching":
        sb = cfg.sequence_batching
        if sb.max_sequence_idle_microseconds == 0:
            sb.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
        if sb.HasField("oldest") and not sb.oldest.preferred_batch_size and cfg.max_batch_size > 0:
            sb.oldest.preferred_batch_size.append(cfg.max_batch_size)
    if choice != "ensemble_scheduling":
        opt = cfg.optimization
        if not opt.HasField("input_pinned_memory"):
            opt.input_pinned_memory.enable = True
        if not opt.HasField("output_pinned_memory"):
            opt.output_pinned_memory.enable = True


def _normalize_instance_groups(cfg: ModelConfig, gpus: Sequence[int]) -> None:
    if cfg.HasField("ensemble_scheduling"):
        return  # ensembles run no instances of their own
    available = set(gpus)
    if not cfg.instance_group:
        # The Python backend prefers GPU instances when GPUs exist, else CPU.
        default = cfg.instance_group.add()
        default.name = cfg.name  # note: no "_0" suffix on the default group
        default.kind = KIND.KIND_GPU if available else KIND.KIND_CPU
    for index, group in enumerate(cfg.instance_group):
        if not group.name:
            group.name = f"{cfg.name}_{index}"
        if group.kind == KIND.KIND_AUTO:
            usable = bool(available) and all(g in available for g in group.gpus)
            group.kind = KIND.KIND_GPU if usable else KIND.KIND_CPU
        if group.count < 1:
            two = group.kind == KIND.KIND_CPU and cfg.backend in _TWO_CPU_INSTANCE_BACKENDS
            group.count = 2 if two else 1
        if group.kind == KIND.KIND_GPU and not group.gpus:
            group.gpus.extend(sorted(available))


def apply_default_max_batch_size(cfg: ModelConfig, default: int, *, supports_batching: bool | None = None) -> None:
    """Triton's `--backend-config=default-max-batch-size` rule (default 4).

    Triton leaves it to each backend's own auto-complete: a backend that has
    determined the model *can* batch (ONNX Runtime does) sets an unset (0)
    max_batch_size to the default, and turns on dynamic_batching when the
    result is > 1 and no scheduler is configured; a model it found unable to
    batch must keep max_batch_size 0. The Python backend never consults the
    default - a Python model's batching comes only from config.pbtxt or its
    `auto_complete_config` - so with `supports_batching` None (the Python case)
    this changes nothing, which matches what Triton serves for Python models.
    """
    if supports_batching is None:
        return
    if not supports_batching:
        if cfg.max_batch_size != 0:
            raise invalid(
                f"autofill failed for model '{cfg.name}': model does not support batching while "
                "non-zero max_batch_size is specified"
            )
        return
    if cfg.max_batch_size == 0:
        cfg.max_batch_size = max(int(default), 0)
    if cfg.max_batch_size > 1 and cfg.WhichOneof("scheduling_choice") is None:
        cfg.dynamic_batching.SetInParent()


def apply_autocomplete(cfg: ModelConfig, completed: ModelConfig) -> None:
    """Merge a backend's auto-completed config into `cfg` the way Triton does.

    Only max_batch_size, inputs, outputs, the scheduler (when none was set) and
    model_transaction_policy are taken from `completed`; everything else the
    model returns is ignored. Run normalize_config afterwards (Triton does).
    """
    cfg.max_batch_size = completed.max_batch_size
    del cfg.input[:]
    cfg.input.extend(completed.input)
    del cfg.output[:]
    cfg.output.extend(completed.output)
    mine = cfg.WhichOneof("scheduling_choice")
    theirs = completed.WhichOneof("scheduling_choice")
    if mine is None:
        if theirs is not None:
            getattr(cfg, theirs).CopyFrom(getattr(completed, theirs))
    elif theirs is not None and theirs != mine:
        raise KernelError(
            ErrorCode.INTERNAL,
            f"Cannot update scheduling choice from {mine} to {theirs} when auto-completing.",
        )
    if completed.HasField("model_transaction_policy"):
        cfg.model_transaction_policy.decoupled = completed.model_transaction_policy.decoupled

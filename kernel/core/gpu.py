"""GPU discovery and readings, asked for lazily.

Why lazy: a CPU box (CI, developers' machines) must start without importing anything GPU-related,
and even on a GPU box only the paths that need a GPU (a KIND_GPU or KIND_AUTO instance group, CUDA
shared memory, the GPU metrics) should pay for NVML. So nothing here imports NVML (`pynvml`, from
nvidia-ml-py) or CuPy at module level; the functions below import them on first use and fall back
to "no GPU" when they are absent. Both come with the optional extra `kernel-inference-server[gpu]`.

Device ids are CUDA's ordinals as the server process sees them (after CUDA_VISIBLE_DEVICES), which
is what Triton's `instance_group.gpus` and `model_instance_device_id` mean.

`KERNEL_GPU_IDS` overrides discovery with a fixed list ("0,1", or "" for none). Why: the
instance-per-GPU fan-out and the KIND_AUTO / KIND_GPU rules must be testable on machines without a
GPU, and an operator can also use it to hand Kernel a subset of the GPUs. Tests may instead pass a
`probe` to `visible_gpu_ids`.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

OVERRIDE_ENV = "KERNEL_GPU_IDS"

_cached: Optional[tuple[int, ...]] = None


def parse_id_list(text: str) -> tuple[int, ...]:
    """'0, 2' -> (0, 2); '' -> (); ValueError for anything that is not a list of ordinals >= 0."""
    ids = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        value = int(part)
        if value < 0:
            raise ValueError(f"GPU id {value} is negative")
        ids.append(value)
    return tuple(dict.fromkeys(ids))


def _driver_present() -> bool:
    """Cheap check before touching any library: an NVIDIA driver leaves these behind."""
    return os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None


def _probe_nvml() -> tuple[int, ...]:
    """Ordinals of the GPUs this process may use, from NVML; () when NVML is absent or fails."""
    try:
        import pynvml  # nvidia-ml-py, the [gpu] extra
    except ImportError:
        return _probe_cupy()
    try:
        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - NVMLError and friends: no usable GPU
        return ()
    return _apply_visible_devices(count)


def _probe_cupy() -> tuple[int, ...]:
    try:
        import cupy  # the [gpu] extra
    except ImportError:
        return ()
    try:
        return tuple(range(cupy.cuda.runtime.getDeviceCount()))  # already honours CUDA_VISIBLE_DEVICES
    except Exception:  # noqa: BLE001 - CUDARuntimeError: no usable GPU
        return ()


def _apply_visible_devices(physical: int) -> tuple[int, ...]:
    """NVML counts every GPU; CUDA ordinals count only the visible ones, in CUDA_VISIBLE_DEVICES order.

    CUDA stops at the first entry it cannot use, so do we; UUID/MIG entries are counted, not resolved.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return tuple(range(physical))
    count = 0
    for entry in visible.split(","):
        entry = entry.strip()
        if not entry:
            break
        if entry.lstrip("-").isdigit():
            if not 0 <= int(entry) < physical:
                break
        elif not entry.startswith(("GPU-", "MIG-")):
            break
        count += 1
    return tuple(range(count))


def visible_gpu_ids(probe: Optional[Callable[[], Sequence[int]]] = None) -> tuple[int, ...]:
    """The GPU ordinals this server may place instances on; () on a machine without GPUs.

    Order of precedence: `probe` (tests), the KERNEL_GPU_IDS override, then the driver through
    NVML (or CuPy), probed once per process and cached.
    """
    global _cached
    if probe is not None:
        return tuple(probe())
    override = os.environ.get(OVERRIDE_ENV)
    if override is not None:
        return parse_id_list(override)
    if _cached is None:
        _cached = _probe_nvml() if _driver_present() else ()
    return _cached


def _nvml_handle(nvml, ordinal: int):
    """NVML's handle for CUDA ordinal `ordinal`.

    Why not nvmlDeviceGetHandleByIndex(ordinal): NVML numbers every GPU in the machine, CUDA only
    the visible ones, in CUDA_VISIBLE_DEVICES order (by index or by UUID), so the two differ as soon
    as that variable is set.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return nvml.nvmlDeviceGetHandleByIndex(ordinal)
    entry = [e.strip() for e in visible.split(",")][ordinal]
    if entry.startswith(("GPU-", "MIG-")):
        return nvml.nvmlDeviceGetHandleByUUID(entry)
    return nvml.nvmlDeviceGetHandleByIndex(int(entry))


# ---- readings for the metrics endpoint ---------------------------------------------------------


@dataclass(frozen=True)
class GpuReading:
    """One GPU's figures as Triton's GPU metrics report them (labelled by `uuid`)."""

    uuid: str
    utilization: float  # 0.0 - 1.0
    memory_total_bytes: int
    memory_used_bytes: int
    power_usage_watts: float
    power_limit_watts: float
    energy_joules: float  # since the server started


class NvmlReader:
    """Reads GPU figures through NVML; `read()` is [] where NVML or a GPU is missing.

    Energy is reported since the reader was made (Triton: "since the Triton Server started"), from
    NVML's total-energy counter (millijoules since the driver loaded).
    """

    def __init__(self, nvml=None):
        self._nvml = nvml  # a module with pynvml's functions; None imports pynvml when first read
        self._handles: Optional[list] = None
        self._energy_start: dict[str, float] = {}

    def _open(self) -> list:
        if self._handles is not None:
            return self._handles
        self._handles = []
        nvml = self._nvml
        if nvml is None:
            if not _driver_present():
                return self._handles
            try:
                import pynvml as nvml  # nvidia-ml-py, the [gpu] extra
            except ImportError:
                return self._handles
            self._nvml = nvml
        try:
            nvml.nvmlInit()
            self._handles = [_nvml_handle(nvml, i) for i in visible_gpu_ids()]
        except Exception:  # noqa: BLE001 - NVMLError: report no GPU
            self._handles = []
        return self._handles

    def read(self) -> list[GpuReading]:
        readings = []
        for handle in self._open():
            try:
                readings.append(self._read_one(handle))
            except Exception:  # noqa: BLE001 - one GPU that cannot be read is left out, as Triton does
                continue
        return readings

    def _read_one(self, handle) -> GpuReading:
        nvml = self._nvml
        uuid = nvml.nvmlDeviceGetUUID(handle)
        if isinstance(uuid, bytes):
            uuid = uuid.decode()
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
        energy_mj = float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        start = self._energy_start.setdefault(uuid, energy_mj)
        return GpuReading(
            uuid=uuid,
            utilization=utilization.gpu / 100.0,
            memory_total_bytes=int(memory.total),
            memory_used_bytes=int(memory.used),
            power_usage_watts=nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            power_limit_watts=nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0,
            energy_joules=(energy_mj - start) / 1000.0,
        )


# Triton's GPU metric families: (name, HELP text, TYPE, GpuReading field).
GPU_METRIC_FAMILIES = (
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge", "utilization"),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge", "memory_total_bytes"),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge", "memory_used_bytes"),
    ("nv_gpu_power_usage", "GPU power usage in watts", "gauge", "power_usage_watts"),
    ("nv_gpu_power_limit", "GPU power management limit in watts", "gauge", "power_limit_watts"),
    ("nv_energy_consumption", "GPU energy consumption in joules since the Triton Server started", "counter",
     "energy_joules"),
)


def render_gpu_metrics(readings: Sequence[GpuReading]) -> str:
    """Prometheus text for the readings, one family per metric, labelled gpu_uuid; '' without GPUs."""
    if not readings:
        return ""
    lines = []
    for name, help_text, kind, field in GPU_METRIC_FAMILIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for r in readings:
            lines.append(f'{name}{{gpu_uuid="{r.uuid}"}} {float(getattr(r, field)):.6f}')
    return "\n".join(lines) + "\n"

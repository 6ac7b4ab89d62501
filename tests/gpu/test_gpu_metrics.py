"""GPU metrics (Triton's nv_gpu_* families), from an injected NVML so they are checked without a GPU.

The fake below stands in for the `pynvml` module (nvidia-ml-py): same function names, same units
(milliwatts, millijoules, percent). kernel.core.gpu.NvmlReader turns them into Triton's units and
the metrics service renders them with Triton's names, help texts and `gpu_uuid` label.
"""

from __future__ import annotations

import types

import pytest

from kernel.core import gpu
from kernel.observe.metrics import MetricsService


class FakeNvml:
    def __init__(self, devices):
        self.devices = devices  # index -> dict of readings
        self.inits = 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.devices[i]

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"].encode()  # older pynvml returns bytes

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(total=h["total"], used=h["used"], free=h["total"] - h["used"])

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=h["util"], memory=0)

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return h["energy_mj"]

    def nvmlDeviceGetPowerUsage(self, h):
        return h["power_mw"]

    def nvmlDeviceGetPowerManagementLimit(self, h):
        return h["limit_mw"]


DEVICES = {
    0: dict(uuid="GPU-aaaa", total=80 << 30, used=1 << 30, util=37, energy_mj=1_000_000, power_mw=61_500,
            limit_mw=700_000),
    1: dict(uuid="GPU-bbbb", total=80 << 30, used=0, util=0, energy_mj=5_000, power_mw=40_000, limit_mw=700_000),
}


class FakeServer:
    """What the collector reads from a server: no models, no custom metrics."""

    class registry:
        @staticmethod
        def all_models():
            return []

    class custom_metrics:
        @staticmethod
        def collect(kinds):
            return []

    response_cache = None


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setenv(gpu.OVERRIDE_ENV, "0,1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = FakeNvml({k: dict(v) for k, v in DEVICES.items()})
    return nvml


def test_reader_converts_units(two_gpus):
    reader = gpu.NvmlReader(two_gpus)
    first = reader.read()
    assert [r.uuid for r in first] == ["GPU-aaaa", "GPU-bbbb"]
    r0 = first[0]
    assert (r0.utilization, r0.memory_total_bytes, r0.memory_used_bytes) == (0.37, 80 << 30, 1 << 30)
    assert (r0.power_usage_watts, r0.power_limit_watts, r0.energy_joules) == (61.5, 700.0, 0.0)
    two_gpus.devices[0]["energy_mj"] += 2_500  # 2.5 J later
    assert reader.read()[0].energy_joules == 2.5
    assert two_gpus.inits == 1  # NVML is opened once


def test_metrics_text_has_tritons_gpu_families(two_gpus):
    service = MetricsService(FakeServer(), gpu_reader=gpu.NvmlReader(two_gpus))
    text = service.text()
    for line in [
        "# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)",
        "# TYPE nv_gpu_utilization gauge",
        'nv_gpu_utilization{gpu_uuid="GPU-aaaa"} 0.37',
        "# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes",
        f'nv_gpu_memory_total_bytes{{gpu_uuid="GPU-bbbb"}} {80 << 30}',
        "# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes",
        "# HELP nv_gpu_power_usage GPU power usage in watts",
        'nv_gpu_power_usage{gpu_uuid="GPU-aaaa"} 61.5',
        "# HELP nv_gpu_power_limit GPU power management limit in watts",
        "# HELP nv_energy_consumption GPU energy consumption in joules since the Triton Server started",
        "# TYPE nv_energy_consumption counter",
    ]:
        assert line in text, line


def test_no_gpu_no_gpu_families(monkeypatch):
    """A machine without GPUs shows no nv_gpu_* family at all, as Triton's does."""
    monkeypatch.setattr(gpu, "_driver_present", lambda: False)
    service = MetricsService(FakeServer())
    assert "nv_gpu" not in service.text() and "nv_energy" not in service.text()
    assert gpu.render_gpu_metrics([]) == ""


def test_an_unreadable_gpu_is_left_out(two_gpus):
    del two_gpus.devices[1]["power_mw"]
    readings = gpu.NvmlReader(two_gpus).read()
    assert [r.uuid for r in readings] == ["GPU-aaaa"]


def test_allow_gpu_metrics_false_turns_them_off(two_gpus):
    """--allow-gpu-metrics=false, as in tritonserver: the families go, whatever NVML reads."""
    service = MetricsService(FakeServer(), gpu_reader=gpu.NvmlReader(two_gpus), gpu_metrics=False)
    assert "nv_gpu" not in service.text()
    on = MetricsService(FakeServer(), cpu_metrics=False, gpu_reader=gpu.NvmlReader(two_gpus))
    assert "nv_gpu_utilization" in on.text() and "nv_cpu" not in on.text()


def test_cli_flag_reaches_the_metrics_service():
    from kernel.serve import cli

    args = cli.build_parser().parse_args(["serve", "--model-repository=/x", "--allow-gpu-metrics=false"])
    assert args.allow_gpu_metrics is False
    assert "allow-gpu-metrics" not in cli.NO_EFFECT_FLAGS


def test_cuda_visible_devices_selects_the_nvml_devices(monkeypatch):
    """CUDA ordinal 0 under CUDA_VISIBLE_DEVICES=1 is NVML's device 1 (by index, or by UUID)."""
    nvml = FakeNvml({k: dict(v) for k, v in DEVICES.items()})
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: next(d for d in nvml.devices.values() if d["uuid"] == uuid)
    monkeypatch.setenv(gpu.OVERRIDE_ENV, "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [r.uuid for r in gpu.NvmlReader(nvml).read()] == ["GPU-bbbb"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb,0")
    monkeypatch.setenv(gpu.OVERRIDE_ENV, "0,1")
    assert [r.uuid for r in gpu.NvmlReader(nvml).read()] == ["GPU-bbbb", "GPU-aaaa"]

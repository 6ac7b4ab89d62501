"""The CuPy stand-in (tests/gpu/fake_cupy) as the GPU tests use it: a server's environment with it
first on the import path, its log of copies and IPC events read per process, and the stand-in
loaded under another name for the test's own "client" allocations (this process never imports
`cupy`). Shared by the tests that run a real `kernel serve` against it; `infer` by the real-GPU
tests too.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import KernelProcess, running
from gpu_models import gpu_repository

FAKE = Path(__file__).resolve().parent / "fake_cupy"
NO_CUPY = Path(__file__).resolve().parent / "no_cupy"
N = 1 << 16  # 256 KiB of FP32: above the inline limit, so nothing rides in the message itself


def load_fake():
    """The stand-in as a module of its own (not `cupy`): the test's client allocates with it."""
    spec = importlib.util.spec_from_file_location("fake_cupy_client", FAKE / "cupy" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CopyLog:
    """The stand-in's log of copies and IPC events, read from a mark on."""

    def __init__(self, path: Path):
        self.path = path
        path.touch()
        self.mark()

    def mark(self) -> None:
        self._start = self.path.stat().st_size

    def events(self) -> list[tuple[int, str, int]]:
        with open(self.path, "rb") as f:
            f.seek(self._start)
            return [(int(p), e, int(n)) for p, e, n in (line.split() for line in f.read().decode().splitlines())]

    def bytes(self, kind: str) -> int:
        return sum(n for _, e, n in self.events() if e == kind)

    def count(self, kind: str, nbytes: int | None = None, pid: int | None = None) -> int:
        """Events of `kind` (of an allocation of `nbytes`, in process `pid`, where given)."""
        return sum(1 for p, e, n in self.events()
                   if e == kind and (nbytes is None or n == nbytes) and (pid is None or p == pid))

    def pids(self, kind: str, nbytes: int | None = None) -> list[int]:
        """The processes with events of `kind` (of an allocation of `nbytes`), in order of their first."""
        return list(dict.fromkeys(p for p, e, n in self.events() if e == kind and (nbytes is None or n == nbytes)))


def fake_env(tmp: Path, **extra) -> dict:
    return {"PYTHONPATH": os.pathsep.join([str(FAKE), os.environ.get("PYTHONPATH", "")]), "KERNEL_GPU_IDS": "0",
            "FAKE_CUPY_LOG": str(tmp / "copies.log"), **extra}


def until(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    """A `kernel serve` of gpu_models' repository on the stand-in; `copies` reads its log."""
    tmp = tmp_path_factory.mktemp("fake_gpu")
    repo = gpu_repository(tmp / "models")
    server = KernelProcess([repo], env=fake_env(tmp))
    server.copies = CopyLog(tmp / "copies.log")
    yield from running(server)


@pytest.fixture(scope="module")
def fake():
    return load_fake()


def infer(server, model, inputs: dict, outputs=None, protocol="http"):
    """One tritonclient request (the real-GPU tests' too: 120 s for their 64 MiB tensors)."""
    lib = httpclient if protocol == "http" else grpcclient
    c = (httpclient.InferenceServerClient(server.url, network_timeout=120) if protocol == "http"
         else grpcclient.InferenceServerClient(server.grpc_url))
    try:
        ins = []
        for name, value in inputs.items():
            t = lib.InferInput(name, list(value.shape), {np.float32: "FP32", np.int32: "INT32"}[value.dtype.type])
            t.set_data_from_numpy(value)
            ins.append(t)
        return c.infer(model, ins, outputs=[lib.InferRequestedOutput(o) for o in outputs] if outputs else None)
    finally:
        c.close()


def live_exports(server, model="probe") -> int:
    """How many of `model`'s GPU exports are held now (asked of the model: it reports its worker's)."""
    return int(infer(server, model, {"INPUT0": np.zeros(1, np.float32)}).as_numpy("LIVE")[0])

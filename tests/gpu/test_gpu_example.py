"""The bundled GPU example (model_repo_examples_gpu/torch_mlp): a torch network on KIND_GPU, GPU
tensors in and out through DLPack, served by a real `kernel serve` as a user would start it.

It needs torch with CUDA and a GPU (CuPy too: Kernel's side of GPU tensors), so it is skipped, with
the reason, where either is missing: on CI and the developers' machines, and wherever torch is not
installed (scripts/gpu-check.sh runs it on a GPU machine, whose image has torch).
"""

from __future__ import annotations

import base64
import importlib.util

import numpy as np
import pytest

from conftest import ROOT, KernelProcess, running
from test_on_gpu import GPUS, _cupy_region, clients

EXAMPLE = ROOT / "model_repo_examples_gpu"


def _why_not() -> str:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (the GPU example is a torch model)"
    if GPUS == 0:
        return "no GPU (nvidia-smi, CuPy or a CUDA device is absent)"
    import torch

    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return ""


WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)


def reference(x: np.ndarray) -> np.ndarray:
    """The example's network built on the CPU from the same seed."""
    import torch

    spec = importlib.util.spec_from_file_location("torch_mlp_model", EXAMPLE / "torch_mlp" / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with torch.inference_mode():
        return module.build_network().eval()(torch.from_numpy(x)).numpy()


@pytest.fixture(scope="module")
def example():
    yield from running(KernelProcess([EXAMPLE]))


def test_torch_mlp_over_http_and_grpc(example):
    x = np.random.default_rng(0).standard_normal((8, 16), dtype=np.float32)
    want = reference(x)
    for protocol, lib, c in clients(example):
        t = lib.InferInput("INPUT0", [8, 16], "FP32")
        t.set_data_from_numpy(x)
        got = c.infer("torch_mlp", [t]).as_numpy("OUTPUT0")
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4, err_msg=protocol)
        c.close()


def test_torch_mlp_gpu_tensors_in_and_out_through_cuda_shared_memory(example):
    """Input and output in the client's GPU memory: the network reads and writes device memory only."""
    import cupy as cp

    x = np.random.default_rng(1).standard_normal((4, 16), dtype=np.float32)
    d_in, h_in = _cupy_region(x.nbytes)
    d_out, h_out = _cupy_region(4 * 4 * 4)
    d_in[...] = cp.asarray(x.ravel())
    cp.cuda.runtime.deviceSynchronize()
    lib, c = {p: (m, cl) for p, m, cl in clients(example)}["grpc"]
    try:
        c.register_cuda_shared_memory("mlp_in", base64.b64encode(h_in), 0, x.nbytes)
        c.register_cuda_shared_memory("mlp_out", base64.b64encode(h_out), 0, 64)
        t = lib.InferInput("INPUT0", [4, 16], "FP32")
        t.set_shared_memory("mlp_in", x.nbytes)
        o = lib.InferRequestedOutput("OUTPUT0")
        o.set_shared_memory("mlp_out", 64)
        c.infer("torch_mlp", [t], outputs=[o])
        np.testing.assert_allclose(cp.asnumpy(d_out).reshape(4, 4), reference(x), rtol=1e-3, atol=1e-4)
    finally:
        c.unregister_cuda_shared_memory()
        c.close()

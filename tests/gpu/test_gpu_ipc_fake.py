"""GPU tensors between processes as CUDA IPC handles, on a machine without a GPU.

A real `kernel serve` runs with the CuPy stand-in (tests/gpu/fake_cupy) first on its PYTHONPATH and
KERNEL_GPU_IDS=0, so the front and every worker run Kernel's real GPU code against an API whose
"device memory" is memfds shared between processes: handles are really opened in other processes,
copies really move bytes, and the stand-in logs every copy (FAKE_CUPY_LOG) so the tests can say how
many bytes went device -> host across all the server's processes. The client side of CUDA shared
memory is the stand-in too, loaded here under another name (this process never imports `cupy`).

What only a GPU can show (the driver's IPC, real copies, timings) is test_on_gpu.py's.
"""

from __future__ import annotations

import base64
import os
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import KernelProcess, running
from fake_gpu import N, NO_CUPY, fake, fake_env, gpu, infer, live_exports, until  # noqa: F401 - fixtures
from gpu_models import HOST_BLS, HOST_BLS_CONFIG, PROBE, probe_config, write


def clients(server):
    return [("http", httpclient, httpclient.InferenceServerClient(server.url)),
            ("grpc", grpcclient, grpcclient.InferenceServerClient(server.grpc_url))]


# ---- a GPU output goes where it is wanted, copied to the host only for the wire ------------------------


def test_gpu_output_over_the_wire_is_copied_once_in_the_worker(gpu):
    x = np.arange(N, dtype=np.float32)
    for protocol in ("http", "grpc"):
        gpu.copies.mark()
        result = infer(gpu, "gpu_source", {"INPUT0": x}, protocol=protocol)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * 2, err_msg=protocol)
        # one device -> host copy, of the output, and no device-to-device export: nobody could take it
        assert gpu.copies.bytes("d2h") == x.nbytes, (protocol, gpu.copies.events())
        assert gpu.copies.count("d2d") == 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cuda_shared_memory_in_and_out_never_visits_the_host(gpu, fake, protocol):
    """Input region -> execute on the GPU -> output region: device to device all the way."""
    lib = httpclient if protocol == "http" else grpcclient
    c = lib.InferenceServerClient(gpu.url if protocol == "http" else gpu.grpc_url)
    x = np.random.default_rng(1).random(N, dtype=np.float32)
    d_in, d_out = fake.cuda.Memory(x.nbytes), fake.cuda.Memory(x.nbytes)
    fake.runtime.memcpy(d_in.ptr, x.ctypes.data, x.nbytes, 1)
    gpu.copies.mark()
    try:
        for name, mem in (("in", d_in), ("out", d_out)):
            c.register_cuda_shared_memory(name, base64.b64encode(fake.runtime.ipcGetMemHandle(mem.ptr)), 0, x.nbytes)
        t = lib.InferInput("INPUT0", [N], "FP32")
        t.set_shared_memory("in", x.nbytes)
        o = lib.InferRequestedOutput("OUTPUT0")
        o.set_shared_memory("out", x.nbytes)
        on_gpu = lib.InferRequestedOutput("ON_GPU")
        result = c.infer("probe", [t], outputs=[o, on_gpu])
        assert bool(result.as_numpy("ON_GPU")[0]), "the CUDA shared-memory input did not reach execute on the GPU"
        got = np.empty_like(x)
        fake.runtime.memcpy(got.ctypes.data, d_out.ptr, x.nbytes, 2)
        np.testing.assert_array_equal(got, x + 1)
        assert gpu.copies.bytes("d2h") == 0, gpu.copies.events()
        # the worker's export copy, then the front's copy into the client's region
        assert gpu.copies.bytes("d2d") == 2 * x.nbytes
    finally:
        c.unregister_cuda_shared_memory()
        c.close()
    # every mapping of the client's memory (the front's, made at registration, and the worker's, kept
    # open for the next request) is closed again once unregistered, and the export is freed; the
    # front keeps its mapping of the worker's permanent block while that worker runs
    assert until(lambda: gpu.copies.count("ipc_open", x.nbytes) == gpu.copies.count("ipc_close", x.nbytes)), \
        gpu.copies.events()
    assert until(lambda: live_exports(gpu) == 0)


def test_cuda_shared_memory_input_to_a_cpu_input_model_is_copied_in_its_worker(gpu, fake):
    c = httpclient.InferenceServerClient(gpu.url)
    x = np.arange(N, dtype=np.float32)
    d_in = fake.cuda.Memory(x.nbytes)
    fake.runtime.memcpy(d_in.ptr, x.ctypes.data, x.nbytes, 1)
    try:
        c.register_cuda_shared_memory("in", base64.b64encode(fake.runtime.ipcGetMemHandle(d_in.ptr)), 0, x.nbytes)
        t = httpclient.InferInput("INPUT0", [N], "FP32")
        t.set_shared_memory("in", x.nbytes)
        gpu.copies.mark()
        result = c.infer("probe_cpu_inputs", [t])  # FORCE_CPU_ONLY_INPUT_TENSORS: the default, yes
        assert not result.as_numpy("ON_GPU")[0]
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + 1)
        assert gpu.copies.bytes("d2h") == x.nbytes  # once, in the model's worker
        assert int(result.as_numpy("COPIED")[0]) >= x.nbytes
    finally:
        c.unregister_cuda_shared_memory()
        c.close()


def test_ensemble_passes_the_intermediate_on_the_gpu(gpu):
    x = np.arange(N, dtype=np.float32)
    for protocol in ("http", "grpc"):
        gpu.copies.mark()
        result = infer(gpu, "gpu_chain", {"IN": x}, protocol=protocol)
        np.testing.assert_array_equal(result.as_numpy("OUT"), x * 2 + 1, err_msg=protocol)
        assert bool(result.as_numpy("STEP2_ON_GPU")[0]), "the intermediate tensor reached step 2 in host memory"
        assert gpu.copies.bytes("d2h") == x.nbytes, gpu.copies.events()  # only the final output, for the wire
    assert until(lambda: live_exports(gpu) == 0)


# ---- BLS: a GPU tensor between two models -------------------------------------------------------------


def bls(server, mode: int, x=None):
    x = np.arange(N, dtype=np.float32) if x is None else x
    result = infer(server, "bls_caller", {"INPUT0": x, "MODE": np.array([mode], np.int32)})
    return {k: result.as_numpy(k) for k in ("OK", "ON_GPU", "CALLEE_ON_GPU", "COPIED")}


def test_bls_passes_a_gpu_tensor_with_no_host_copy(gpu):
    bls(gpu, 0)  # warm: CuPy probed in both workers
    gpu.copies.mark()
    out = bls(gpu, 0)
    assert out["OK"][0] and out["CALLEE_ON_GPU"][0] and out["ON_GPU"][0], out
    assert gpu.copies.bytes("d2h") == 0, gpu.copies.events()
    # the caller's input export and the callee's output export: one device copy each
    assert gpu.copies.bytes("d2d") == 2 * N * 4
    assert until(lambda: live_exports(gpu) == 0)
    # each worker opened the other's permanent block on the warm call and keeps it: no open per call
    assert gpu.copies.count("ipc_open") == 0, gpu.copies.events()


def test_bls_preferred_memory_is_honoured(gpu):
    cpu = bls(gpu, 1)
    assert cpu["OK"][0] and cpu["CALLEE_ON_GPU"][0] and not cpu["ON_GPU"][0], cpu
    gpu_pref = bls(gpu, 2)
    assert gpu_pref["OK"][0] and gpu_pref["ON_GPU"][0], gpu_pref


def test_bls_host_output_preferred_on_gpu_is_copied_to_the_device(gpu):
    """probe_cpu_inputs answers in host memory; the caller asked for GPU: the caller's worker copies it up."""
    # host_bls asks with preferred GPU from a model that never imported CuPy: its worker probes
    # CuPy (the stand-in works), so the output arrives on the GPU.
    result = infer(gpu, "host_bls", {"INPUT0": np.arange(8, dtype=np.float32)})
    assert bool(result.as_numpy("ON_GPU")[0]) and bool(result.as_numpy("HAS_CUPY")[0])


def test_a_consumer_that_dies_releases_what_it_held(gpu):
    assert until(lambda: live_exports(gpu) == 0)
    assert bls(gpu, 3)["OK"][0]  # the caller keeps probe's GPU output
    assert live_exports(gpu) == 1
    with pytest.raises(Exception):
        bls(gpu, 5)  # the caller's process exits
    assert until(lambda: live_exports(gpu) == 0), "the dead caller's loan still holds the producer's memory"
    assert until(lambda: _ready(gpu, "bls_caller"), 30)


def test_a_producer_that_dies_frees_nothing_of_its_successor(gpu):
    """Tokens name memory of one worker process: the release of an export of a dead worker must
    not reach the worker that replaced it (whose tokens start over)."""
    assert until(lambda: _ready(gpu, "bls_caller"), 30)
    assert bls(gpu, 3)["OK"][0]  # kept[0]: an export of probe's first process
    with pytest.raises(Exception):
        infer(gpu, "probe", {"INPUT0": np.array([-1], np.float32)})  # probe exits
    assert until(lambda: _ready(gpu, "probe"), 30)
    assert bls(gpu, 6)["OK"][0], "a consumer's open mapping stopped working when its producer exited"
    assert bls(gpu, 3)["OK"][0]  # kept[1]: an export of probe's new process, likely the same token
    assert live_exports(gpu) == 1
    bls(gpu, 4)  # drop kept[0]: its producer is gone, nothing may be freed in the new one
    time.sleep(0.3)
    assert live_exports(gpu) == 1, "the release of a dead worker's export freed memory of its successor"
    bls(gpu, 4)
    assert until(lambda: live_exports(gpu) == 0)


def _ready(server, model) -> bool:
    try:
        return httpclient.InferenceServerClient(server.url).is_model_ready(model)
    except Exception:  # noqa: BLE001
        return False


# ---- fallback: no CuPy, or CuPy for another vendor's GPU ------------------------------------------------


@pytest.fixture(scope="module")
def hip(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fake_hip")
    repo = tmp / "models"
    write(repo, "probe", PROBE, probe_config("probe", "KIND_CPU", ""))
    write(repo, "host_bls", HOST_BLS, HOST_BLS_CONFIG)
    server = KernelProcess([repo], env=fake_env(tmp, FAKE_CUPY_HIP="1"))
    yield from running(server)


def test_cupy_for_another_vendor_falls_back_to_host_with_one_log_line(hip):
    for _ in range(2):
        result = infer(hip, "host_bls", {"INPUT0": np.arange(4, dtype=np.float32)})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32) + 1)
        assert not result.as_numpy("ON_GPU")[0]
    line = "GPU tensors of model instance 'host_bls_0_0' go through host memory: CuPy is built for ROCm/HIP"
    assert hip.log().count(line) == 1, hip.log()


def test_cuda_shared_memory_with_cupy_for_another_vendor_goes_through_the_host(hip, fake):
    c = httpclient.InferenceServerClient(hip.url)
    x = np.arange(N, dtype=np.float32)
    d_in, d_out = fake.cuda.Memory(x.nbytes), fake.cuda.Memory(x.nbytes)
    fake.runtime.memcpy(d_in.ptr, x.ctypes.data, x.nbytes, 1)
    try:
        for name, mem in (("in", d_in), ("out", d_out)):
            c.register_cuda_shared_memory(name, base64.b64encode(fake.runtime.ipcGetMemHandle(mem.ptr)), 0, x.nbytes)
        t = httpclient.InferInput("INPUT0", [N], "FP32")
        t.set_shared_memory("in", x.nbytes)
        o = httpclient.InferRequestedOutput("OUTPUT0")
        o.set_shared_memory("out", x.nbytes)
        c.infer("probe", [t], outputs=[o])
        got = np.empty_like(x)
        fake.runtime.memcpy(got.ctypes.data, d_out.ptr, x.nbytes, 2)
        np.testing.assert_array_equal(got, x + 1)
        c.infer("probe", [t], outputs=[o])
    finally:
        c.unregister_cuda_shared_memory()
        c.close()
    assert hip.log().count("CUDA shared memory goes through host memory: CuPy is built for ROCm/HIP") == 1


@pytest.fixture(scope="module")
def no_cupy(tmp_path_factory):
    repo = tmp_path_factory.mktemp("no_cupy") / "models"
    write(repo, "probe", PROBE, probe_config("probe", "KIND_CPU", GPU_INPUTS_NO))
    write(repo, "host_bls", HOST_BLS, HOST_BLS_CONFIG)
    # a GPU, as far as discovery goes, but no CuPy (hidden where it is installed)
    hide = os.pathsep.join([str(NO_CUPY), os.environ.get("PYTHONPATH", "")])
    yield from running(KernelProcess([repo], env={"KERNEL_GPU_IDS": "0", "PYTHONPATH": hide}))


GPU_INPUTS_NO = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "no" } }'


def test_without_cupy_preferred_gpu_stays_on_host_and_imports_nothing(no_cupy):
    for _ in range(2):
        result = infer(no_cupy, "host_bls", {"INPUT0": np.arange(4, dtype=np.float32)})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32) + 1)
        assert not result.as_numpy("ON_GPU")[0]
        assert not result.as_numpy("HAS_CUPY")[0], "a worker on a CPU-only machine imported cupy"
    line = "GPU tensors of model instance 'host_bls_0_0' go through host memory: CuPy is not installed"
    assert no_cupy.log().count(line) == 1, no_cupy.log()


def test_cuda_shared_memory_without_cupy_is_refused(no_cupy):
    """GPU outputs asked for in device memory where the server cannot reach any: a clear 400."""
    from tritonclient.utils import InferenceServerException

    c = httpclient.InferenceServerClient(no_cupy.url)
    with pytest.raises(InferenceServerException) as info:
        c.register_cuda_shared_memory("out", base64.b64encode(b"\1" * 64), 0, 64)
    assert ("failed to register CUDA shared memory region: 'out', CUDA shared memory needs CuPy: "
            "install kernel-inference-server[gpu]") in info.value.message()
    assert info.value.status() == "400"
    c.close()

"""Issues 19 and 28 on a real GPU: what the CPU tests (the rest of tests/gpu) cannot show.

Skipped with the reason "no GPU" where nvidia-smi, CuPy or a CUDA device is missing, so CI and the
developers' machines name them as skipped. On a GPU machine run `bash scripts/gpu-check.sh` (it
installs what the machine lacks from carried wheels, runs this file and the benchmark, and writes
one result file), or by hand with the [gpu] extra and tritonclient[all] installed:

    python -m pytest -v -s tests/gpu/test_on_gpu.py

`-s` shows the timings. One `kernel serve` (real GPU discovery: no KERNEL_GPU_IDS override) serves
the models below and those of gpu_models.py, written into a temp dir. The models report the bytes
Kernel copied in their worker (gpu_worker.COPIED): a GPU tensor passed between processes must add
nothing to device -> host.
"""

from __future__ import annotations

import base64
import importlib.util
import shutil
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from kernel.core import gpu
from fake_gpu import infer
from gpu_models import DLPACK_IDENTITY, GPU_ADD_SUB, gpu_repository


def _gpu_count() -> int:
    if shutil.which("nvidia-smi") is None or importlib.util.find_spec("cupy") is None:
        return 0
    try:
        import cupy

        if getattr(cupy.cuda.runtime, "is_hip", False) or cupy.__version__.endswith("-fake"):
            return 0
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no driver / no device
        return 0


GPUS = _gpu_count()
pytestmark = pytest.mark.skipif(GPUS == 0, reason="no GPU (nvidia-smi, CuPy or a CUDA device is absent)")

MIB64 = 64 << 20

ADD_SUB_CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 0
input [
  {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }},
  {{ name: "INPUT1", data_type: TYPE_FP32, dims: [ -1 ] }}
]
output [
  {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }},
  {{ name: "OUTPUT1", data_type: TYPE_FP32, dims: [ -1 ] }}
]
{extra}
'''

# BLS: hands a GPU tensor to dlpack_identity and checks what comes back.
BLS_GPU = textwrap.dedent('''
    import cupy as cp
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                host = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                x = cp.asarray(host)
                bls = pb_utils.InferenceRequest(
                    model_name="dlpack_identity", requested_output_names=["OUTPUT0"],
                    inputs=[pb_utils.Tensor.from_dlpack("INPUT0", x)],
                    preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0))
                reply = bls.exec()
                if reply.has_error():
                    raise pb_utils.TritonModelException(reply.error().message())
                out = pb_utils.get_output_tensor_by_name(reply, "OUTPUT0")
                y = cp.from_dlpack(out) if not out.is_cpu() else cp.asarray(out.as_numpy())
                if not bool(cp.all(y == x)):
                    raise pb_utils.TritonModelException("BLS GPU tensor came back changed")
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUTPUT0", cp.asnumpy(y)),
                    pb_utils.Tensor("ON_GPU", np.array([not out.is_cpu()], np.bool_))]))
            return responses
''')


def write_model(repo: Path, name: str, code: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(code)
    (repo / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory):
    from conftest import KernelProcess, running

    repo = gpu_repository(tmp_path_factory.mktemp("gpu_models"))
    write_model(repo, "gpu_add_sub", GPU_ADD_SUB,
                ADD_SUB_CONFIG.format(name="gpu_add_sub", extra="instance_group [{ kind: KIND_GPU, count: 1 }]"))
    write_model(repo, "dlpack_identity", DLPACK_IDENTITY, textwrap.dedent('''
        name: "dlpack_identity"
        backend: "python"
        max_batch_size: 0
        input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
        output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
        instance_group [{ kind: KIND_GPU, count: 1, gpus: [0] }]
        parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "no" } }
    '''))
    write_model(repo, "bls_gpu", BLS_GPU, textwrap.dedent('''
        name: "bls_gpu"
        backend: "python"
        max_batch_size: 0
        input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
        output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] },
                { name: "ON_GPU", data_type: TYPE_BOOL, dims: [ 1 ] }]
        instance_group [{ kind: KIND_GPU, count: 1, gpus: [0] }]
    '''))
    # Real GPU discovery: a KERNEL_GPU_IDS in the caller's environment is not passed on (the
    # server's environment is taken when it starts).
    with pytest.MonkeyPatch.context() as env:
        env.delenv(gpu.OVERRIDE_ENV, raising=False)
        server = KernelProcess([repo])
    yield from running(server)


def clients(server):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    return [("http", httpclient, httpclient.InferenceServerClient(server.url)),
            ("grpc", grpcclient, grpcclient.InferenceServerClient(server.grpc_url))]


def test_kind_gpu_add_sub_serves_tritonclient(gpu_server):
    assert "TRITONBACKEND_ModelInstanceInitialize: gpu_add_sub_0_0 (GPU device 0)" in gpu_server.log()
    a = np.arange(16, dtype=np.float32)
    b = np.full(16, 0.5, np.float32)
    for protocol, lib, c in clients(gpu_server):
        ins = [lib.InferInput("INPUT0", [16], "FP32"), lib.InferInput("INPUT1", [16], "FP32")]
        ins[0].set_data_from_numpy(a)
        ins[1].set_data_from_numpy(b)
        result = c.infer("gpu_add_sub", ins)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b, err_msg=protocol)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b, err_msg=protocol)
        c.close()
    # every GPU got an instance when the group names none
    assert gpu_server.log().count("TRITONBACKEND_ModelInstanceInitialize: gpu_add_sub_0_") == GPUS


def test_dlpack_gpu_identity(gpu_server):
    x = np.random.default_rng(0).random(1024, dtype=np.float32)
    for protocol, lib, c in clients(gpu_server):
        t = lib.InferInput("INPUT0", [1024], "FP32")
        t.set_data_from_numpy(x)
        np.testing.assert_array_equal(c.infer("dlpack_identity", [t]).as_numpy("OUTPUT0"), x, err_msg=protocol)
        c.close()


def test_gpu_metrics_are_served(gpu_server):
    import urllib.request

    text = urllib.request.urlopen(f"http://localhost:{gpu_server.metrics_port}/metrics", timeout=10).read().decode()
    for family in ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes",
                   "nv_gpu_power_usage", "nv_gpu_power_limit", "nv_energy_consumption"):
        assert f'{family}{{gpu_uuid="GPU-' in text, family


def _cupy_region(nbytes: int):
    """A device allocation and its raw cudaIpcMemHandle_t (64 bytes), through CuPy."""
    import cupy as cp

    # Its own cudaMalloc (not CuPy's pool): an IPC handle names a whole allocation, so the region
    # must start at the allocation's base.
    memory = cp.cuda.Memory(nbytes)
    buf = cp.ndarray((nbytes // 4,), cp.float32, memptr=cp.cuda.MemoryPointer(memory, 0))
    buf.fill(0)
    handle = cp.cuda.runtime.ipcGetMemHandle(memory.ptr)
    return buf, bytes(handle)


def _shm_round_trip(server, protocol: str, model: str, repeat: int = 5):
    """64 MiB FP32 through `model` with input and output in CUDA shared memory: (median seconds,
    the model's ON_GPU, its COPIED counters after, the output as it is in the output region)."""
    import cupy as cp

    lib, c = {p: (m, cl) for p, m, cl in clients(server)}[protocol]
    n = MIB64 // 4
    d_in, h_in = _cupy_region(MIB64)
    d_out, h_out = _cupy_region(MIB64)
    d_in[...] = cp.random.default_rng(3).random(n, dtype=cp.float32)
    cp.cuda.runtime.deviceSynchronize()
    c.register_cuda_shared_memory("in", base64.b64encode(h_in), 0, MIB64)
    c.register_cuda_shared_memory("out", base64.b64encode(h_out), 0, MIB64)
    try:
        t = lib.InferInput("INPUT0", [n], "FP32")
        t.set_shared_memory("in", MIB64)
        o = lib.InferRequestedOutput("OUTPUT0")
        o.set_shared_memory("out", MIB64)
        extra = [lib.InferRequestedOutput(name) for name in ("ON_GPU", "COPIED")] if model.startswith("probe") else []
        result = c.infer(model, [t], outputs=[o, *extra])  # warm
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            result = c.infer(model, [t], outputs=[o, *extra])
            times.append(time.perf_counter() - start)
        same = bool(cp.all(d_out == (d_in + 1 if model.startswith("probe") else d_in)))
        info = (bool(result.as_numpy("ON_GPU")[0]), result.as_numpy("COPIED").tolist()) if extra else (None, None)
        status = c.get_cuda_shared_memory_status("in")
        if protocol == "http":
            assert status == [{"name": "in", "device_id": 0, "byte_size": MIB64}]
        else:
            assert status.regions["in"].byte_size == MIB64
        return sorted(times)[len(times) // 2], info[0], info[1], same
    finally:
        c.unregister_cuda_shared_memory()
        c.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cuda_shared_memory_round_trip_64mib(gpu_server, protocol):
    """DLPack identity on a 64 MiB FP32 GPU tensor, input and output in CUDA shared memory."""
    median, _, _, same = _shm_round_trip(gpu_server, protocol, "dlpack_identity")
    assert same
    print(f"\n[{protocol}] 64 MiB FP32 DLPack identity via CUDA shm: median {median * 1e3:.1f} ms")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cuda_shared_memory_64mib_stays_on_the_gpu(gpu_server, protocol):
    """The same 64 MiB on the GPU path (FORCE_CPU_ONLY_INPUT_TENSORS no) and on the host path
    (a CPU-input model): no device -> host copy on the first. Both timings are printed (the
    benchmark, benchmarks/gpu_bench.py, records them); the count is the assertion."""
    fast, on_gpu, copied_after, same = _shm_round_trip(gpu_server, protocol, "probe")
    assert same and on_gpu, "the CUDA shared-memory input did not reach execute on the GPU"
    assert copied_after[0] == 0, f"probe's worker copied {copied_after[0]} bytes device -> host"
    slow, on_gpu_host, copied_host, same_host = _shm_round_trip(gpu_server, protocol, "probe_cpu_inputs")
    assert same_host and not on_gpu_host and copied_host[0] >= MIB64
    print(f"\n[{protocol}] 64 MiB via CUDA shm: GPU path {fast * 1e3:.1f} ms, host path {slow * 1e3:.1f} ms")


def test_bls_passes_a_gpu_tensor(gpu_server):
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(gpu_server.url)
    x = np.arange(1 << 20, dtype=np.float32)
    t = httpclient.InferInput("INPUT0", [x.size], "FP32")
    t.set_data_from_numpy(x)
    start = time.perf_counter()
    result = c.infer("bls_gpu", [t])
    print(f"\nBLS 4 MiB GPU tensor round trip: {(time.perf_counter() - start) * 1e3:.1f} ms, "
          f"output on GPU: {bool(result.as_numpy('ON_GPU')[0])}")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    assert bool(result.as_numpy("ON_GPU")[0]), "the BLS output came back in host memory"
    c.close()


def _bls(server, mode: int, n: int = 16 << 18):  # 16 MiB of FP32: the client uploads it over HTTP
    result = infer(server, "bls_caller", {"INPUT0": np.arange(n, dtype=np.float32) % 1000,
                                          "MODE": np.array([mode], np.int32)})
    return {k: result.as_numpy(k) for k in ("OK", "ON_GPU", "CALLEE_ON_GPU", "COPIED")}


def _probe_copied(server) -> list[int]:
    return infer(server, "probe", {"INPUT0": np.zeros(1, np.float32)}).as_numpy("COPIED").tolist()


def test_bls_gpu_tensor_between_two_models_copies_nothing_to_host(gpu_server):
    _bls(gpu_server, 0)  # warm
    callee_before = _probe_copied(gpu_server)
    before = _bls(gpu_server, 0)["COPIED"].tolist()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        out = _bls(gpu_server, 0)
        times.append(time.perf_counter() - start)
    assert out["OK"][0] and out["ON_GPU"][0] and out["CALLEE_ON_GPU"][0], out
    assert out["COPIED"][0] == before[0], "the BLS caller's worker copied device -> host"
    assert _probe_copied(gpu_server)[0] == callee_before[0], "the callee's worker copied device -> host"
    host_times = []
    for _ in range(5):
        start = time.perf_counter()
        host = _bls(gpu_server, 1)  # preferred_memory CPU: the callee copies its output to the host
        host_times.append(time.perf_counter() - start)
    assert host["OK"][0] and not host["ON_GPU"][0]
    print(f"\nBLS 16 MiB (client upload included): GPU tensor {sorted(times)[2] * 1e3:.1f} ms, "
          f"preferred CPU {sorted(host_times)[2] * 1e3:.1f} ms")


def test_ensemble_keeps_the_intermediate_on_the_gpu(gpu_server):
    x = np.arange(1 << 20, dtype=np.float32)
    result = infer(gpu_server, "gpu_chain", {"IN": x})
    np.testing.assert_array_equal(result.as_numpy("OUT"), x * 2 + 1)
    assert bool(result.as_numpy("STEP2_ON_GPU")[0])


def _live(server) -> int:
    return int(infer(server, "probe", {"INPUT0": np.zeros(1, np.float32)}).as_numpy("LIVE")[0])


def _until(check, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.1)
    return check()


def _ready(server, model) -> bool:
    import tritonclient.http as httpclient

    try:
        return httpclient.InferenceServerClient(server.url).is_model_ready(model)
    except Exception:  # noqa: BLE001
        return False


def test_release_rules_on_a_real_gpu(gpu_server):
    """A consumer that dies releases the producer's memory; a producer that dies frees nothing of
    its successor; the server stays up. What a consumer that still holds a mapping sees after its
    producer exited is the driver's business: printed, not asserted, and done last (a CUDA error
    there may spoil that worker's context, so the worker is replaced afterwards)."""
    assert _until(lambda: _live(gpu_server) == 0)
    assert _bls(gpu_server, 3, 1024)["OK"][0]
    assert _live(gpu_server) == 1
    with pytest.raises(Exception):
        _bls(gpu_server, 5, 16)  # the caller exits
    assert _until(lambda: _live(gpu_server) == 0), "a dead consumer's loan still holds the producer's memory"
    assert _until(lambda: _ready(gpu_server, "bls_caller"), 60)

    assert _bls(gpu_server, 3, 1024)["OK"][0]  # kept[0]: an export of probe's first process
    with pytest.raises(Exception):
        infer(gpu_server, "probe", {"INPUT0": np.array([-1], np.float32)})  # the producer exits
    assert _until(lambda: _ready(gpu_server, "probe"), 60)
    assert _bls(gpu_server, 3, 1024)["OK"][0]  # kept[1]: from the new process, likely the same token
    _bls(gpu_server, 4, 16)  # drop kept[0]: nothing may be freed in the new process
    time.sleep(0.5)
    assert _live(gpu_server) == 1, "the release of a dead worker's export freed memory of its successor"
    _bls(gpu_server, 4, 16)
    assert _until(lambda: _live(gpu_server) == 0)

    assert _bls(gpu_server, 3, 1024)["OK"][0]
    with pytest.raises(Exception):
        infer(gpu_server, "probe", {"INPUT0": np.array([-1], np.float32)})
    assert _until(lambda: _ready(gpu_server, "probe"), 60)
    try:
        after = bool(_bls(gpu_server, 6, 16)["OK"][0])
    except Exception as exc:  # noqa: BLE001 - an error is allowed; a server that goes down is not
        after = f"error: {exc}"
    print(f"\nreading a GPU tensor whose producer exited (mapping opened before): {after}")
    with pytest.raises(Exception):
        _bls(gpu_server, 5, 16)  # a fresh caller for whatever comes next
    assert _until(lambda: _ready(gpu_server, "bls_caller"), 60)
    assert _bls(gpu_server, 0, 1024)["OK"][0]


def test_tritonclient_cuda_shared_memory_utilities(gpu_server):
    """The same through tritonclient.utils.cuda_shared_memory. It needs cuda-python (`cuda.bindings`,
    in tritonclient's `cuda` extra; the GPU image has it): missing, this fails rather than skips,
    as only a missing GPU may skip a test."""
    try:
        import cuda.bindings.runtime  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"cuda-python is not installed ({exc}): pip install 'tritonclient[cuda]' "
                    "(or carry cuda-python's wheels)")
    import tritonclient.http as httpclient
    import tritonclient.utils.cuda_shared_memory as cudashm

    c = httpclient.InferenceServerClient(gpu_server.url)
    a = np.arange(16, dtype=np.float32)
    b = np.ones(16, np.float32)
    h_in = cudashm.create_shared_memory_region("in", 128, 0)
    h_out = cudashm.create_shared_memory_region("out", 128, 0)
    try:
        cudashm.set_shared_memory_region(h_in, [a, b])
        c.register_cuda_shared_memory("in", cudashm.get_raw_handle(h_in), 0, 128)
        c.register_cuda_shared_memory("out", cudashm.get_raw_handle(h_out), 0, 128)
        ins = [httpclient.InferInput("INPUT0", [16], "FP32"), httpclient.InferInput("INPUT1", [16], "FP32")]
        ins[0].set_shared_memory("in", 64)
        ins[1].set_shared_memory("in", 64, 64)
        outs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
        outs[0].set_shared_memory("out", 64)
        outs[1].set_shared_memory("out", 64, 64)
        c.infer("gpu_add_sub", ins, outputs=outs)
        got = cudashm.get_contents_as_numpy(h_out, np.float32, [32])
        np.testing.assert_array_equal(got[:16], a + b)
        np.testing.assert_array_equal(got[16:], a - b)
    finally:
        c.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(h_in)
        cudashm.destroy_shared_memory_region(h_out)
        c.close()

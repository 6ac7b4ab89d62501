"""A short GPU benchmark for issue 28: GPU tensors between processes as CUDA IPC handles vs host memory.

Needs a GPU, CuPy and tritonclient (scripts/gpu-check.sh runs it after the tests). It starts one
`kernel serve` over tests/gpu/gpu_models.py's models plus the two below, and measures, each the median
of several runs after a warm-up:

* the device's own ceilings: a 64 MiB device-to-device copy and a 64 MiB device-to-host copy;
* 64 MiB FP32 through a model with input and output in CUDA shared memory: the GPU path (input on the
  GPU, output copied device to device into the region) and the host path (a CPU-input model);
* a BLS call with a 64 MiB GPU tensor in and out, timed inside the calling model: outputs as GPU
  tensors (IPC handles) and with preferred_memory CPU (copied to the host by the callee);
* small-request latency of a KIND_GPU add_sub (GPU outputs copied to the host for the wire) and of the
  CPU add_sub, over HTTP, concurrency 1.

    python benchmarks/gpu_bench.py --out results.json

Prints a table and writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "gpu")]

from conftest import EXAMPLES, KernelProcess  # noqa: E402
from gpu_models import gpu_repository, write  # noqa: E402

MIB64 = 64 << 20

# bls_bench: times `repeat` BLS calls to probe with a GPU tensor of INPUT0's length; MODE 0: outputs
# may come back on the GPU, 1: preferred_memory CPU. MS: the median call, in milliseconds.
BLS_BENCH = textwrap.dedent('''
    import time
    import numpy as np
    import cupy as cp
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
                mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
                x = cp.arange(n, dtype=cp.float32)
                kwargs = {} if mode == 0 else {"preferred_memory": pb_utils.PreferredMemory(
                    pb_utils.TRITONSERVER_MEMORY_CPU, 0)}
                times = []
                for _ in range(8):
                    start = time.perf_counter()
                    reply = pb_utils.InferenceRequest(
                        model_name="probe", requested_output_names=["OUTPUT0"],
                        inputs=[pb_utils.Tensor.from_dlpack("INPUT0", x)], **kwargs).exec()
                    out = pb_utils.get_output_tensor_by_name(reply, "OUTPUT0")
                    y = cp.from_dlpack(out) if not out.is_cpu() else cp.asarray(out.as_numpy())
                    cp.cuda.get_current_stream().synchronize()
                    times.append(time.perf_counter() - start)
                    ok = bool(y[n - 1] == n)
                    del reply, out, y
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("MS", np.array([sorted(times[2:])[3] * 1e3], np.float64)),
                    pb_utils.Tensor("OK", np.array([ok], np.bool_))]))
            return responses
''')

BLS_BENCH_CONFIG = '''
name: "bls_bench"
backend: "python"
max_batch_size: 0
input [{ name: "N", data_type: TYPE_INT32, dims: [ 1 ] }, { name: "MODE", data_type: TYPE_INT32, dims: [ 1 ] }]
output [{ name: "MS", data_type: TYPE_FP64, dims: [ 1 ] }, { name: "OK", data_type: TYPE_BOOL, dims: [ 1 ] }]
instance_group [{ kind: KIND_GPU, count: 1, gpus: [0] }]
'''

GPU_ADD_SUB = textwrap.dedent('''
    import cupy as cp
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                a, b = (cp.asarray(pb_utils.get_input_tensor_by_name(request, n).as_numpy()) for n in ("INPUT0", "INPUT1"))
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUTPUT0", a + b),
                                                             pb_utils.Tensor.from_dlpack("OUTPUT1", a - b)]))
            return responses
''')

GPU_ADD_SUB_CONFIG = '''
name: "gpu_add_sub"
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 4 ] }]
instance_group [{ kind: KIND_GPU, count: 1, gpus: [0] }]
'''


def median_ms(fn, repeat: int = 7, warm: int = 2) -> float:
    for _ in range(warm):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def device_ceilings(cp) -> dict:
    a = cp.random.default_rng(0).random(MIB64 // 4, dtype=cp.float32)
    b = cp.empty_like(a)
    host = np.empty(MIB64 // 4, np.float32)

    def d2d():
        cp.cuda.runtime.memcpy(b.data.ptr, a.data.ptr, MIB64, 3)
        cp.cuda.runtime.deviceSynchronize()

    def d2h():
        cp.cuda.runtime.memcpy(host.ctypes.data, a.data.ptr, MIB64, 2)

    t_d2d, t_d2h = median_ms(d2d, 20, 3), median_ms(d2h, 10, 2)
    return {"d2d_64mib_ms": t_d2d, "d2d_GBps_read_plus_write": 2 * MIB64 / t_d2d / 1e6,
            "d2h_64mib_ms": t_d2h, "d2h_GBps": MIB64 / t_d2h / 1e6}


def shm_round_trip(cp, server, model: str) -> float:
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(server.url, network_timeout=120)
    regions = []
    for name in ("in", "out"):
        memory = cp.cuda.Memory(MIB64)
        regions.append(memory)
        c.register_cuda_shared_memory(name, base64.b64encode(bytes(cp.cuda.runtime.ipcGetMemHandle(memory.ptr))), 0,
                                      MIB64)
    try:
        t = httpclient.InferInput("INPUT0", [MIB64 // 4], "FP32")
        t.set_shared_memory("in", MIB64)
        o = httpclient.InferRequestedOutput("OUTPUT0")
        o.set_shared_memory("out", MIB64)
        return median_ms(lambda: c.infer(model, [t], outputs=[o]))
    finally:
        c.unregister_cuda_shared_memory()
        c.close()


def bls_ms(server, mode: int) -> float:
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(server.url, network_timeout=120)
    ins = [httpclient.InferInput("N", [1], "INT32"), httpclient.InferInput("MODE", [1], "INT32")]
    ins[0].set_data_from_numpy(np.array([MIB64 // 4], np.int32))
    ins[1].set_data_from_numpy(np.array([mode], np.int32))
    result = c.infer("bls_bench", ins)
    c.close()
    assert result.as_numpy("OK")[0]
    return float(result.as_numpy("MS")[0])


def small_latency(server, model: str) -> float:
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(server.url)
    ins = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
    for t in ins:
        t.set_data_from_numpy(np.ones(4, np.float32))
    ms = median_ms(lambda: c.infer(model, ins), repeat=200, warm=20)
    c.close()
    return ms


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where the JSON results go")
    parser.add_argument("--work", type=Path, default=None, help="folder for the model repository (default: a temp dir)")
    args = parser.parse_args(argv)
    import tempfile

    import cupy as cp

    work = args.work or Path(tempfile.mkdtemp(prefix="kernel-gpu-bench-"))
    repo = gpu_repository(work / "models")
    write(repo, "bls_bench", BLS_BENCH, BLS_BENCH_CONFIG)
    write(repo, "gpu_add_sub", GPU_ADD_SUB, GPU_ADD_SUB_CONFIG)
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    results = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), **device_ceilings(cp)}
    server = KernelProcess([repo])
    try:
        server.wait_ready(120)
        results["shm_64mib_gpu_path_ms"] = shm_round_trip(cp, server, "probe")
        results["shm_64mib_host_path_ms"] = shm_round_trip(cp, server, "probe_cpu_inputs")
        results["bls_64mib_gpu_tensor_ms"] = bls_ms(server, 0)
        results["bls_64mib_preferred_cpu_ms"] = bls_ms(server, 1)
        results["small_gpu_add_sub_http_ms"] = small_latency(server, "gpu_add_sub")
        results["small_cpu_add_sub_http_ms"] = small_latency(server, "add_sub")
    finally:
        server.stop()
    args.out.write_text(json.dumps(results, indent=1))
    width = max(map(len, results))
    for key, value in results.items():
        print(f"{key:<{width}}  {value:.3f}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

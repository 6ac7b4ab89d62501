"""Model folders for the GPU tensor tests: the same models run against the CuPy stand-in
(tests/gpu/fake_cupy, test_gpu_ipc_fake.py) and against real CuPy on a GPU (test_on_gpu.py).

Each model reports what a client cannot see: where its input was (ON_GPU) and the bytes Kernel
copied in its process (COPIED: device to host, device to device, host to device; read from
kernel.backends.python.gpu_worker.COPIED, the worker's own counters) and how many of its GPU
exports are still held (LIVE). GPU_ADD_SUB and DLPACK_IDENTITY are plain Python-backend models:
benchmarks/gpu_vs_triton.py serves them to real Triton too.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

# add_sub whose instance reports where it runs, and computes on its GPU through DLPack.
GPU_ADD_SUB = textwrap.dedent('''
    import cupy as cp
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            assert args["model_instance_kind"] == "GPU", args["model_instance_kind"]
            self.device = int(args["model_instance_device_id"])

        def execute(self, requests):
            responses = []
            with cp.cuda.Device(self.device):
                for request in requests:
                    ins = [pb_utils.get_input_tensor_by_name(request, n) for n in ("INPUT0", "INPUT1")]
                    a, b = (cp.from_dlpack(t) if not t.is_cpu() else cp.asarray(t.as_numpy())
                            for t in ins)
                    outs = [pb_utils.Tensor.from_dlpack("OUTPUT0", a + b), pb_utils.Tensor.from_dlpack("OUTPUT1", a - b)]
                    assert not any(o.is_cpu() for o in outs)
                    responses.append(pb_utils.InferenceResponse(outs))
            return responses
''')

# Identity through DLPack on the GPU: the output tensor shares the CuPy array's device memory.
DLPACK_IDENTITY = textwrap.dedent('''
    import cupy as cp
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                t = pb_utils.get_input_tensor_by_name(request, "INPUT0")
                x = cp.from_dlpack(t) if not t.is_cpu() else cp.asarray(t.as_numpy())
                out = pb_utils.Tensor.from_dlpack("OUTPUT0", x)
                back = cp.from_dlpack(out)
                if out.is_cpu() or back.data.ptr != x.data.ptr:
                    raise pb_utils.TritonModelException("DLPack did not keep the tensor on the GPU, in place")
                responses.append(pb_utils.InferenceResponse([out]))
            return responses
''')

# probe: OUTPUT0 = INPUT0 + 1 where INPUT0 is (on the GPU when it arrives there: the output is then
# a GPU tensor too). INPUT0[0] == -1 makes the process exit (a producer that dies).
PROBE = textwrap.dedent('''
    import os
    import numpy as np
    import triton_python_backend_utils as pb_utils
    from kernel.backends.python import gpu_worker

    def report():
        gpu = gpu_worker._support if gpu_worker.loaded() else None
        copied = gpu_worker.COPIED
        return [pb_utils.Tensor("COPIED", np.array([copied["device_to_host"], copied["device_to_device"],
                                                   copied["host_to_device"]], np.int64)),
                pb_utils.Tensor("LIVE", np.array([gpu.arena.live if gpu else 0], np.int64))]

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                t = pb_utils.get_input_tensor_by_name(request, "INPUT0")
                if t.is_cpu():
                    x = t.as_numpy()
                    if x.size and x[0] == -1:
                        os._exit(3)
                    out = pb_utils.Tensor("OUTPUT0", x + 1)
                else:
                    import cupy as cp
                    out = pb_utils.Tensor.from_dlpack("OUTPUT0", cp.from_dlpack(t) + 1)
                responses.append(pb_utils.InferenceResponse(
                    [out, pb_utils.Tensor("ON_GPU", np.array([not t.is_cpu()], np.bool_))] + report()))
            return responses
''')

PROBE_CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 0
input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }}]
output [
  {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }},
  {{ name: "ON_GPU", data_type: TYPE_BOOL, dims: [ 1 ] }},
  {{ name: "COPIED", data_type: TYPE_INT64, dims: [ 3 ] }},
  {{ name: "LIVE", data_type: TYPE_INT64, dims: [ 1 ] }}
]
instance_group [{{ kind: {kind}, count: 1{gpus} }}]
{extra}
'''

GPU_INPUTS = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "no" } }'

# gpu_source: OUTPUT0 = INPUT0 * 2 computed on the GPU (host input, GPU output).
GPU_SOURCE = textwrap.dedent('''
    import cupy as cp
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = cp.asarray(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack("OUTPUT0", x * 2)]))
            return responses
''')

GPU_SOURCE_CONFIG = '''
name: "gpu_source"
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
instance_group [{ kind: KIND_GPU, count: 1, gpus: [0] }]
'''

# bls_caller: sends a GPU copy of INPUT0 to `probe` by BLS. MODE picks preferred_memory (0 none,
# 1 CPU, 2 GPU) or what to do with what came back: 3 keep it, 4 drop the oldest kept one, 5 exit,
# 6 check the oldest kept one is still INPUT0 + 1. OK: the output was INPUT0 + 1 (checked where it
# is, no copy to the host for it); ON_GPU: it came back as a GPU tensor; CALLEE_ON_GPU: probe got
# its input on the GPU; COPIED: this process's counters.
BLS_CALLER = textwrap.dedent('''
    import os
    import numpy as np
    import cupy as cp
    import triton_python_backend_utils as pb_utils
    from kernel.backends.python import gpu_worker

    def same(out, x):
        if out.is_cpu():
            return bool(np.array_equal(out.as_numpy(), x + 1))
        return bool(cp.all(cp.from_dlpack(out) == cp.asarray(x) + 1))

    class TritonPythonModel:
        def initialize(self, args):
            self.kept = []

        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
                if mode == 5:
                    os._exit(4)
                ok, on_gpu, callee_gpu = True, False, False
                if mode == 4:
                    self.kept.pop(0)
                elif mode == 6:
                    ok = same(self.kept[0][0], self.kept[0][1])
                else:
                    memory = {0: None, 1: pb_utils.TRITONSERVER_MEMORY_CPU, 2: pb_utils.TRITONSERVER_MEMORY_GPU,
                              3: None}[mode]
                    kwargs = {} if memory is None else {"preferred_memory": pb_utils.PreferredMemory(memory, 0)}
                    bls = pb_utils.InferenceRequest(
                        model_name="probe", requested_output_names=["OUTPUT0", "ON_GPU"],
                        inputs=[pb_utils.Tensor.from_dlpack("INPUT0", cp.asarray(x))], **kwargs)
                    reply = bls.exec()
                    if reply.has_error():
                        raise pb_utils.TritonModelException(reply.error().message())
                    out = pb_utils.get_output_tensor_by_name(reply, "OUTPUT0")
                    ok, on_gpu = same(out, x), not out.is_cpu()
                    flag = pb_utils.get_output_tensor_by_name(reply, "ON_GPU")  # on the GPU too with preferred GPU
                    callee_gpu = bool(flag.as_numpy()[0] if flag.is_cpu() else cp.from_dlpack(flag)[0])
                    if mode == 3:
                        self.kept.append((out, x))
                    del out, reply, flag
                copied = gpu_worker.COPIED
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OK", np.array([ok], np.bool_)),
                    pb_utils.Tensor("ON_GPU", np.array([on_gpu], np.bool_)),
                    pb_utils.Tensor("CALLEE_ON_GPU", np.array([callee_gpu], np.bool_)),
                    pb_utils.Tensor("COPIED", np.array([copied["device_to_host"], copied["device_to_device"],
                                                       copied["host_to_device"]], np.int64))]))
            return responses
''')

BLS_CALLER_CONFIG = '''
name: "bls_caller"
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }, { name: "MODE", data_type: TYPE_INT32, dims: [ 1 ] }]
output [
  { name: "OK", data_type: TYPE_BOOL, dims: [ 1 ] },
  { name: "ON_GPU", data_type: TYPE_BOOL, dims: [ 1 ] },
  { name: "CALLEE_ON_GPU", data_type: TYPE_BOOL, dims: [ 1 ] },
  { name: "COPIED", data_type: TYPE_INT64, dims: [ 3 ] }
]
instance_group [{ kind: KIND_GPU, count: 1, gpus: [0] }]
'''

# host_bls: a model without CuPy asks for its BLS outputs on the GPU: they stay in host memory
# (one log line says why), and CuPy is never imported here (HAS_CUPY).
HOST_BLS = textwrap.dedent('''
    import sys
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                bls = pb_utils.InferenceRequest(
                    model_name="probe", requested_output_names=["OUTPUT0"],
                    inputs=[pb_utils.Tensor("INPUT0", x)],
                    preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0))
                reply = bls.exec()
                if reply.has_error():
                    raise pb_utils.TritonModelException(reply.error().message())
                out = pb_utils.get_output_tensor_by_name(reply, "OUTPUT0")
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUTPUT0", out.as_numpy() if out.is_cpu() else np.zeros_like(x)),
                    pb_utils.Tensor("ON_GPU", np.array([not out.is_cpu()], np.bool_)),
                    pb_utils.Tensor("HAS_CUPY", np.array(["cupy" in sys.modules], np.bool_))]))
            return responses
''')

HOST_BLS_CONFIG = '''
name: "host_bls"
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
output [
  { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "ON_GPU", data_type: TYPE_BOOL, dims: [ 1 ] },
  { name: "HAS_CUPY", data_type: TYPE_BOOL, dims: [ 1 ] }
]
instance_group [{ kind: KIND_CPU, count: 1 }]
'''

# gpu_chain: an ensemble gpu_source -> probe: the intermediate tensor stays on the GPU.
GPU_CHAIN_CONFIG = '''
name: "gpu_chain"
platform: "ensemble"
max_batch_size: 0
input [{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] }, { name: "STEP2_ON_GPU", data_type: TYPE_BOOL, dims: [ 1 ] }]
ensemble_scheduling {
  step [
    { model_name: "gpu_source" model_version: -1 input_map { key: "INPUT0" value: "IN" }
      output_map { key: "OUTPUT0" value: "doubled" } },
    { model_name: "probe" model_version: -1 input_map { key: "INPUT0" value: "doubled" }
      output_map { key: "OUTPUT0" value: "OUT" } output_map { key: "ON_GPU" value: "STEP2_ON_GPU" } }
  ]
}
'''


def probe_config(name: str, kind: str, extra: str) -> str:
    return PROBE_CONFIG.format(name=name, kind=kind, extra=extra, gpus=", gpus: [0]" if kind == "KIND_GPU" else "")


def write(repo: Path, name: str, code: str | None, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    if code is not None:
        (repo / name / "1" / "model.py").write_text(code)
    (repo / name / "config.pbtxt").write_text(config)


def gpu_repository(repo: Path) -> Path:
    """Every model above, for a server that has GPUs (real, or the stand-in's)."""
    write(repo, "probe", PROBE, probe_config("probe", "KIND_GPU", GPU_INPUTS))
    write(repo, "probe_cpu_inputs", PROBE, probe_config("probe_cpu_inputs", "KIND_GPU", ""))
    write(repo, "gpu_source", GPU_SOURCE, GPU_SOURCE_CONFIG)
    write(repo, "bls_caller", BLS_CALLER, BLS_CALLER_CONFIG)
    write(repo, "host_bls", HOST_BLS, HOST_BLS_CONFIG)
    write(repo, "gpu_chain", None, GPU_CHAIN_CONFIG)
    return repo

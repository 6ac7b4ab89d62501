"""KIND_GPU / KIND_AUTO instance groups, checked on a machine without a GPU.

GPU discovery (kernel.core.gpu) takes a fixed device list from KERNEL_GPU_IDS, so a real
`kernel serve` here believes it has GPUs 0 and 1: the fan-out to one worker per (count, GPU), the
kind and device id each worker's initialize(args) gets, and KIND_AUTO's choice are then what they
would be on a two-GPU machine. The workers never touch a GPU (the model only records its args).
Without the override, this machine has no GPU, and a KIND_GPU model is refused in tritonserver
2.51's words (measured on the real server, CPU box: see the messages below).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import EXAMPLES
from kernel.config import pbtxt as config_pbtxt
from kernel.core import gpu
from kernel.core.errors import KernelError

RECORDER = textwrap.dedent('''
    import json, os
    from pathlib import Path
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            record = {k: v for k, v in args.items() if k != "model_config"}
            out = Path(args["model_repository"]) / f"init_{os.getpid()}.json"
            out.write_text(json.dumps(record))

        def execute(self, requests):
            out = np.array([1], np.int32)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]) for _ in requests]
''')


def model(repo: Path, name: str, instance_group: str) -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(RECORDER)
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [{ name: "IN", data_type: TYPE_INT32, dims: [1] }]\n'
        'output [{ name: "OUT", data_type: TYPE_INT32, dims: [1] }]\n'
        f"{instance_group}\n"
    )
    return folder


def inits(folder: Path) -> list[tuple[str, str, str]]:
    """(instance name, kind, device id) of every worker that initialized, sorted."""
    found = [json.loads(p.read_text()) for p in folder.glob("init_*.json")]
    return sorted((r["model_instance_name"], r["model_instance_kind"], r["model_instance_device_id"]) for r in found)


def config_of(server, name: str) -> dict:
    c = httpclient.InferenceServerClient(server.url)
    try:
        return c.get_model_config(name)
    finally:
        c.close()


@pytest.fixture(scope="module")
def two_gpu_repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("gpu_repo")
    model(repo, "gpu_fan", "instance_group [{ kind: KIND_GPU, count: 2, gpus: [0, 1] }]")
    model(repo, "gpu_one", "instance_group [{ kind: KIND_GPU, gpus: [1] }]")
    model(repo, "gpu_all", "instance_group [{ kind: KIND_GPU }]")
    model(repo, "auto", "instance_group [{ kind: KIND_AUTO }]")
    model(repo, "default_group", "")
    model(repo, "cpu", "instance_group [{ kind: KIND_CPU, count: 2 }]")
    model(repo, "bad_id", "instance_group [{ kind: KIND_GPU, gpus: [3] }]")
    return repo


def test_instances_on_two_fake_gpus(start_kernel, two_gpu_repo):
    k = start_kernel([two_gpu_repo], "--exit-on-error=false", "--strict-readiness=false", env={gpu.OVERRIDE_ENV: "0,1"}).wait_ready()
    assert inits(two_gpu_repo / "gpu_fan") == [
        ("gpu_fan_0_0", "GPU", "0"), ("gpu_fan_0_0", "GPU", "1"),
        ("gpu_fan_0_1", "GPU", "0"), ("gpu_fan_0_1", "GPU", "1"),
    ]
    assert inits(two_gpu_repo / "gpu_one") == [("gpu_one_0_0", "GPU", "1")]
    assert inits(two_gpu_repo / "gpu_all") == [("gpu_all_0_0", "GPU", "0"), ("gpu_all_0_0", "GPU", "1")]
    # KIND_AUTO and no instance_group at all pick the GPUs when there are some, as Triton does
    assert inits(two_gpu_repo / "auto") == [("auto_0_0", "GPU", "0"), ("auto_0_0", "GPU", "1")]
    assert inits(two_gpu_repo / "default_group") == [
        ("default_group_0", "GPU", "0"), ("default_group_0", "GPU", "1")]
    assert inits(two_gpu_repo / "cpu") == [("cpu_0_0", "CPU", "0"), ("cpu_0_1", "CPU", "0")]
    group = config_of(k, "auto")["instance_group"][0]
    assert (group["kind"], group["gpus"], group["count"]) == ("KIND_GPU", [0, 1], 1)
    assert config_of(k, "gpu_all")["instance_group"][0]["gpus"] == [0, 1]
    assert inits(two_gpu_repo / "bad_id") == []
    assert ("instance group bad_id_0 of model bad_id "
            "specifies invalid or unsupported gpu id 3. GPUs with at least the minimum required CUDA compute "
            "compatibility of 6.000000 are: 0, 1") in k.log()


BLS_GPU_PREFERRED = textwrap.dedent('''
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().astype(np.float32)
                bls = pb_utils.InferenceRequest(
                    model_name="add_sub", requested_output_names=["OUTPUT0"],
                    inputs=[pb_utils.Tensor("INPUT0", np.repeat(x, 4)), pb_utils.Tensor("INPUT1", np.ones(4, np.float32))],
                    preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0))
                reply = bls.exec()
                if reply.has_error():
                    raise pb_utils.TritonModelException(reply.error().message())
                out = pb_utils.get_output_tensor_by_name(reply, "OUTPUT0")
                value = np.array([int(out.as_numpy()[0]) * 10 + int(out.is_cpu())], np.int32)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
            return responses
''')


def test_no_gpu_refuses_kind_gpu_in_tritons_words(start_kernel, tmp_path):
    for name, group in [("gpu", "instance_group [{ kind: KIND_GPU, count: 1 }]"),
                        ("gpu_ids", "instance_group [{ kind: KIND_GPU, count: 2, gpus: [0, 1] }]"),
                        ("auto_ids", "instance_group [{ kind: KIND_AUTO, count: 1, gpus: [0] }]"),
                        ("auto", "instance_group [{ kind: KIND_AUTO, count: 1 }]")]:
        model(tmp_path, name, group)
    for value in ("maybe", "no"):
        model(tmp_path, f"force_{value}",
              f'parameters {{ key: "FORCE_CPU_ONLY_INPUT_TENSORS" value {{ string_value: "{value}" }} }}')
    bls = model(tmp_path, "bls_gpu_preferred", "")
    (bls / "1" / "model.py").write_text(BLS_GPU_PREFERRED)
    names = ["gpu", "gpu_ids", "auto_ids", "auto", "force_maybe", "force_no", "bls_gpu_preferred", "add_sub"]
    k = start_kernel([tmp_path, EXAMPLES], "--exit-on-error=false", "--strict-readiness=false",
                     "--model-control-mode=explicit", *(f"--load-model={n}" for n in names),
                     env={gpu.OVERRIDE_ENV: ""}).wait_ready()
    log = k.log()
    # FORCE_CPU_ONLY_INPUT_TENSORS, as tritonserver 2.51 reads it
    assert "Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: maybe'" in log
    assert "Input tensors can be both in CPU and GPU. FORCE_CPU_ONLY_INPUT_TENSORS is off." in log
    assert inits(tmp_path / "force_no") == [("force_no_0", "CPU", "0")]
    # BLS with preferred_memory GPU on a machine without one: served, outputs on the CPU
    c = httpclient.InferenceServerClient(k.url)
    x = httpclient.InferInput("IN", [1], "INT32")
    x.set_data_from_numpy(np.array([4], np.int32))
    assert c.infer("bls_gpu_preferred", [x]).as_numpy("OUT").tolist() == [51]  # (4 + 1) * 10 + is_cpu
    c.close()
    # tritonserver 2.51 on this box says these, after "failed to load '<model>' version 1: Invalid argument: "
    for line in [
        "instance group gpu_0 of model gpu has kind KIND_GPU but no GPUs are available",
        "instance group gpu_ids_0 of model gpu_ids specifies invalid or unsupported gpu id 0. GPUs with at least "
        "the minimum required CUDA compute compatibility of 6.000000 are: ",
        "instance group auto_ids_0 of model auto_ids has kind KIND_CPU but specifies one or more GPUs",
    ]:
        assert line in log
    assert inits(tmp_path / "auto") == [("auto_0_0", "CPU", "0")]
    assert config_of(k, "auto")["instance_group"][0]["kind"] == "KIND_CPU"


# ---- discovery -----------------------------------------------------------------------------------


def test_override_and_probe(monkeypatch):
    monkeypatch.setenv(gpu.OVERRIDE_ENV, " 1, 0 ,1")
    assert gpu.visible_gpu_ids() == (1, 0)
    monkeypatch.setenv(gpu.OVERRIDE_ENV, "")
    assert gpu.visible_gpu_ids() == ()
    assert gpu.visible_gpu_ids(probe=lambda: [0, 2]) == (0, 2)
    with pytest.raises(ValueError):
        gpu.parse_id_list("0,-1")


def test_cuda_visible_devices_limits_nvml_count(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert gpu._apply_visible_devices(4) == (0, 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,7,0")  # CUDA stops at the first device that does not exist
    assert gpu._apply_visible_devices(4) == (0,)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu._apply_visible_devices(4) == ()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpu._apply_visible_devices(2) == (0, 1)


def test_no_gpu_library_imported_on_a_cpu_box(monkeypatch):
    """Discovery on a machine without a driver only stats files: it imports neither NVML nor CuPy."""
    import subprocess
    import sys

    code = ("import sys, kernel.core.gpu as g, kernel.core.shared_memory, kernel.observe.metrics;"
            "g._driver_present = lambda: False; print(g.visible_gpu_ids());"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'pynvml', 'torch')))")
    env = {k: v for k, v in __import__("os").environ.items() if k != gpu.OVERRIDE_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split("\n")[:2] == ["()", "[]"]


# ---- the config rules, directly --------------------------------------------------------------------


@pytest.mark.parametrize("group,gpus,kind,ids", [
    ("{ kind: KIND_AUTO }", (0, 1), "KIND_GPU", [0, 1]),
    ("{ kind: KIND_AUTO }", (), "KIND_CPU", []),
    ("{ kind: KIND_AUTO, gpus: [1] }", (0, 1), "KIND_GPU", [1]),
    ("{ kind: KIND_AUTO, gpus: [2] }", (0, 1), "KIND_CPU", [2]),  # then refused: KIND_CPU with GPUs
    ("{ kind: KIND_GPU }", (0, 1), "KIND_GPU", [0, 1]),
])
def test_kind_auto_and_gpu_completion(group, gpus, kind, ids):
    from google.protobuf import text_format

    from kernel.protos import model_config_pb2 as mc

    cfg = mc.ModelConfig()
    text_format.Parse(f'name: "m" backend: "python" instance_group [{group}]', cfg)
    config_pbtxt.normalize_config(cfg, "m", gpus=gpus)
    g = cfg.instance_group[0]
    assert (mc.ModelInstanceGroup.Kind.Name(g.kind), list(g.gpus)) == (kind, ids)
    if kind == "KIND_CPU" and ids:
        with pytest.raises(KernelError, match="has kind KIND_CPU but specifies one or more GPUs"):
            config_pbtxt.validate_config(cfg, gpus=gpus, check_io=False)

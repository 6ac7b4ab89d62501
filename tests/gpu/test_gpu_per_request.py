"""CUDA shared memory as every client registers it, and what a request costs in CUDA calls (issue 34).

Against a real `kernel serve` on the CuPy stand-in (fake_gpu.py), whose log names every IPC open and
close and every copy with the process that made it and the size of the allocation, so a test can
count per process what a run of requests cost. On a real GPU opening a handle
(cudaIpcOpenMemHandle) costs hundreds of microseconds and copying a small tensor a few: perf_analyzer
over gRPC spent 513 us of 742 us per add_sub request "computing inputs" from CUDA shared memory,
because the model's worker opened and closed the client's handle for every request. A handle is
opened once per registration in each process, as tritonserver opens it once.
"""

from __future__ import annotations

import base64
import http.client
import json
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import KernelProcess, running
from fake_gpu import N, CopyLog, fake, fake_env, gpu, infer, until  # noqa: F401 - fake, gpu: fixtures
from gpu_models import (BLS_CALLER, BLS_CALLER_CONFIG, GPU_INPUTS, HOST_BLS, HOST_BLS_CONFIG, PROBE, probe_config,
                        write)

REQUESTS = 20
BLOCK = 64 << 20  # a worker's permanent device block (gpu_worker.BLOCK_BYTES), as the front maps it
HANDLE_ERROR = "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"


def libb64_text(raw: bytes) -> str:
    """base64 as the C++ clients write it (perf_analyzer, the C++ tritonclient: libb64's encoder):
    a line break after every 72 characters and one at the end."""
    text = base64.b64encode(raw).decode()
    return "".join(text[i:i + 72] + "\n" for i in range(0, len(text), 72))


def post(server, path: str, body: bytes):
    conn = http.client.HTTPConnection("localhost", server.http_port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, (json.loads(data) if data else None)
    finally:
        conn.close()


def register_as_cpp_client(server, name: str, b64: str, byte_size: int):
    """The register request the C++ client library builds: compact JSON, the handle as libb64 wrote it."""
    body = json.dumps({"raw_handle": {"b64": b64}, "device_id": 0, "byte_size": byte_size}, separators=(",", ":"))
    return post(server, f"/v2/cudasharedmemory/region/{name}/register", body.encode())


def live(server) -> bool:
    conn = http.client.HTTPConnection("localhost", server.http_port, timeout=10)
    try:
        conn.request("GET", "/v2/health/live")
        return conn.getresponse().status == 200
    finally:
        conn.close()


class Region:
    """A client's device allocation of `size` bytes holding `x`, and its IPC handle."""

    def __init__(self, fake, x: np.ndarray, size: int):
        self.fake, self.x, self.size = fake, x, size
        self.memory = fake.cuda.Memory(size)
        fake.runtime.memcpy(self.memory.ptr, x.ctypes.data, x.nbytes, 1)
        self.handle = bytes(fake.runtime.ipcGetMemHandle(self.memory.ptr))

    def read(self, dtype, count: int) -> np.ndarray:
        out = np.empty(count, dtype)
        self.fake.runtime.memcpy(out.ctypes.data, self.memory.ptr, out.nbytes, 2)
        return out


def shm_infer(server, model: str, region_in: str, nbytes: int, n: int, protocol="http", out_region=None):
    lib = httpclient if protocol == "http" else grpcclient
    c = lib.InferenceServerClient(server.url if protocol == "http" else server.grpc_url)
    try:
        t = lib.InferInput("INPUT0", [n], "FP32")
        t.set_shared_memory(region_in, nbytes)
        outputs = None
        if out_region is not None:
            o = lib.InferRequestedOutput("OUTPUT0")
            o.set_shared_memory(out_region, nbytes)
            outputs = [o, lib.InferRequestedOutput("ON_GPU")]
        return c.infer(model, [t], outputs=outputs)
    finally:
        c.close()


def unregister_all(server) -> None:
    c = httpclient.InferenceServerClient(server.url)
    c.unregister_cuda_shared_memory()
    c.close()


# ---- registration as the C++ clients send it (perf_analyzer -i http --shared-memory cuda) -------------


def test_http_register_takes_the_line_broken_base64_of_cpp_clients(gpu, fake):
    x = np.arange(16, dtype=np.float32)
    region = Region(fake, x, 4096)
    text = libb64_text(region.handle)
    assert text.count("\n") == 2 and len(text.split("\n")[0]) == 72
    try:
        assert register_as_cpp_client(gpu, "cpp_in", text, region.size) == (200, None)
        status = httpclient.InferenceServerClient(gpu.url).get_cuda_shared_memory_status("cpp_in")
        assert status == [{"name": "cpp_in", "device_id": 0, "byte_size": 4096}]
        result = shm_infer(gpu, "probe_cpu_inputs", "cpp_in", x.nbytes, x.size)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + 1)
    finally:
        unregister_all(gpu)


def _variants(text: str) -> dict[str, tuple[str, bool]]:
    """Spellings of one handle, and whether tritonserver 2.51 decodes each to 64 bytes (checked against
    it: libb64's decoder skips every character outside the base64 alphabet and keeps whole bytes)."""
    one_line = text.replace("\n", "")
    return {
        "one line": (one_line, True),
        "CRLF line ends": (text.replace("\n", "\r\n"), True),
        "no padding": (one_line.rstrip("="), True),
        "spaces between groups": (" ".join(one_line[i:i + 4] for i in range(0, len(one_line), 4)), True),
        "85 characters (63 bytes)": (one_line[:85], False),
        "87 characters (65 bytes)": (one_line.rstrip("=") + "A", False),
        "url-safe alphabet": (one_line.replace("+", "-").replace("/", "_") if ("+" in one_line or "/" in one_line)
                              else one_line[:85] + "-", False),
        "empty": ("", False),
    }


@pytest.mark.parametrize("variant", list(_variants(libb64_text(b"\0" * 64))))
def test_http_register_decodes_the_handle_as_tritonserver_does(gpu, fake, variant):
    region = Region(fake, np.zeros(4, np.float32), 1024)
    b64, accepted = _variants(libb64_text(region.handle))[variant]
    try:
        code, reply = register_as_cpp_client(gpu, "variant", b64, region.size)
        if accepted:
            assert (code, reply) == (200, None)
        else:
            assert (code, reply) == (400, {"error": HANDLE_ERROR})
        assert live(gpu)
    finally:
        unregister_all(gpu)


# ---- per request: copies, never opens ---------------------------------------------------------------


def test_a_small_cuda_input_to_a_cpu_model_is_one_copy_per_request_and_no_open(gpu, fake):
    """add_sub over perf_analyzer --shared-memory cuda: 16-byte inputs to a model taking CPU inputs.
    The front copies them out of the mapping it made at registration, as it reads system regions."""
    x = np.arange(4, dtype=np.float32)
    region = Region(fake, x, 2048)
    gpu.copies.mark()
    try:
        grpcclient.InferenceServerClient(gpu.grpc_url).register_cuda_shared_memory(
            "small", base64.b64encode(region.handle), 0, region.size)
        for i in range(REQUESTS):
            result = shm_infer(gpu, "probe_cpu_inputs", "small", x.nbytes, x.size, ("http", "grpc")[i % 2])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + 1)
        opened = gpu.copies.pids("ipc_open", region.size)
        assert opened and all(gpu.copies.count("ipc_open", region.size, pid) == 1 for pid in opened), \
            gpu.copies.events()  # at registration, in each front process; in no worker
        assert gpu.copies.count("d2h", x.nbytes) == REQUESTS  # one copy each, of the 16 bytes
    finally:
        unregister_all(gpu)
    assert until(lambda: gpu.copies.count("ipc_close", region.size) == len(opened)), gpu.copies.events()


@pytest.mark.parametrize("model", ["probe_cpu_inputs", "probe"])
def test_a_cuda_input_a_worker_opens_is_opened_once_per_registration(gpu, fake, model):
    """Inputs the model's worker reads itself (above the inline limit; or a model taking GPU inputs):
    the worker keeps its mapping of the client's handle from one request to the next, and closes it
    once the region is unregistered."""
    x = np.arange(N, dtype=np.float32)
    region = Region(fake, x, x.nbytes + 512)
    out = Region(fake, np.zeros(1, np.float32), x.nbytes + 1024)
    gpu.copies.mark()
    try:
        c = httpclient.InferenceServerClient(gpu.url)
        c.register_cuda_shared_memory("big", base64.b64encode(region.handle), 0, region.size)
        c.register_cuda_shared_memory("big_out", base64.b64encode(out.handle), 0, out.size)
        c.close()
        for i in range(REQUESTS):
            result = shm_infer(gpu, model, "big", x.nbytes, x.size, ("http", "grpc")[i % 2], out_region="big_out")
            assert bool(result.as_numpy("ON_GPU")[0]) == (model == "probe")
            np.testing.assert_array_equal(out.read(np.float32, x.size), x + 1)
        events = gpu.copies.events()
        opened = gpu.copies.pids("ipc_open", region.size)
        assert len(opened) >= 2, events  # the front(s) at registration, and the worker
        for pid in opened:
            assert gpu.copies.count("ipc_open", region.size, pid) == 1, (pid, events)
        # a GPU output goes device to device into the client's region: the front maps the worker's
        # permanent block once (it stays while that worker runs), not per response
        assert all(gpu.copies.count("ipc_open", BLOCK, pid) <= 1 for pid in gpu.copies.pids("ipc_open", BLOCK)), events
    finally:
        unregister_all(gpu)
    # unregistered: the front's mappings close, and the worker, told so, closes the one it kept
    assert until(lambda: gpu.copies.count("ipc_close", region.size) == len(opened)), gpu.copies.events()


def test_a_worker_that_exits_lets_the_front_close_its_block(gpu, fake):
    """The front's mapping of a worker's permanent block is kept while that worker runs, and closed
    when it exits (the memory is gone; its successor has a block of its own)."""
    x = np.arange(N, dtype=np.float32)
    region = Region(fake, x, x.nbytes)
    out = Region(fake, np.zeros(1, np.float32), x.nbytes + 2048)
    c = httpclient.InferenceServerClient(gpu.url)
    try:
        c.register_cuda_shared_memory("in", base64.b64encode(region.handle), 0, region.size)
        c.register_cuda_shared_memory("out", base64.b64encode(out.handle), 0, out.size)
        shm_infer(gpu, "probe", "in", x.nbytes, x.size, out_region="out")  # the front maps probe's block
        gpu.copies.mark()
        with pytest.raises(Exception):
            infer(gpu, "probe", {"INPUT0": np.array([-1], np.float32)})  # probe's worker exits
        assert until(lambda: gpu.copies.count("ipc_close", BLOCK) >= 1), gpu.copies.events()
        assert until(lambda: _ready(c, "probe"), 30)
        shm_infer(gpu, "probe", "in", x.nbytes, x.size, out_region="out")  # the new worker's block, mapped anew
        np.testing.assert_array_equal(out.read(np.float32, x.size), x + 1)
    finally:
        c.unregister_cuda_shared_memory()
        c.close()


def _ready(client, model) -> bool:
    try:
        return client.is_model_ready(model)
    except Exception:  # noqa: BLE001
        return False


# ---- CUDA set up at load: a KIND_GPU instance is ready for GPU tensors once loaded -------------------

CONTEXT_S = 3.0  # the stand-in's CUDA set-up, per process (on an H200 a first BLS call took 411 ms)


@pytest.fixture(scope="module")
def slow_cuda(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slow_cuda")
    repo = tmp / "models"
    write(repo, "probe", PROBE, probe_config("probe", "KIND_GPU", GPU_INPUTS))
    write(repo, "bls_caller", BLS_CALLER, BLS_CALLER_CONFIG)
    write(repo, "host_bls", HOST_BLS, HOST_BLS_CONFIG)  # KIND_CPU: nothing at load (CuPy once it asks for GPU outputs)
    server = KernelProcess([repo], env=fake_env(tmp, FAKE_CUPY_CONTEXT_S=str(CONTEXT_S)))
    server.copies = CopyLog(tmp / "copies.log")
    yield from running(server)


def test_a_kind_gpu_instance_sets_cuda_up_while_it_loads(slow_cuda):
    copies = slow_cuda.copies
    # loaded: each KIND_GPU worker made its context and its first device block; the KIND_CPU one nothing
    assert copies.count("context") == 2, copies.events()
    workers = copies.pids("context")
    assert all(copies.count("malloc", BLOCK, pid) == 1 for pid in workers), copies.events()
    copies.mark()
    started = time.monotonic()
    result = infer(slow_cuda, "bls_caller", {"INPUT0": np.arange(N, dtype=np.float32),
                                              "MODE": np.array([0], np.int32)})
    took = time.monotonic() - started
    assert result.as_numpy("OK")[0] and result.as_numpy("ON_GPU")[0] and result.as_numpy("CALLEE_ON_GPU")[0]
    assert copies.count("context") == 0 and copies.count("malloc", BLOCK) == 0, copies.events()
    assert took < CONTEXT_S - 0.5, f"the first BLS call with a GPU tensor took {took:.2f} s"

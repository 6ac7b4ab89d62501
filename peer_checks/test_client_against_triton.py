"""kernel.client against real NVIDIA Triton: the clients work with any KServe v2 server.

A peer check, not part of `make test`: it needs real Triton, which `make peer-check` installs
with benchmarks/peers.py (into benchmarks/.peers, or KERNEL_PEERS_DIR) before running this folder.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import EXAMPLES, TEST_MODELS, free_ports  # noqa: E402 - peer_checks/conftest.py re-exports tests/conftest's
import peers  # noqa: E402 - where real Triton is (benchmarks/peers.py)
from kernel.client import AsyncioModelClient, DecoupledModelClient, FuturesModelClient, ModelClient  # noqa: E402
from kernel.client.exceptions import PyTritonClientInferenceServerError, PyTritonClientModelUnavailableError

A = np.array([1.0, 2.0, 3.0, 4.0], np.float32)


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    repo = tmp_path_factory.mktemp("pytclient-triton-repo")
    for model in (EXAMPLES / "add_sub", EXAMPLES / "string_identity", TEST_MODELS / "good" / "repeat_int32",
                  TEST_MODELS / "good" / "raises"):
        shutil.copytree(model, repo / model.name)
    http, grpc, metrics = free_ports(3)
    env = peers.triton_env()
    home = Path(env["TRITON_HOME"])
    cmd = [str(home / "bin" / "tritonserver"), f"--model-repository={repo}", f"--backend-directory={home / 'backends'}",
           f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}"]
    log = repo.parent / "triton.log"
    # cwd outside the checkout: Kernel's own triton_python_backend_utils would shadow Triton's
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=repo.parent, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")
            try:
                with urllib.request.urlopen(f"http://localhost:{http}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.2)
        yield {"http": f"http://localhost:{http}", "grpc": f"grpc://localhost:{grpc}"}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_model_client_against_triton(triton, scheme):
    url = triton[scheme]
    with ModelClient(url, "add_sub", lazy_init=False) as client:
        result = client.infer_sample(A, A)
        np.testing.assert_array_equal(result["OUTPUT0"], A * 2)
        assert client.model_config.inputs[0].name == "INPUT0"
    with ModelClient(url, "string_identity") as client:
        assert client.infer_sample(np.array([b"a", b"b"], dtype=object))["OUTPUT0"].tolist() == [b"a", b"b"]
        assert client.infer_batch(np.array([[b"x"], [b"y"]], dtype=object))["OUTPUT0"].shape == (2, 1)
    with ModelClient(url, "raises") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="this model always fails"):
            client.infer_sample(A)
    with ModelClient(url, "no_such_model", init_timeout_s=0.5) as client:
        with pytest.raises(PyTritonClientModelUnavailableError):
            client.infer_sample(A)
    with FuturesModelClient(url, "add_sub") as client:
        np.testing.assert_array_equal(client.infer_sample(A, A).result(timeout=30)["OUTPUT1"], A * 0)


@pytest.mark.parametrize("scheme", ["http", "grpc"])
async def test_asyncio_client_against_triton(triton, scheme):
    async with AsyncioModelClient(triton[scheme], "add_sub") as client:
        np.testing.assert_array_equal((await client.infer_sample(A, A))["OUTPUT0"], A * 2)


def test_decoupled_client_against_triton(triton):
    with DecoupledModelClient(triton["grpc"], "repeat_int32") as client:
        got = [int(r["OUT"][0]) for r in client.infer_sample(np.array([3, 4, 5], np.int32))]
    assert got == [3, 4, 5]

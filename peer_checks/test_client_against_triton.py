"""kernel.client against real NVIDIA Triton: the clients work with any KServe v2 server.

A peer check, not part of `make test`: it needs real Triton, which `make peer-check` installs
with `anchors.sh install` (into ~/.cache/kernel-anchors) before running this folder.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import EXAMPLES, ROOT, TEST_MODELS, free_ports  # peer_checks/conftest.py re-exports tests/conftest's
from kernel.client import AsyncioModelClient, DecoupledModelClient, FuturesModelClient, ModelClient
from kernel.client.exceptions import PyTritonClientInferenceServerError, PyTritonClientModelUnavailableError

ANCHORS = Path.home() / ".cache" / "kernel-anchors"
ANCHORS_SH = ROOT.parent / "shared" / "bench" / "anchors.sh"


A = np.array([1.0, 2.0, 3.0, 4.0], np.float32)


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    repo = tmp_path_factory.mktemp("pytclient-triton-repo")
    for model in (EXAMPLES / "add_sub", EXAMPLES / "string_identity", TEST_MODELS / "good" / "repeat_int32",
                  TEST_MODELS / "good" / "raises"):
        shutil.copytree(model, repo / model.name)
    http, grpc, metrics = free_ports(3)
    # cwd outside the checkout: Kernel's own triton_python_backend_utils would shadow Triton's
    started = subprocess.run(
        [str(ANCHORS_SH), "triton", str(repo), str(http), str(grpc), str(metrics)],
        cwd="/tmp", capture_output=True, text=True, timeout=120,
        env={**os.environ, "TRITON_LOG": str(repo.parent / "triton.log")},
    )
    assert started.returncode == 0, started.stderr
    pid = int(started.stdout.split()[-1])
    try:
        yield {"http": f"http://localhost:{http}", "grpc": f"grpc://localhost:{grpc}"}
    finally:
        _stop(pid)


def _stop(pid: int) -> None:
    """Triton is not our child (anchors.sh starts it with nohup): signal it and poll until it is gone."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


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

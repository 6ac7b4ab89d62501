"""--grpc-infer-response-compression-level against real tritonserver 2.51, frame by frame.

A peer check, not part of `make test` (it needs real Triton: `make peer-check` installs it; or
ANCHORS_DIR=<a venv made by benchmarks/peers.py install>). For each level, tritonserver and each
of Kernel's gRPC servers answer the same raw calls (h2, so the headers and each message's
compressed flag are seen as sent): which algorithm each grpc-accept-encoding gets, whether a
message that compression would not shrink goes plainly, whether the other RPCs and errors name an
encoding, and whether the compressed bytes are zlib's at its default level. The observations must
be equal; what grpcio does otherwise is listed in differences.py with its reason.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import time
import urllib.request

import numpy as np
import pytest

from conftest import EXAMPLES, ROOT, TEST_MODELS, KernelProcess, free_ports
from differences import DIFFERENCES
from peers import triton_env

_spec = importlib.util.spec_from_file_location(
    "grpc_compression_frames", ROOT / "tests" / "transports" / "test_grpc_response_compression.py")
frames = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(frames)

FLAG = "--grpc-infer-response-compression-level"
ACCEPTS = [None, "identity", "gzip", "deflate", "gzip,deflate", "deflate,gzip", "identity, deflate, gzip",
           "snappy,gzip", "GZIP", "gzip;q=1", " gzip"]
GRPCIO_DIFFERENCE = "grpc-compression-grpcio-other-rpcs"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("compression_peer_repo")
    shutil.copytree(EXAMPLES / "add_sub", root / "add_sub")
    shutil.copytree(TEST_MODELS / "handover" / "identity", root / "identity")
    return root


def observe(port: int) -> dict:
    """What a server answers to the probing calls, as comparable values."""
    seen = {}
    for accept in ACCEPTS:
        headers, trailers, [(flag, body)] = frames.call(port, "ModelInfer", [frames.add_sub_request()], accept)
        encoding = headers.get("grpc-encoding")
        zlib6 = not flag or body == frames.zlib_default(encoding, frames.inflate(encoding, flag, body))
        seen[f"add_sub accept={accept!r}"] = (trailers.get("grpc-status"), encoding, flag, len(body), zlib6)
    for rpc, message in (("ModelMetadata", frames.pb.ModelMetadataRequest(name="identity")),
                         ("ModelConfig", frames.pb.ModelConfigRequest(name="identity")),
                         ("ServerLive", frames.pb.ServerLiveRequest())):
        headers, trailers, messages = frames.call(port, rpc, [message.SerializeToString()], "gzip")
        seen[f"other {rpc}"] = (trailers.get("grpc-status"), headers.get("grpc-encoding"), messages[0][0])
    missing = frames.pb.ModelInferRequest(model_name="nosuch").SerializeToString()
    headers, trailers, messages = frames.call(port, "ModelInfer", [missing], "gzip")
    seen["unknown model"] = ({**headers, **trailers}.get("grpc-status"), headers.get("grpc-encoding"), len(messages))
    payloads = {"tiny": np.zeros(1, np.float32), "zeros_1m": np.zeros(1 << 18, np.float32),
                "bits_64k": np.random.default_rng(7).integers(0, 2**32, 16384, dtype=np.uint32).view(np.float32)}
    for name, data in payloads.items():
        for rpc in ("ModelInfer", "ModelStreamInfer"):
            headers, trailers, messages = frames.call(port, rpc, [frames.identity_request(data)], "gzip")
            seen[f"{name} {rpc}"] = (trailers.get("grpc-status"), headers.get("grpc-encoding"),
                                     [(flag, len(body)) for flag, body in messages])
    requests = [frames.identity_request(np.full(n, 1, np.float32)) for n in (4, 1 << 18, 4)]
    headers, trailers, messages = frames.call(port, "ModelStreamInfer", requests, "deflate")
    seen["stream of three"] = (trailers.get("grpc-status"), headers.get("grpc-encoding"), [f for f, _ in messages])
    return seen


def triton_observes(repo, level: str, log_dir) -> dict:
    http, grpc, metrics = free_ports(3)
    env = triton_env()
    home = env["TRITON_HOME"]
    cmd = [f"{home}/bin/tritonserver", f"--model-repository={repo}", f"--backend-directory={home}/backends",
           f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}", f"{FLAG}={level}"]
    with open(log_dir / f"triton-{level}.log", "wb") as log:
        # cwd outside the checkout: Kernel's own triton_python_backend_utils would shadow Triton's
        proc = subprocess.Popen(cmd, cwd="/tmp", env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "tritonserver did not become ready"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.3)
        return observe(grpc)
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("level", ["none", "low", "medium", "high"])
def test_kernel_compresses_as_tritonserver(repo, level, tmp_path):
    expected = triton_observes(repo, level, tmp_path)
    for library in ("native", "grpclib", "grpcio"):
        k = KernelProcess([repo], "--grpc-server", library, FLAG, level).wait_ready()
        try:
            got = observe(k.grpc_port)
        finally:
            k.stop()
        differing = sorted(key for key in expected if got[key] != expected[key])
        if library == "grpcio" and level != "none":
            # C-core compresses the answers of every RPC there (grpcio_server.py)
            assert GRPCIO_DIFFERENCE in DIFFERENCES
            assert differing == ["other ModelConfig", "other ModelMetadata", "other ServerLive"], differing
            continue
        assert not differing, {key: (got[key], expected[key]) for key in differing}

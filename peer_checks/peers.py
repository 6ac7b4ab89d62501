"""The two peers of the differential check: real tritonserver 2.51 and `kernel serve`, on one repository.

Both are started with the same flags on the same model repository (built by
`build_repository`), each on its own ports, and each request of the table in
cases.py is sent to both. Real Triton is the one benchmarks/peers.py installs from
PyPI (`make peer-check` runs its `install` first; KERNEL_PEERS_DIR puts it
elsewhere); it is started outside the checkout so that Kernel's own
triton_python_backend_utils (at the checkout's root) cannot shadow the one Triton's
Python backend brings.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "model_repo_examples"
TEST_MODELS = ROOT / "tests" / "models"

# benchmarks/peers.py (under another name: this module is `peers` too): where real Triton is installed.
_spec = importlib.util.spec_from_file_location("triton_peers", ROOT / "benchmarks" / "peers.py")
triton_peers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(triton_peers)

# What the repository holds: good models the table infers on, and one model failing in each
# stage of its life (config parse, import, initialize, a missing model.py; `raises` fails in execute).
MODELS = {
    "add_sub": EXAMPLES / "add_sub",
    "string_identity": EXAMPLES / "string_identity",
    "repeat_int32": TEST_MODELS / "good" / "repeat_int32",
    "raises": TEST_MODELS / "good" / "raises",
    "init_fails": TEST_MODELS / "bad" / "init_fails",
    "syntax_error": TEST_MODELS / "bad" / "syntax_error",
    "broken_config": TEST_MODELS / "bad" / "broken_config",
    "missing_model_py": TEST_MODELS / "bad" / "missing_model_py",
    "wrong_count": TEST_MODELS / "good" / "wrong_count",
    "wrong_type": TEST_MODELS / "good" / "wrong_type",
    "error_response": TEST_MODELS / "good" / "error_response",
    "crasher": TEST_MODELS / "good" / "crasher",
    # issue 26: a batched model answering through response senders, async executes awaiting BLS,
    # self-checks a model runs on pb_utils and on its own metrics
    "batch_mix": TEST_MODELS / "model_process" / "batch_mix",
    "async_sleep": TEST_MODELS / "model_process" / "async_sleep",
    "async_bls_for": TEST_MODELS / "model_process" / "async_bls_for",
    "tensor_arg_order": TEST_MODELS / "model_process" / "tensor_arg_order",
    "metrics_self_check": TEST_MODELS / "model_process" / "metrics_self_check",
}
STARTUP_MODELS = ("add_sub", "string_identity", "repeat_int32", "raises")
# auto_complete_config raising: the one stage before initialize that model.py code runs in
AUTOCOMPLETE_FAILS = (
    "class TritonPythonModel:\n"
    "    @staticmethod\n"
    "    def auto_complete_config(auto_complete_model_config):\n"
    "        raise ValueError('auto-complete refused')\n"
    "\n"
    "    def execute(self, requests):\n"
    "        return []\n"
)
RESTRICTED_KEY, RESTRICTED_VALUE = "peer-admin", "s3cret"


def build_repository(base: Path) -> dict[str, Path]:
    """The model repository both peers serve, and the folders SageMaker loads from (MME urls)."""
    repo = base / "repo"
    repo.mkdir(parents=True)
    for name, source in MODELS.items():
        shutil.copytree(source, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        config = repo / name / "config.pbtxt"
        text = config.read_text()
        if name != "broken_config" and "name:" not in text:
            config.write_text(f'name: "{name}"\n' + text)
    folder = repo / "autocomplete_fails"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text('name: "autocomplete_fails"\nbackend: "python"\n')
    (folder / "1" / "model.py").write_text(AUTOCOMPLETE_FAILS)
    mme = base / "mme" / "store"
    mme.mkdir(parents=True)
    shutil.copytree(EXAMPLES / "add_sub", mme / "add_sub", ignore=shutil.ignore_patterns("__pycache__"))
    return {"repo": repo, "mme": mme}


@dataclass
class Ports:
    http: int
    grpc: int
    metrics: int
    sagemaker: int
    vertex: int


def common_flags(repo: Path, ports: Ports) -> list[str]:
    flags = [
        f"--model-repository={repo}", f"--http-port={ports.http}", f"--grpc-port={ports.grpc}",
        f"--metrics-port={ports.metrics}", "--model-control-mode=explicit",
        *(f"--load-model={m}" for m in STARTUP_MODELS),
        "--allow-http=true", "--allow-grpc=true",
        "--allow-sagemaker=true", f"--sagemaker-port={ports.sagemaker}",
        "--allow-vertex-ai=true", f"--vertex-ai-port={ports.vertex}", "--vertex-ai-default-model=add_sub",
        f"--http-restricted-api=trace:{RESTRICTED_KEY}={RESTRICTED_VALUE}",
        f"--grpc-restricted-protocol=trace:{RESTRICTED_KEY}={RESTRICTED_VALUE}",
    ]
    return flags


PEER_ENV = {
    "AIP_MODE": "PREDICTION", "AIP_PREDICT_ROUTE": "/predict", "AIP_HEALTH_ROUTE": "/health",
    "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub",
}


@dataclass
class Peer:
    name: str  # "triton" or "kernel"
    ports: Ports
    proc: subprocess.Popen
    log_path: Path
    host: str = "127.0.0.1"
    grpc_channel: object = field(default=None, repr=False)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def port_for(self, endpoint: str) -> int:
        return getattr(self.ports, endpoint)

    def stop(self) -> None:
        if self.grpc_channel is not None:
            self.grpc_channel.close()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def triton_env() -> dict[str, str]:
    """PATH, LD_LIBRARY_PATH and TRITON_HOME for real Triton (benchmarks/peers.py), over this environment."""
    if not triton_peers.installed():
        raise RuntimeError(f"real Triton is not installed in {triton_peers.DEFAULT_DIR}: "
                           "run `python benchmarks/peers.py install --triton-only` (make peer-check does)")
    return triton_peers.env()


def start_triton(repo: Path, ports: Ports, log_dir: Path) -> Peer:
    env = {**triton_env(), **PEER_ENV}
    home = Path(env["TRITON_HOME"])
    log_path = log_dir / "triton.log"
    cmd = [str(home / "bin" / "tritonserver"), f"--backend-directory={home / 'backends'}", *common_flags(repo, ports)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=log_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return _ready(Peer("triton", ports, proc, log_path))


def start_kernel(repo: Path, ports: Ports, log_dir: Path) -> Peer:
    env = {**os.environ, **PEER_ENV}
    log_path = log_dir / "kernel.log"
    # KERNEL_TEST_SERVE_ARGS="--front-processes 2": the same checks against several front processes.
    extra = os.environ.get("KERNEL_TEST_SERVE_ARGS", "").split()
    cmd = [sys.executable, "-m", "kernel", "serve", *common_flags(repo, ports), *extra]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=log_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return _ready(Peer("kernel", ports, proc, log_path))


def _ready(peer: Peer, timeout: float = 180.0) -> Peer:
    urls = [f"http://{peer.host}:{peer.ports.http}/v2/health/ready", f"http://{peer.host}:{peer.ports.vertex}/health",
            f"http://{peer.host}:{peer.ports.sagemaker}/ping"]
    deadline = time.monotonic() + timeout
    while urls and time.monotonic() < deadline:
        if peer.proc.poll() is not None:
            raise RuntimeError(f"{peer.name} exited with {peer.proc.returncode}:\n{peer.log()[-4000:]}")
        try:
            with urllib.request.urlopen(urls[0], timeout=2) as r:
                if r.status == 200:
                    urls.pop(0)
                    continue
        except OSError:
            pass
        time.sleep(0.2)
    if urls:
        peer.stop()
        raise RuntimeError(f"{peer.name}: {urls[0]} did not answer 200 in {timeout:.0f} s:\n{peer.log()[-4000:]}")
    return peer


# ---- sending ----------------------------------------------------------------------------------


@dataclass
class Answer:
    """What one peer answered: status (HTTP code or gRPC status name), body (JSON, text or bytes)."""

    status: object
    body: object
    content_type: str = ""

    def as_dict(self) -> dict:
        return {"status": self.status, "body": self.body}


def send_http(peer: Peer, endpoint: str, method: str, path: str, body: Optional[bytes], headers: dict,
              timeout: float = 60.0) -> Answer:
    conn = http.client.HTTPConnection(peer.host, peer.port_for(endpoint), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        content_type = r.getheader("content-type", "") or ""
    except (OSError, http.client.HTTPException) as exc:
        return Answer("connection-error", f"{type(exc).__name__}")
    finally:
        conn.close()
    return Answer(r.status, _decode(data), content_type)


def _decode(data: bytes) -> object:
    if not data:
        return ""
    try:
        return json.loads(data)
    except ValueError:
        pass
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def send_grpc(peer: Peer, rpc: str, request: dict, metadata: tuple = (), timeout: float = 60.0) -> Answer:
    import grpc
    from google.protobuf import json_format
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    if peer.grpc_channel is None:
        peer.grpc_channel = grpc.insecure_channel(f"{peer.host}:{peer.ports.grpc}")
    stub = service_pb2_grpc.GRPCInferenceServiceStub(peer.grpc_channel)
    request_type = {
        "ServerLive": "ServerLiveRequest", "ServerReady": "ServerReadyRequest", "ModelReady": "ModelReadyRequest",
        "ServerMetadata": "ServerMetadataRequest", "ModelMetadata": "ModelMetadataRequest",
        "ModelInfer": "ModelInferRequest", "ModelConfig": "ModelConfigRequest",
        "ModelStatistics": "ModelStatisticsRequest", "RepositoryIndex": "RepositoryIndexRequest",
        "RepositoryModelLoad": "RepositoryModelLoadRequest", "RepositoryModelUnload": "RepositoryModelUnloadRequest",
        "SystemSharedMemoryStatus": "SystemSharedMemoryStatusRequest",
        "SystemSharedMemoryRegister": "SystemSharedMemoryRegisterRequest",
        "SystemSharedMemoryUnregister": "SystemSharedMemoryUnregisterRequest",
        "CudaSharedMemoryStatus": "CudaSharedMemoryStatusRequest",
        "CudaSharedMemoryRegister": "CudaSharedMemoryRegisterRequest",
        "CudaSharedMemoryUnregister": "CudaSharedMemoryUnregisterRequest",
        "TraceSetting": "TraceSettingRequest", "LogSettings": "LogSettingsRequest",
    }[rpc]
    message = json_format.ParseDict(request, getattr(service_pb2, request_type)())
    try:
        response = getattr(stub, rpc)(message, timeout=timeout, metadata=metadata)
    except grpc.RpcError as exc:
        return Answer(exc.code().name, {"details": exc.details()})
    return Answer("OK", json_format.MessageToDict(response, preserving_proto_field_name=True))


def send_grpc_stream(peer: Peer, requests: list[dict], timeout: float = 60.0) -> Answer:
    """ModelStreamInfer: every streamed response (or its error_message), in order; what came
    within `timeout` seconds when the call runs out of time."""
    import grpc
    from google.protobuf import json_format
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    if peer.grpc_channel is None:
        peer.grpc_channel = grpc.insecure_channel(f"{peer.host}:{peer.ports.grpc}")
    stub = service_pb2_grpc.GRPCInferenceServiceStub(peer.grpc_channel)
    messages = [json_format.ParseDict(r, service_pb2.ModelInferRequest()) for r in requests]
    out = []
    try:
        for item in stub.ModelStreamInfer(iter(messages), timeout=timeout):
            if item.error_message:
                out.append({"error_message": item.error_message})
            else:
                out.append(json_format.MessageToDict(item.infer_response, preserving_proto_field_name=True))
    except grpc.RpcError as exc:
        if exc.code() is not grpc.StatusCode.DEADLINE_EXCEEDED:
            return Answer(exc.code().name, {"details": exc.details(), "responses": out})
    return Answer("OK", out)

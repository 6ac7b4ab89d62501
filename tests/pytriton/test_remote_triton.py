"""RemoteTriton (PyTriton's remote mode): callables in one process served by a Triton() server in
another, through the server's remote-binding socket.

The three-process scenario of PyTriton's simple_python_remote_mode example runs as real processes
(a server binding AddSub, two binders, the test as client), with nothing but ports in their
environment: a Triton() takes remote binds by default, as PyTriton's does. The finer behaviour is
checked with the server and a RemoteTriton in this process, which talk over the same socket.
Who may be at either end of that socket is tested in test_remote_socket.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, free_ports
from kernel.client import ModelClient
from kernel.client.exceptions import (
    PyTritonClientInferenceServerError,
    PyTritonClientModelUnavailableError,
    PyTritonClientTimeoutError,
)
from kernel.decorators import batch
from kernel.exceptions import PyTritonInvalidOperationError, PyTritonModelConfigError, PyTritonUnrecoverableError
from kernel.model_config import ModelConfig, Tensor
from kernel.proxy import remote as proto
from kernel.proxy import remote_socket as place
from kernel.triton import RemoteTriton, Triton, TritonConfig

VEC = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
OUT = [Tensor(name="y", dtype=np.float32, shape=(-1,))]
X = np.array([[1.0, 2.0]], np.float32)


_WORKSPACES: list = []  # the module's tmp folder, set by the autouse fixture below


@pytest.fixture(scope="module", autouse=True)
def _workspace_root(tmp_path_factory):
    _WORKSPACES.append(tmp_path_factory.mktemp("remote-ws"))
    yield
    _WORKSPACES.pop()


def workspace() -> Path:
    """A workspace path of its own under the module's tmp folder (Triton and RemoteTriton create it)."""
    return _WORKSPACES[-1] / f"ws-{time.monotonic_ns()}"


def socket_of(port: int) -> Path:
    """The socket a server of this user with HTTP or gRPC port `port` listens on."""
    found = place.candidate_sockets(port)
    assert found, f"no remote-binding socket for port {port}"
    return found[0]


def config(**extra) -> TritonConfig:
    http, grpc, metrics = free_ports(3)
    return TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics, **extra)


def ready_code(port: int, model: str) -> int:
    try:
        with urllib.request.urlopen(f"http://localhost:{port}/v2/models/{model}/ready", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0  # not listening (yet, or any more)


def wait_code(port: int, model: str, code: int, timeout: float = 30.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if ready_code(port, model) == code:
            return True
        time.sleep(0.1)
    return False


def infer(port: int, model: str, x: np.ndarray, name: str = "x"):
    with httpclient.InferenceServerClient(f"localhost:{port}") as c:
        t = httpclient.InferInput(name, list(x.shape), "FP32")
        t.set_data_from_numpy(x)
        return c.infer(model, [t])


# ---- three processes, as PyTriton's simple_python_remote_mode ------------------------------------

SERVER = '''
    import logging
    import numpy as np
    from kernel.decorators import batch
    from kernel.model_config import ModelConfig, Tensor
    from kernel.triton import Triton
    logging.basicConfig(level=logging.INFO)

    @batch
    def add_sub(**inputs):
        a, b = inputs.values()
        return {"add": a + b, "sub": a - b}

    with Triton() as triton:  # ports from PYTRITON_TRITON_CONFIG_*; remote binding is on by default
        triton.bind(model_name="AddSub", infer_func=add_sub,
                    inputs=[Tensor(dtype=np.float32, shape=(-1,)), Tensor(dtype=np.float32, shape=(-1,))],
                    outputs=[Tensor(name="add", dtype=np.float32, shape=(-1,)),
                             Tensor(name="sub", dtype=np.float32, shape=(-1,))],
                    config=ModelConfig(max_batch_size=128))
        triton.serve()
'''

BINDER = '''
    import logging, os, time
    import numpy as np
    from kernel.decorators import batch
    from kernel.model_config import ModelConfig, Tensor
    from kernel.triton import RemoteTriton
    logging.basicConfig(level=logging.INFO)

    @batch
    def compute(**inputs):
        a, b = inputs.values()
        if (a < 0).any():
            time.sleep(30)  # a request still running when the process dies
        return {"OUT": {OPERATION}, "PID": np.full((a.shape[0], 1), os.getpid(), np.int64)}

    with RemoteTriton(url="localhost:{PORT}") as remote_triton:
        remote_triton.bind(model_name="{MODEL}", infer_func=compute,
                           inputs=[Tensor(dtype=np.float32, shape=(-1,)), Tensor(dtype=np.float32, shape=(-1,))],
                           outputs=[Tensor(name="OUT", dtype=np.float32, shape=(-1,)),
                                    Tensor(name="PID", dtype=np.int64, shape=(1,))],
                           config=ModelConfig(max_batch_size=128))
        remote_triton.serve()
'''


def _start(script: Path, log: Path, env=None, base=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            env={**(os.environ if base is None else base), **(env or {})})


def _stop(proc: subprocess.Popen, sig=signal.SIGINT, timeout: float = 30.0) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def test_server_two_remote_binders_and_a_client(tmp_path):
    http, grpc, metrics = free_ports(3)
    env = {"PYTRITON_TRITON_CONFIG_HTTP_PORT": str(http), "PYTRITON_TRITON_CONFIG_GRPC_PORT": str(grpc),
           "PYTRITON_TRITON_CONFIG_METRICS_PORT": str(metrics), "PYTRITON_HOME": str(tmp_path / "home")}
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PYTRITON_TRITON_CONFIG_")}
    (tmp_path / "server.py").write_text(textwrap.dedent(SERVER))
    for model, operation in (("Mul", "np.multiply(a, b)"), ("Power", "np.power(a, b)")):
        text = textwrap.dedent(BINDER).replace("{OPERATION}", operation).replace("{MODEL}", model)
        (tmp_path / f"{model}.py").write_text(text.replace("{PORT}", str(http)))
    server = _start(tmp_path / "server.py", tmp_path / "server.log", env, environ)
    binders = {}
    try:
        assert wait_code(http, "AddSub", 200, 60), (tmp_path / "server.log").read_text()
        binders = {m: _start(tmp_path / f"{m}.py", tmp_path / f"{m}.log", {"PYTRITON_HOME": env["PYTRITON_HOME"]},
                             environ) for m in ("Mul", "Power")}
        for model in binders:
            assert wait_code(http, model, 200, 60), (tmp_path / f"{model}.log").read_text()
        a = np.array([[1.0], [2.0]], np.float32)
        b = np.array([[2.0], [3.0]], np.float32)
        with ModelClient(f"localhost:{http}", "AddSub", model_version="1") as c:
            assert c.infer_batch(a, b)["add"].tolist() == [[3.0], [5.0]]
        for model, expected in (("Mul", [[2.0], [6.0]]), ("Power", [[1.0], [8.0]])):
            with ModelClient(f"grpc://localhost:{grpc}", model) as c:
                result = c.infer_batch(a, b)
            assert result["OUT"].tolist() == expected
            assert set(result["PID"].ravel()) == {binders[model].pid}  # ran in the binder's process

        # A binder that dies takes only its own model away; its request in flight fails.
        failures = []

        def slow_call():
            try:
                with ModelClient(f"localhost:{http}", "Mul", inference_timeout_s=60) as c:
                    c.infer_batch(-a, b)
            except Exception as exc:  # noqa: BLE001 - inspected below
                failures.append(exc)

        caller = threading.Thread(target=slow_call)
        caller.start()
        time.sleep(1.0)
        binders["Mul"].kill()
        binders["Mul"].wait()
        caller.join(30)
        assert not caller.is_alive()
        assert len(failures) == 1 and "disconnected" in str(failures[0])
        assert wait_code(http, "Mul", 400, 20)
        with ModelClient(f"localhost:{http}", "Power") as c:
            assert c.infer_batch(a, b)["OUT"].tolist() == [[1.0], [8.0]]
        assert ready_code(http, "AddSub") == 200

        # One that is stopped (Ctrl-C) unbinds and exits cleanly.
        assert _stop(binders["Power"]) == 0
        assert ready_code(http, "Power") == 400
        with ModelClient(f"localhost:{http}", "AddSub") as c:
            assert c.infer_batch(a, b)["sub"].tolist() == [[-1.0], [-1.0]]
        assert _stop(server) == 0
        assert place.candidate_sockets(http) == [] and place.candidate_sockets(grpc) == []
    finally:
        for proc in (*binders.values(), server):
            _stop(proc, signal.SIGKILL)


# ---- in-process server, RemoteTriton in this process ----------------------------------------------


@pytest.fixture(scope="module")
def host():
    """A Triton() (remote binding on by default), serving one local model."""
    cfg = config()
    t = Triton(config=cfg, workspace=workspace())
    t.bind("local", lambda requests: [{"y": r["x"] + 1} for r in requests], VEC, OUT,
           config=ModelConfig(max_batch_size=8))
    t.run()
    yield cfg
    t.stop()


def remote(cfg) -> RemoteTriton:
    return RemoteTriton(url=f"localhost:{cfg.http_port}", workspace=workspace())


def test_sync_async_and_decoupled_callables(host):
    def doubled(requests):
        return [{"y": r["x"] * 2} for r in requests]

    async def tripled(requests):
        return [{"y": r["x"] * 3} for r in requests]

    def stream(requests):
        for i in range(3):
            yield [{"y": r["x"] + i} for r in requests]

    with remote(host) as rt:
        rt.bind("r_doubled", doubled, VEC, OUT, config=ModelConfig(max_batch_size=8))
        rt.bind("r_tripled", tripled, VEC, OUT, config=ModelConfig(max_batch_size=8))
        rt.bind("r_stream", stream, VEC, OUT, config=ModelConfig(max_batch_size=8, decoupled=True))
        assert rt.is_alive() and rt.is_connected()
        assert infer(host.http_port, "r_doubled", X).as_numpy("y").tolist() == [[2.0, 4.0]]
        assert infer(host.http_port, "r_tripled", X).as_numpy("y").tolist() == [[3.0, 6.0]]
        got, done = [], threading.Event()

        def callback(result, error):
            if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
                done.set()
            if error is None and result.as_numpy("y") is not None:
                got.append(result.as_numpy("y").tolist())

        client = grpcclient.InferenceServerClient(f"localhost:{host.grpc_port}")
        client.start_stream(callback=callback)
        x = grpcclient.InferInput("x", list(X.shape), "FP32")
        x.set_data_from_numpy(X)
        client.async_stream_infer("r_stream", [x], enable_empty_final_response=True)
        assert done.wait(20)
        client.stop_stream()
        client.close()
        assert got == [[[1.0, 2.0]], [[2.0, 3.0]], [[3.0, 4.0]]]
        assert infer(host.http_port, "local", X).as_numpy("y").tolist() == [[2.0, 3.0]]
    for model in ("r_doubled", "r_tripled", "r_stream"):
        assert ready_code(host.http_port, model) == 400  # stop() unbound them


def test_cancelled_stream_stops_the_remote_generator(host):
    """A client that cancels a decoupled request stops the generator in the binding process too."""
    closed = threading.Event()
    sent = []

    def endless(requests):
        try:
            while True:
                time.sleep(0.05)
                sent.append(1)
                yield [{"y": r["x"]} for r in requests]
        finally:
            closed.set()

    with remote(host) as rt:
        rt.bind("r_endless", endless, VEC, OUT, config=ModelConfig(max_batch_size=8, decoupled=True))
        got = threading.Semaphore(0)
        client = grpcclient.InferenceServerClient(f"localhost:{host.grpc_port}")
        client.start_stream(callback=lambda result, error: got.release())
        x = grpcclient.InferInput("x", list(X.shape), "FP32")
        x.set_data_from_numpy(X)
        client.async_stream_infer("r_endless", [x])
        assert got.acquire(timeout=10) and got.acquire(timeout=10)
        client.stop_stream(cancel_requests=True)
        client.close()
        assert closed.wait(10)
        count = len(sent)
        time.sleep(0.3)
        assert len(sent) == count  # nothing more is produced


def test_strings_parameters_and_multiple_instances(host):
    seen = []

    def make(tag):
        def echo(requests):
            seen.append(tag)
            return [{"text": np.char.upper(r["text"].astype(np.bytes_)).astype(object),
                     "param": np.array([str(r.parameters.get("p", "")).encode()], dtype=object)} for r in requests]
        return echo

    with remote(host) as rt:
        rt.bind("r_echo", [make("a"), make("b")], [Tensor(name="text", dtype=bytes, shape=(-1,))],
                [Tensor(name="text", dtype=bytes, shape=(-1,)), Tensor(name="param", dtype=bytes, shape=(1,))],
                config=ModelConfig(batching=False))
        with httpclient.InferenceServerClient(f"localhost:{host.http_port}") as c:
            t = httpclient.InferInput("text", [2], "BYTES")
            t.set_data_from_numpy(np.array([b"ab", b"xyz"], dtype=object))
            result = c.infer("r_echo", [t], parameters={"p": "hello"})
        assert result.as_numpy("text").tolist() == [b"AB", b"XYZ"]
        assert result.as_numpy("param").tolist() == [b"hello"]
        config = ModelClient(f"localhost:{host.http_port}", "r_echo").model_config
        assert config.instance_group and sum(config.instance_group.values()) == 2


def test_errors_reach_the_client_and_only_unrecoverable_ones_unbind(host):
    def picky(requests):
        if (requests[0]["x"] < 0).any():
            raise ValueError("negative input is not allowed here")
        if (requests[0]["x"] > 100).any():
            raise PyTritonUnrecoverableError("the remote device is gone")
        return [{"y": r["x"]} for r in requests]

    rt = remote(host)
    rt.bind("r_picky", picky, VEC, OUT)
    serving = threading.Thread(target=rt.serve, kwargs={"monitoring_period_s": 60})
    serving.start()
    try:
        assert wait_code(host.http_port, "r_picky", 200)
        with pytest.raises(InferenceServerException, match="negative input is not allowed here"):
            infer(host.http_port, "r_picky", -X)
        assert rt.is_alive()
        assert infer(host.http_port, "r_picky", X).as_numpy("y").tolist() == [[1.0, 2.0]]
        with pytest.raises(InferenceServerException, match="the remote device is gone"):
            infer(host.http_port, "r_picky", X * 1000)
        serving.join(30)
        assert not serving.is_alive() and not rt.is_alive()
        assert ready_code(host.http_port, "r_picky") == 400
        assert infer(host.http_port, "local", X).as_numpy("y").tolist() == [[2.0, 3.0]]  # the server is fine
    finally:
        rt.stop()
        serving.join(5)


def test_bind_after_connect_and_replacing_a_remote_model(host):
    with remote(host) as rt:
        rt.bind("r_late", lambda requests: [{"y": r["x"] - 1} for r in requests], VEC, OUT)
        assert infer(host.http_port, "r_late", X).as_numpy("y").tolist() == [[0.0, 1.0]]
        with pytest.raises(PyTritonInvalidOperationError):
            rt.bind("r_late", lambda requests: requests, VEC, OUT)
        with remote(host) as other:  # binding a served name replaces the model (PyTriton's remote bind does)
            other.bind("r_late", lambda requests: [{"y": r["x"] * 10} for r in requests], VEC, OUT)
            assert infer(host.http_port, "r_late", X).as_numpy("y").tolist() == [[10.0, 20.0]]
        assert ready_code(host.http_port, "r_late") == 400  # gone with the process that bound it last
        assert rt.is_alive()
    assert infer(host.http_port, "local", X).as_numpy("y").tolist() == [[2.0, 3.0]]


def test_life_cycle_states_and_replacing_a_local_model():
    """The states PyTriton's remote life-cycle suite checks, and its name clash: a remote bind of the
    local model's name serves the remote callable, and the name is gone once the remote stops."""
    cfg = config()
    with Triton(config=cfg, workspace=workspace()) as t:
        t.bind("clash", lambda requests: [{"y": r["x"]} for r in requests], VEC, OUT)
        t.bind("empty", lambda: None, [], [])
        rt = RemoteTriton(url=f"localhost:{cfg.http_port}", workspace=workspace())
        assert not rt.is_connected() and rt.is_alive()
        rt.bind("r_empty", lambda: None, [], [])
        assert not rt.is_connected() and not rt.is_alive()
        rt.connect()
        assert rt.is_connected() and rt.is_alive()
        with ModelClient(f"localhost:{cfg.http_port}", "r_empty", lazy_init=False) as c:
            assert c.model_config.model_name == "r_empty"
        rt.bind("clash", lambda requests: [{"y": r["x"] * -1} for r in requests], VEC, OUT)
        assert infer(cfg.http_port, "clash", X).as_numpy("y").tolist() == [[-1.0, -2.0]]
        assert rt.stop() is True and not rt.is_connected()
        assert ready_code(cfg.http_port, "clash") == 400 and ready_code(cfg.http_port, "r_empty") == 400
        assert ready_code(cfg.http_port, "empty") == 200 and t.is_alive()


def test_clients_of_a_model_gone_with_its_remote_binder_time_out_as_in_pytriton():
    """PyTriton 0.7's remote life-cycle suite (test_local_and_remote_models_closes_client and
    _name_clash): once the RemoteTriton block that bound a model closes, a client made before it
    gets the server's error, and a new client (eager or lazy) waits init_timeout_s for the model and
    raises PyTritonClientTimeoutError (Kernel's is also a PyTritonClientModelUnavailableError)."""
    cfg = config()
    with Triton(config=cfg, workspace=workspace()) as t:
        t.bind("local", lambda requests: [{"y": r["x"] + 1} for r in requests], VEC, OUT,
               config=ModelConfig(max_batch_size=8))
        t.run()
        _clients_after_the_remote_block(cfg)


def _clients_after_the_remote_block(host) -> None:
    url = f"http://localhost:{host.http_port}"
    local = ModelClient(url, "local", init_timeout_s=1.0, inference_timeout_s=10)  # lazy: nothing asked yet
    with remote(host) as rt:
        rt.bind("r_gone", lambda requests: [{"y": r["x"] + 2} for r in requests], VEC, OUT,
                config=ModelConfig(max_batch_size=8))
        earlier = ModelClient(url, "r_gone", init_timeout_s=10, inference_timeout_s=10, lazy_init=False)
        assert earlier.infer_batch(X)["y"].tolist() == [[3.0, 4.0]]
        rt.bind("local", lambda requests: [{"y": r["x"] * 0} for r in requests], VEC, OUT,
                config=ModelConfig(max_batch_size=8))  # the name clash: replaces the local model
    with pytest.raises(PyTritonClientInferenceServerError):
        earlier.infer_batch(X)
    earlier.close()
    start = time.monotonic()
    with pytest.raises(PyTritonClientTimeoutError) as raised:
        ModelClient(url, "r_gone", init_timeout_s=1.0, lazy_init=False)
    assert time.monotonic() - start >= 0.9  # it waited for the model, as PyTriton's client does
    assert isinstance(raised.value, PyTritonClientModelUnavailableError) and "r_gone" in raised.value.message
    with ModelClient(url, "r_gone", init_timeout_s=1.0) as lazy:
        with pytest.raises(PyTritonClientTimeoutError):
            lazy.infer_batch(X)
    with local:
        with pytest.raises(PyTritonClientTimeoutError):
            local.infer_batch(X)


def test_server_stop_ends_remote_serve():
    cfg = config()
    server = Triton(config=cfg, workspace=workspace())
    server.run()
    rt = RemoteTriton(url=f"grpc://localhost:{cfg.grpc_port}", workspace=workspace())  # the gRPC port works too
    rt.bind("r_gone", lambda requests: [{"y": r["x"]} for r in requests], VEC, OUT)
    serving = threading.Thread(target=rt.serve, kwargs={"monitoring_period_s": 60})
    serving.start()
    assert wait_code(cfg.http_port, "r_gone", 200)
    server.stop()
    serving.join(30)
    assert not serving.is_alive() and not rt.is_alive()
    assert rt.stop() is False


def test_off_when_the_config_turns_it_off():
    cfg = config(allow_remote_binding=False)
    with Triton(config=cfg, workspace=workspace()):
        rt = RemoteTriton(url=f"localhost:{cfg.http_port}", workspace=workspace())
        with pytest.raises(PyTritonInvalidOperationError, match="allow_remote_binding"):
            rt.connect()
        rt.stop()


def test_only_this_host():
    rt = RemoteTriton(url="http://10.11.12.13:8000", workspace=workspace())
    with pytest.raises(PyTritonInvalidOperationError, match="this host only"):
        rt.connect()
    rt.stop()


def test_other_users_cannot_reach_the_socket(host):
    """The socket is 0600 in a folder only this user may enter (0700); as root, a process of another
    user is also tried (the peer-uid check behind it is tested in test_remote_socket.py)."""
    import stat

    path = socket_of(host.http_port)
    assert place.problem(path.parent) is None and stat.S_IMODE(path.parent.lstat().st_mode) == 0o700
    assert path.lstat().st_uid == os.getuid() and stat.S_IMODE(path.lstat().st_mode) == 0o600
    if os.getuid() != 0:
        return
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        import socket

        os.setgid(65534)
        os.setuid(65534)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(path))
        except PermissionError:
            os._exit(0)
        except BaseException:
            os._exit(2)
        os._exit(1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# ---- into `kernel serve` -------------------------------------------------------------------------


def test_kernel_serve_allows_remote_binding_only_with_the_flag(start_kernel):
    from conftest import EXAMPLES

    plain = start_kernel([EXAMPLES]).wait_ready()
    with pytest.raises(PyTritonInvalidOperationError, match="does not accept remote binding"):
        with RemoteTriton(url=f"localhost:{plain.http_port}", workspace=workspace()):
            pass
    k = start_kernel([EXAMPLES], "--allow-remote-binding=true").wait_ready()
    with RemoteTriton(url=f"localhost:{k.http_port}", workspace=workspace()) as rt:
        rt.bind("r_doubled", lambda requests: [{"y": r["x"] * 2} for r in requests], VEC, OUT,
                config=ModelConfig(max_batch_size=8))
        assert infer(k.http_port, "r_doubled", X).as_numpy("y").tolist() == [[2.0, 4.0]]
        with httpclient.InferenceServerClient(f"localhost:{k.http_port}") as c:  # model.py models still served
            inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
            for t in inputs:
                t.set_data_from_numpy(np.ones(4, np.float32))
            assert c.infer("add_sub", inputs).as_numpy("OUTPUT0").tolist() == [2.0] * 4
    assert ready_code(k.http_port, "r_doubled") == 400
    assert k.wait_for_log("bound by remote process")
    assert k.stop() == 0
    assert place.candidate_sockets(k.http_port) == []


def _raw_exchange(sock, message):
    import socket as socket_module  # noqa: F401 - the caller's socket

    sock.sendall(proto.frame(message))
    header = b""
    while len(header) < proto.HEADER_BYTES:
        chunk = sock.recv(proto.HEADER_BYTES - len(header))
        assert chunk, "the server closed the connection"
        header += chunk
    body = b""
    length = proto.frame_length(header)
    while len(body) < length:
        body += sock.recv(length - len(body))
    return proto.decode(body)


def test_server_checks_what_a_binding_process_sends(host):
    """The server does not trust the binding process's own checks: no path-like names, no other backends,
    and a peer sending garbage only loses its own connection."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(socket_of(host.http_port)))
        assert _raw_exchange(s, proto.Hello(pid=os.getpid())).error is None
        for name, config_text, expected in (
            ("../escape", 'backend: "python"', "invalid model name"),
            ("r_onnx", 'backend: "onnxruntime"', "python backend only"),
            ("r_env", 'backend: "python" parameters { key: "EXECUTION_ENV_PATH" value { string_value: "/x.tar.gz" } }',
             "EXECUTION_ENV_PATH"),
        ):
            answer = _raw_exchange(s, proto.Bind(name, 1, config_text, [], False, False, False, 1))
            assert isinstance(answer, proto.Answer) and expected in (answer.error or ""), answer
        assert not (Path(tempfile.gettempdir()) / "escape").exists()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(socket_of(host.grpc_port)))
        assert _raw_exchange(s, proto.Hello(pid=os.getpid())).error is None
        s.sendall(b"\x00\x00\x00\x05garbage")
        s.settimeout(10)
        assert s.recv(1) == b""  # dropped
    assert infer(host.http_port, "local", X).as_numpy("y").tolist() == [[2.0, 3.0]]

"""Who may be at either end of the remote-binding socket (issue 23, defect 5).

Another local user can create any name under /tmp first and listen on a port our server is not
using. Neither may stop our server from taking remote binds, and neither may receive a binding
(a model's config, its callable's answers): the binding goes over the Unix socket only, from a
folder private to the user, to a process that runs as the user, and the server takes it from
such a process only. The places the socket may go (kernel.proxy.remote_socket's SHARED_TMP and
RUN_USER, $XDG_RUNTIME_DIR) are pointed at this test's own folder, so nothing here touches the
real /tmp/kernel-remote-<uid> other tests use.
"""

from __future__ import annotations

import http.server
import logging
import os
import socket
import stat
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import free_ports
from kernel.exceptions import PyTritonInvalidOperationError, PyTritonRuntimeError
from kernel.model_config import ModelConfig, Tensor
from kernel.proxy import remote as proto
from kernel.proxy import remote_socket as place
from kernel.remote.link import Link, NotOurServer
from kernel.triton import RemoteTriton, Triton, TritonConfig

VEC = [Tensor(name="x", dtype=np.float32, shape=(-1,))]
OUT = [Tensor(name="y", dtype=np.float32, shape=(-1,))]
X = np.array([[1.0, 2.0]], np.float32)
UID = os.getuid()
OTHER_UID = 65534 if UID != 65534 else 65533


@pytest.fixture
def places(tmp_path_factory, monkeypatch):
    """A /tmp of the test's own (sticky, open to all, as /tmp is), no runtime folder; short enough a
    path for Unix sockets (tmp_path can be too deep)."""
    root = tmp_path_factory.mktemp("rs")
    shared = root / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    monkeypatch.setattr(place, "SHARED_TMP", shared)
    monkeypatch.setattr(place, "RUN_USER", root / "run-user")
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return root


class Records(logging.Handler):
    """The messages of the remote-binding and Triton() loggers ('kernel' does not propagate to the root
    logger pytest's caplog listens on, and the server replaces its handlers when it starts)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def has(self, *parts: str) -> bool:
        return any(all(p in m for p in parts) for m in self.messages)


@pytest.fixture
def warnings_logged():
    records = Records()
    loggers = [logging.getLogger(name) for name in ("kernel.remote", "kernel.triton")]
    for logger in loggers:
        logger.addHandler(records)
    yield records
    for logger in loggers:
        logger.removeHandler(records)


class Listener:
    """What another user's process listening on a socket sees: its connections and every byte sent.
    It answers like a server (Welcome) so a client that trusts it goes on to send its models."""

    def __init__(self, path: Path):
        self.connections = 0
        self.received = bytearray()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.running = True
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while self.running:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn):
        conn.settimeout(5)
        with conn:
            try:
                while True:
                    data = conn.recv(65536)
                    if not data:
                        return
                    first = not self.received
                    self.received += data
                    if first:
                        conn.sendall(proto.frame(proto.Welcome()))
            except OSError:
                return

    def close(self):
        self.running = False
        self.thread.join(5)
        self.sock.close()


class ReadyPort:
    """Another user's HTTP server on the port RemoteTriton names: it says it is a ready Triton."""

    def __init__(self, port: int):
        class Ready(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Ready)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def squat(kind: str, root: Path, port: int):
    """Take /tmp/kernel-remote-<uid> before the server does, as another user could; returns the
    listener put where a client that trusted the folder would connect (None for a plain file)."""
    path = place.shared_folder()
    if kind == "file":
        path.write_text("not a folder")
        return None
    if kind == "open-folder":
        path.mkdir()
        os.chmod(path, 0o777)
        inside = path
    else:  # a link to a folder of the squatter's
        inside = root / "squatter"
        inside.mkdir(mode=0o700)
        path.symlink_to(inside)
    return Listener(inside / place.socket_name(port))


def infer(port: int, model: str, x: np.ndarray):
    with httpclient.InferenceServerClient(f"localhost:{port}") as c:
        t = httpclient.InferInput("x", list(x.shape), "FP32")
        t.set_data_from_numpy(x)
        return c.infer(model, [t]).as_numpy("y")


def config(**extra) -> TritonConfig:
    http, grpc, metrics = free_ports(3)
    return TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics, **extra)


@pytest.mark.parametrize("kind", ["open-folder", "symlink"])
def test_a_binding_never_goes_to_a_squatted_folder_or_the_port(places, kind):
    """No server of ours, another user's "ready" HTTP server on the port and a listening socket in the
    folder they took: RemoteTriton refuses, and the squatter receives nothing at all."""
    (port,) = free_ports(1)
    listener = squat(kind, places, port)
    ready = ReadyPort(port)
    rt = RemoteTriton(url=f"127.0.0.1:{port}", workspace=places / "ws")
    rt.bind("secret", lambda requests: [{"y": r["x"]} for r in requests], VEC, OUT)
    try:
        with pytest.raises(PyTritonInvalidOperationError, match="does not accept remote binding"):
            rt.connect()
        time.sleep(0.3)  # let the listener see anything that was sent
        assert listener.connections == 0 and bytes(listener.received) == b""
    finally:
        rt.stop()
        ready.close()
        listener.close()


@pytest.mark.parametrize("kind", ["open-folder", "symlink", "file"])
def test_a_squatted_folder_does_not_stop_the_server(places, kind, warnings_logged):
    """The server starts all the same, its socket in a fresh private folder, and warns naming the
    folder it did not use and why; a RemoteTriton finds it there, and the squatter gets nothing."""
    cfg = config(allow_remote_binding=True)
    listener = squat(kind, places, cfg.http_port)
    triton = Triton(config=cfg, workspace=places / "server-ws")
    try:
        triton.run()
        why = {"open-folder": "is open to group or others", "symlink": "is a symbolic link",
               "file": "is not a folder"}[kind]
        assert warnings_logged.has(str(place.shared_folder()), why)
        found = place.candidate_sockets(cfg.http_port)
        assert len(found) == 1 and found[0].parent.name.startswith(f"kernel-remote-{UID}-")
        folder = found[0].parent
        assert place.problem(folder) is None and stat.S_IMODE(folder.lstat().st_mode) == 0o700
        with RemoteTriton(url=f"localhost:{cfg.http_port}", workspace=places / "ws") as rt:
            rt.bind("r_double", lambda requests: [{"y": r["x"] * 2} for r in requests], VEC, OUT,
                    config=ModelConfig(max_batch_size=8))
            assert infer(cfg.http_port, "r_double", X).tolist() == [[2.0, 4.0]]
    finally:
        triton.stop()
        if listener is not None:
            listener.close()
    assert not folder.exists()  # the fresh folder goes with the server
    assert os.path.lexists(place.shared_folder())  # the squatter's is left alone
    if listener is not None:
        assert listener.connections == 0 and bytes(listener.received) == b""


def test_the_runtime_folder_is_used_when_private(places, monkeypatch):
    """$XDG_RUNTIME_DIR (a folder no other user can create) holds the socket when it is private; one
    open to others is passed over for /tmp/kernel-remote-<uid>."""
    runtime = places / "xdg"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    cfg = config()
    with Triton(config=cfg, workspace=places / "ws1"):
        assert place.candidate_sockets(cfg.http_port) == [runtime / "kernel-remote" / f"{cfg.http_port}.sock"]
        with RemoteTriton(url=f"localhost:{cfg.http_port}", workspace=places / "ws2") as rt:
            rt.bind("r_xdg", lambda requests: [{"y": r["x"] + 1} for r in requests], VEC, OUT)
            assert infer(cfg.http_port, "r_xdg", X).tolist() == [[2.0, 3.0]]
    os.chmod(runtime, 0o755)
    cfg = config()
    with Triton(config=cfg, workspace=places / "ws3"):
        assert place.candidate_sockets(cfg.http_port) == [place.shared_folder() / f"{cfg.http_port}.sock"]


def test_the_binding_process_refuses_a_listener_of_another_user(places):
    """The binding side checks the listening process's uid before it sends its first frame."""
    listener = Listener(places / "server.sock")
    try:
        with pytest.raises(NotOurServer, match=f"runs as uid {UID}, not uid {OTHER_UID}"):
            Link(places / "server.sock", on_lost=lambda: None, on_unrecoverable=lambda exc: None, uid=OTHER_UID)
        time.sleep(0.3)
        assert listener.connections == 1 and bytes(listener.received) == b""
        link = Link(places / "server.sock", on_lost=lambda: None, on_unrecoverable=lambda exc: None)  # ours: taken
        link.close()
        assert bytes(listener.received) == proto.frame(proto.Hello(pid=os.getpid()))
    finally:
        listener.close()
    if UID == 0:  # root can also run the listener as a real other user
        path = places / "other.sock"
        ready_r, ready_w = os.pipe()
        got_r, got_w = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child
            try:  # the peer's uid is the one it has when it calls listen(): bind here, listen as the other user
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.bind(str(path))
                os.setgid(OTHER_UID)
                os.setuid(OTHER_UID)
                s.listen(1)
                os.write(ready_w, b"1")
                conn, _ = s.accept()
                conn.settimeout(5)
                data = b""
                try:
                    while chunk := conn.recv(4096):
                        data += chunk
                except OSError:
                    pass
                os.write(got_w, str(len(data)).encode())
            finally:
                os._exit(0)
        os.close(ready_w)
        os.close(got_w)
        try:
            assert os.read(ready_r, 1) == b"1"
            with pytest.raises(NotOurServer, match=f"runs as uid {OTHER_UID}, not uid 0"):
                Link(path, on_lost=lambda: None, on_unrecoverable=lambda exc: None)
            assert os.read(got_r, 16) == b"0"  # it got the connection, and not a byte
        finally:
            os.waitpid(child, 0)
            os.close(ready_r)
            os.close(got_r)


def test_the_server_refuses_a_binding_process_of_another_user(places, warnings_logged):
    """The server checks the connecting process's uid before it reads a frame: one of another user is
    closed on without an answer, and the server goes on taking binds from its own user."""
    cfg = config()
    with Triton(config=cfg, workspace=places / "ws1") as triton:
        path = place.candidate_sockets(cfg.http_port)[0]
        triton._remote.uid = OTHER_UID  # as if this process ran as another user than the server
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(path))
            s.settimeout(10)
            try:
                s.sendall(proto.frame(proto.Hello(pid=os.getpid())))
            except BrokenPipeError:
                pass
            try:
                assert s.recv(1) == b""  # closed, no Welcome
            except ConnectionResetError:
                pass
        assert warnings_logged.has("Refused a remote-binding connection", f"runs as uid {UID}, not uid {OTHER_UID}")
        triton._remote.uid = UID
        with RemoteTriton(url=f"localhost:{cfg.http_port}", workspace=places / "ws2") as rt:
            rt.bind("r_ok", lambda requests: [{"y": r["x"]} for r in requests], VEC, OUT)
            assert infer(cfg.http_port, "r_ok", X).tolist() == [[1.0, 2.0]]


def test_the_checks_themselves(places):
    """check_peer on a connected pair, and the folder checks, for a uid other than the peer's/owner's."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        place.check_peer(a)
        with pytest.raises(place.PeerRefused, match=f"runs as uid {UID}, not uid {OTHER_UID}"):
            place.check_peer(a, OTHER_UID)
    mine = places / "mine"
    mine.mkdir(mode=0o700)
    assert place.problem(mine) is None
    assert place.problem(mine, OTHER_UID) == f"belongs to uid {UID}, not {OTHER_UID}"
    assert place.problem(places / "missing") == "does not exist"


def test_on_by_default_but_never_at_the_cost_of_the_server(places, monkeypatch, warnings_logged):
    """Remote binding that cannot be opened (here: no folder short enough for a Unix socket path) only
    warns when it was not asked for; asked for explicitly, the start fails saying why."""
    deep = places / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr(place, "SHARED_TMP", deep)
    cfg = config()
    with Triton(config=cfg, workspace=places / "ws1") as triton:
        triton.bind("local", lambda requests: [{"y": r["x"]} for r in requests], VEC, OUT)
        assert infer(cfg.http_port, "local", X).tolist() == [[1.0, 2.0]]
        assert warnings_logged.has("Remote binding is not available", "too long")
    with pytest.raises(PyTritonRuntimeError, match="Remote binding cannot be enabled: .*too long"):
        with Triton(config=config(allow_remote_binding=True), workspace=places / "ws2"):
            pass
    assert list(deep.iterdir()) == []  # nothing left behind

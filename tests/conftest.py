"""Shared fixtures: a real `kernel serve` subprocess on free ports."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# Tests stop servers with Ctrl-C (SIGINT) as a user at a terminal does. A run started in the
# background of a shell without job control (`(make test &)`, nohup) inherits SIGINT ignored, and
# so would every server it starts: none would stop, each test would wait and kill it. Children of
# a process with a handler start with the default action, as under a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
EXAMPLES = ROOT / "model_repo_examples"
TEST_MODELS = Path(__file__).resolve().parent / "models"


# ---- nothing left in /tmp ------------------------------------------------------------------------

_tmp_before: set[str] = set()


def _tmp_entries() -> set[str]:
    try:
        return set(os.listdir("/tmp"))
    except OSError:
        return set()


@pytest.fixture(scope="session", autouse=True)
def temporary_files_under_pytest(tmp_path_factory):
    """Every temporary file of the session goes under pytest's temporary folder, not /tmp: TMPDIR
    points there for the tests and every process they start (test servers' logs, workspaces, the
    folders servers make themselves). tests/packaging/test_temporary_files.py checks that it holds."""
    _tmp_before.update(_tmp_entries())
    private = tmp_path_factory.mktemp("tmp")
    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(private)
    tempfile.tempdir = None  # tempfile reads TMPDIR again
    try:
        yield private
    finally:
        if saved is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved
        tempfile.tempdir = None


def pytest_terminal_summary(terminalreporter):
    """Name what appeared in /tmp while the session ran (pytest's own folders aside). A report, not a
    failure: on a shared machine other processes write there too; the checks that fail are
    tests/packaging/test_temporary_files.py."""
    if not _tmp_before:
        return
    new = sorted(n for n in _tmp_entries() - _tmp_before if not n.startswith("pytest-of-"))
    if new:
        terminalreporter.write_line(f"{len(new)} new entries in /tmp during this session (this session's, or "
                                    f"another process's): {', '.join(new[:10])}", yellow=True)


# Servers under test listen below the kernel's ephemeral range (32768-60999 by default): a port
# picked there could be taken by some client's outgoing connection before the server binds it.
# A port is handed out once per test run: two picks in a row (a SageMaker port, then a server's
# own three) must never name the same port, though each was free when it was picked.
_SERVER_PORTS = range(20000, 32000)
_port_picker = random.Random(os.getpid())
_handed_out: set[int] = set()


def free_ports(n: int) -> list[int]:
    """n distinct free ports, none handed out before in this run."""
    if len(_handed_out) + n > len(_SERVER_PORTS) // 2:
        _handed_out.clear()  # thousands of servers later, the first ones are long gone
    socks = []
    try:
        while len(socks) < n:
            port = _port_picker.choice(_SERVER_PORTS)
            if port in _handed_out:
                continue
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
            _handed_out.add(port)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def wait_until_ok(server, urls: list[str], timeout: float = 60.0) -> None:
    """Wait until every URL answers 200, in order; fail early if `server.proc` exits (its log() is shown)."""
    name = getattr(server, "name", "server")
    deadline = time.time() + timeout
    pending = list(urls)
    while pending and time.time() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {server.proc.returncode}:\n{server.log()}")
        try:
            with urllib.request.urlopen(pending[0], timeout=1) as r:
                if r.status == 200:
                    pending.pop(0)
                    continue
        except OSError:
            pass
        time.sleep(0.05)
    if pending:
        raise RuntimeError(f"{name}: {pending} did not become ready:\n{server.log()}")


class ServerProcess:
    """A server subprocess on three free ports (HTTP, gRPC, metrics); its combined output is kept for assertions."""

    name = "server"

    def __init__(self, args: list[str], log_path: Path, env=None, cwd=None):
        self.log_path = log_path
        self._log = open(self.log_path, "w+b")
        self.proc = subprocess.Popen(args, cwd=cwd or ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})

    @property
    def url(self) -> str:
        return f"localhost:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.grpc_port}"

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_until_ok(self, paths: list[str], timeout: float = 60.0):
        """Wait until every path on the HTTP port answers 200, in order; fail early if the process exits."""
        wait_until_ok(self, [f"http://{self.url}{p}" for p in paths], timeout)
        return self

    def wait_for_log(self, text: str, times: int = 1, timeout: float = 10.0) -> bool:
        """Whether the log holds `text` at least `times` times within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log().count(text) >= times:
                return True
            time.sleep(0.05)
        return False

    def wait_exit(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 30.0) -> int:
        """Ctrl-C, as a user would stop it; killed if it does not end within `timeout`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


# Arguments every `kernel serve` of the run gets before its own: `make test` runs chosen suites a
# second time with KERNEL_TEST_SERVE_ARGS="--front-processes 2", so that they check that several
# front processes behave as one (a test's own arguments come after, and win).
SERVE_ARGS = os.environ.get("KERNEL_TEST_SERVE_ARGS", "").split()


class KernelProcess(ServerProcess):
    """A `kernel serve` subprocess."""

    name = "kernel serve"

    def __init__(self, repos, *extra: str, env=None, cwd=None):
        """cwd: where to start it; then it starts as users do, with the `kernel` command (not
        `python -m`, which would put that folder first on the front process's import path)."""
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        command = [str(Path(sys.executable).with_name("kernel"))] if cwd else [sys.executable, "-m", "kernel"]
        args = [*command, "serve"]
        for r in repos:
            args += ["--model-repository", str(r)]
        args += [
            "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
            "--metrics-port", str(self.metrics_port), *SERVE_ARGS, *extra,
        ]
        # Under pytest's temporary folder (TMPDIR, see temporary_files_under_pytest), kept with the run's other files.
        log_path = Path(tempfile.gettempdir()) / f"kernel-test-{self.http_port}.log"
        super().__init__(args, log_path, env, cwd)

    def wait_ready(self, timeout: float = 60.0) -> "KernelProcess":
        return self.wait_until_ok(["/v2/health/ready"], timeout)


def children(pid: int) -> list[int]:
    """The child processes of `pid` (of all its threads: asyncio starts workers from any)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def running(k: ServerProcess):
    """Body of a fixture that owns `k`: `yield from running(k)` gives it ready and stops it afterwards."""
    try:
        yield k.wait_ready()
    finally:
        k.stop()


def serving(repos, *extra: str):
    """Body of a module-scoped fixture: `yield from serving([REPO])` gives a ready server."""
    yield from running(KernelProcess(repos, *extra))


@pytest.fixture(scope="session")
def server():
    """One server for the read-only tests: the bundled examples plus the test models."""
    yield from running(KernelProcess([EXAMPLES, TEST_MODELS / "good"]))


@pytest.fixture(params=["http", "grpc"])
def url(request, server):
    """The session server's address as kernel.client takes it, once per protocol."""
    return f"http://{server.url}" if request.param == "http" else f"grpc://{server.grpc_url}"


@pytest.fixture
def start_kernel():
    """Start extra servers for tests that need their own; all are stopped afterwards."""
    started = []

    def start(repos, *extra, env=None):
        k = KernelProcess(repos, *extra, env=env)
        started.append(k)
        return k

    yield start
    for k in started:
        k.stop()


@pytest.fixture
def http_client(server):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.url)
    yield client
    client.close()


def copy_model(src: Path, dest_repo: Path, name: str | None = None) -> Path:
    target = dest_repo / (name or src.name)
    shutil.copytree(src, target)
    return target


def absolute_imports(tree):
    """(node, top-level module) for each absolute import in an ast tree: `import a.b` and `from a.b import c`
    give `a` (what the packaging tests check against the Python versions and the image's packages)."""
    import ast

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node, node.module.split(".")[0]

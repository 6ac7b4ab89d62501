"""Shared by the OpenAI API tests: `kernel serve --openai-port`, tiny_lm variants, raw HTTP."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import time
import urllib.request
from pathlib import Path

from conftest import EXAMPLES, TEST_MODELS, KernelProcess, free_port

OPENAI_MODELS = TEST_MODELS / "openai"
TINY_LM = EXAMPLES / "tiny_lm"


class OpenAIServer(KernelProcess):
    """A kernel serve with the OpenAI API on a free port of its own."""

    name = "kernel serve --openai-port"

    def __init__(self, repos, *extra: str, env=None):
        self.openai_port = free_port()
        super().__init__(repos, "--openai-port", str(self.openai_port), *extra, env=env)

    @property
    def base_url(self) -> str:
        return f"http://localhost:{self.openai_port}/v1"

    def client(self, **kwargs):
        from openai import OpenAI

        return OpenAI(**{"base_url": self.base_url, "api_key": "unused", "max_retries": 0, "timeout": 60, **kwargs})

    def async_client(self, **kwargs):
        from openai import AsyncOpenAI

        return AsyncOpenAI(**{"base_url": self.base_url, "api_key": "unused", "max_retries": 0, "timeout": 60,
                              **kwargs})

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://localhost:{self.metrics_port}/metrics") as r:
            return r.read().decode()

    def metric(self, name: str, model: str) -> float:
        """One sample of the metrics text (labels model and version 1), or -1 when absent."""
        pattern = re.escape(name) + r'\{model="' + re.escape(model) + r'",version="1"\} (\S+)'
        found = re.search(pattern, self.metrics())
        return float(found.group(1)) if found else -1.0

    def front_rss_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def wait_idle(self, model: str, timeout: float = 20.0) -> None:
        """Until the model has no request in flight (nv_inference_inflight_request_count 0)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.metric("nv_inference_inflight_request_count", model) == 0:
                return
            time.sleep(0.1)
        raise AssertionError(f"{model} still has requests in flight:\n{self.metrics()}")


def tiny_lm(repo: Path, name: str = "tiny_lm", *, delay_ms: float = 0, context: int = 4096,
            extra: str = "") -> Path:
    """A copy of model_repo_examples/tiny_lm under `repo`, renamed, with its delay and context set."""
    target = repo / name
    shutil.copytree(TINY_LM, target)
    config = target / "config.pbtxt"
    text = config.read_text().replace('name: "tiny_lm"', f'name: "{name}"')
    text = text.replace('key: "token_delay_ms", value: { string_value: "0" }',
                        f'key: "token_delay_ms", value: {{ string_value: "{delay_ms}" }}')
    text = text.replace('key: "context_length", value: { string_value: "4096" }',
                        f'key: "context_length", value: {{ string_value: "{context}" }}')
    config.write_text(text + extra)
    return target


def request(port: int, method: str, path: str, body=None, headers=None, timeout: float = 30.0):
    """(status, headers (lower-case names), body) of one plain HTTP request."""
    conn = http.client.HTTPConnection("localhost", port, timeout=timeout)
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"content-type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def assert_error_shape(body: bytes) -> dict:
    """The OpenAI error object: {"error": {"message", "type", "param", "code"}}; returns the inner one."""
    doc = json.loads(body)
    assert set(doc) == {"error"}, doc
    error = doc["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    return error


def open_stream(port: int, body: dict, rcvbuf: int = 0) -> socket.socket:
    """A socket that sent one streaming POST /v1/chat/completions and has read nothing yet."""
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("localhost", port))
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return s


def read_events(sock: socket.socket, count: int, timeout: float = 30.0) -> bytes:
    """Read until `count` SSE events (or [DONE]) arrived; returns what was read (headers included)."""
    sock.settimeout(timeout)
    data = b""
    while data.count(b"data: ") < count and b"[DONE]" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def rss_kb(pid: int, key: str = "VmRSS") -> int:
    """One field of /proc/<pid>/status in KiB (VmRSS, RssAnon: the heap, without shared memory)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key}")


class LiveProbe:
    """While a `with` block runs: GET /v2/health/live on the KServe port one after another (its
    latency shows whether the front's event loop is free), and the front's peak RssAnon."""

    def __init__(self, server: KernelProcess, pause: float = 0.005):
        self.server = server
        self.pause = pause
        self.latencies: list[float] = []
        self.peak_anon_kb = 0
        self._stop = False
        self._thread = None

    def __enter__(self) -> "LiveProbe":
        import threading

        self.base_anon_kb = rss_kb(self.server.proc.pid, "RssAnon")
        self.peak_anon_kb = self.base_anon_kb
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        time.sleep(0.05)
        return self

    def _run(self) -> None:
        host, port = self.server.url.split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            while not self._stop:
                start = time.monotonic()
                conn.request("GET", "/v2/health/live")
                response = conn.getresponse()
                response.read()
                self.latencies.append(time.monotonic() - start)
                assert response.status == 200
                self.peak_anon_kb = max(self.peak_anon_kb, rss_kb(self.server.proc.pid, "RssAnon"))
                time.sleep(self.pause)
        finally:
            conn.close()

    def __exit__(self, *exc) -> None:
        self._stop = True
        self._thread.join(60)

    def p99(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]

    def assert_free(self, p99_s: float = 0.1, max_s: float = 1.0) -> None:
        """The loop stayed free: p99 latency under p99_s, none over max_s (generous: the box is shared)."""
        assert len(self.latencies) >= 10, self.latencies
        worst = max(self.latencies)
        assert self.p99() < p99_s and worst < max_s, (
            f"/v2/health/live p99 {self.p99() * 1000:.0f} ms, max {worst * 1000:.0f} ms over {len(self.latencies)}")

    def anon_growth_mib(self) -> float:
        return (self.peak_anon_kb - self.base_anon_kb) / 1024

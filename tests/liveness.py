"""How long /v2/health/live takes to answer while an attack runs: the measure of a frozen front.

Every hostile test that could stall the event loop asserts on this (issue 31): a front whose
loop is busy with one client's work answers nobody, and the liveness probe is the first to
notice. The probe runs on a thread, bounded in samples and time, on its own keep-alive
connection to 127.0.0.1.
"""

from __future__ import annotations

import subprocess
import threading
import time

import httpx


class LivenessProbe:
    """`with LivenessProbe(server.url) as probe: ...attack...`; then probe.p99_ms(), probe.max_ms().

    A request that gets no answer within `timeout` counts as `timeout` (the freeze it shows);
    one that fails counts the same and is kept in `errors`."""

    def __init__(self, address: str, interval: float = 0.01, timeout: float = 30.0, max_samples: int = 20_000,
                 max_seconds: float = 300.0):
        self.url = f"http://{address}/v2/health/live"
        self.interval = interval
        self.timeout = timeout
        self.max_samples = max_samples
        self.max_seconds = max_seconds
        self.latencies_ms: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="liveness-probe", daemon=True)

    def __enter__(self) -> "LivenessProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 5)

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        with httpx.Client(timeout=self.timeout) as client:
            while not self._stop.is_set() and len(self.latencies_ms) < self.max_samples \
                    and time.monotonic() < deadline:
                start = time.perf_counter()
                try:
                    ok = client.get(self.url).status_code == 200
                    if not ok:
                        self.errors.append("not 200")
                except httpx.HTTPError as exc:
                    ok = False
                    self.errors.append(repr(exc))
                took = (time.perf_counter() - start) * 1000 if ok else self.timeout * 1000
                self.latencies_ms.append(took)
                self._stop.wait(self.interval)

    def p99_ms(self) -> float:
        values = sorted(self.latencies_ms)
        return values[min(len(values) - 1, int(len(values) * 0.99))] if values else float("inf")

    def max_ms(self) -> float:
        return max(self.latencies_ms, default=float("inf"))

    def summary(self) -> str:
        return (f"{len(self.latencies_ms)} probes, p99 {self.p99_ms():.1f} ms, max {self.max_ms():.1f} ms, "
                f"{len(self.errors)} failed")


def probe_client(address: str, argv: list[str], timeout: float = 300) -> tuple[LivenessProbe, str, str, int]:
    """Run a client process (`argv`) with the probe on `address` while it works.

    The client prints "ready" once its request is built and waits for a line on stdin; the probe
    starts just before that line is sent and stops when the client exits. A client sending a large
    request runs in a process of its own: its serialisation holds its process's GIL, and a probe
    beside it would measure that. Returns (probe, stdout, stderr, exit status)."""
    client = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "ready", client.stderr.read()
        with LivenessProbe(address) as probe:
            client.stdin.write("\n")
            client.stdin.flush()
            out, err = client.communicate(timeout=timeout)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    print(probe.summary())
    return probe, out, err, client.returncode

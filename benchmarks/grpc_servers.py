"""Which server carries Kernel's gRPC transport: measured against real Triton with perf_analyzer.

For each round, starts each server in turn on the same model repository
(real Triton via /work/shared/bench/anchors.sh, then `kernel serve` with
KERNEL_GRPC_SERVER=native, grpclib and grpcio), runs `perf_analyzer -i grpc`
at every concurrency, and stops it; only one server runs at a time. Reports
the median round per (server, concurrency), the ratio to Triton (the median
of each round's ratio, so servers are compared with the Triton measured
minutes before them), and the front process's CPU time per request
(user+system of the server's main process over the run divided by the
requests served: steadier than throughput on a shared, noisy box).

    .venv/bin/python benchmarks/grpc_servers.py                     # 3 rounds, c=1 and c=16
    .venv/bin/python benchmarks/grpc_servers.py --rounds 5 --servers native triton

Writes benchmarks/results/grpc_servers.md (or --out).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from run import cpu_seconds  # noqa: E402  (utime + stime from /proc/PID/stat)

ANCHORS = Path(os.environ.get("KERNEL_ANCHORS_SH", "/work/shared/bench/anchors.sh"))
SERVERS = ("triton", "native", "grpclib", "grpcio")
LABELS = {
    "triton": "real Triton (C++ gRPC)",
    "native": "Kernel, own HTTP/2 server (native)",
    "grpclib": "Kernel, grpclib",
    "grpcio": "Kernel, grpcio aio",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(http_port: int, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://localhost:{http_port}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server did not become ready")


def start(server: str, repo: Path, log: Path):
    """Returns (Popen of something to stop, pid of the process serving requests, grpc port)."""
    http, grpc_port, metrics = free_port(), free_port(), free_port()
    if server == "triton":
        env = {**os.environ, "TRITON_LOG": str(log)}
        out = subprocess.run(["bash", str(ANCHORS), "triton", str(repo), str(http), str(grpc_port), str(metrics)],
                             capture_output=True, text=True, env=env, cwd="/tmp")
        if out.returncode != 0:
            raise RuntimeError(f"Triton did not start: {out.stderr}")
        pid = int(out.stdout.strip().splitlines()[-1])
        return None, pid, grpc_port
    env = {**os.environ, "KERNEL_GRPC_SERVER": server}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernel", "serve", "--model-repository", str(repo), "--http-port", str(http),
         "--grpc-port", str(grpc_port), "--metrics-port", str(metrics)],
        cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    wait_ready(http, proc)
    return proc, proc.pid, grpc_port


def stop(proc, pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.1)
    else:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc is not None:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


def measure(port: int, pid: int, model: str, concurrency: int, window_ms: int) -> dict:
    c0, t0 = cpu_seconds(pid), time.time()
    args = ["bash", str(ANCHORS), "perf", "-m", model, "-i", "grpc", "-u", f"localhost:{port}",
            "--concurrency-range", f"{concurrency}:{concurrency}", "--measurement-interval", str(window_ms)]
    out = subprocess.run(args + ["-s", "20", "-r", "6"], capture_output=True, text=True, cwd="/tmp")
    text = out.stdout + out.stderr
    stable = True
    if "Failed to obtain stable measurement" in text or out.returncode != 0:
        stable = False
        c0, t0 = cpu_seconds(pid), time.time()
        out = subprocess.run(args + ["-s", "1000", "-r", "3"], capture_output=True, text=True, cwd="/tmp")
        text = out.stdout + out.stderr
    c1, t1 = cpu_seconds(pid), time.time()
    m = re.search(r"Concurrency: \d+, throughput: ([\d.]+) infer/sec, latency (\d+) usec", text)
    if not m:
        raise RuntimeError(f"perf_analyzer failed:\n{text[-2000:]}")
    throughput = float(m.group(1))
    counts = [int(x) for x in re.findall(r"Request count: (\d+)", text)]
    # requests served while we watched: roughly throughput x elapsed (warm-up included)
    served = max(1.0, throughput * (t1 - t0))
    return {
        "throughput": throughput,
        "latency_us": int(m.group(2)),
        "cpu_us_per_request": 1e6 * (c1 - c0) / served,
        "stable": stable,
        "requests": counts[-1] if counts else None,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 16])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window-ms", type=int, default=4000)
    p.add_argument("--repo", type=Path, default=HERE / "model_repo")
    p.add_argument("--model", default="add_sub")
    p.add_argument("--out", type=Path, default=HERE / "results" / "grpc_servers.md")
    ns = p.parse_args(argv)

    results: dict[tuple[str, int], list[dict]] = {}
    logdir = ns.out.parent
    logdir.mkdir(parents=True, exist_ok=True)
    for r in range(ns.rounds):
        for server in ns.servers:
            log = logdir / f"grpc_servers-{server}.log"
            proc, pid, port = start(server, ns.repo.resolve(), log)
            try:
                for c in ns.concurrency:
                    res = measure(port, pid, ns.model, c, ns.window_ms)
                    results.setdefault((server, c), []).append(res)
                    print(f"round {r + 1} {server:8s} c={c:<3d} {res['throughput']:8.1f} infer/s  "
                          f"p50~{res['latency_us']} us  front {res['cpu_us_per_request']:.0f} us/req"
                          f"{'' if res['stable'] else ' *'}", flush=True)
            finally:
                stop(proc, pid)

    def median(server, c, key):
        vals = [x[key] for x in results.get((server, c), [])]
        return statistics.median(vals) if vals else None

    lines = [
        f"# gRPC server candidates ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC)",
        "",
        f"`perf_analyzer -i grpc -m {ns.model} --concurrency-range C:C --measurement-interval {ns.window_ms}` "
        f"against each server on `{ns.repo.relative_to(ROOT) if ns.repo.resolve().is_relative_to(ROOT) else ns.repo}`, "
        f"one server at a time, {ns.rounds} round(s) alternating servers, median round shown. "
        f"2-core shared box, loopback; Python {platform.python_version()}.  ",
        "`front us/req`: CPU time of the serving process (Kernel's front process / tritonserver) per request.  ",
        "`*`: perf_analyzer could not stabilise within 20% in some round; that round is the average of three "
        "windows with the check off.",
        "",
        "| server | concurrency | infer/s | vs Triton (median of per-round ratios) | avg latency ms | front us/req |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in ns.concurrency:
        base_rounds = [x["throughput"] for x in results.get(("triton", c), [])]
        for server in ns.servers:
            thr = median(server, c, "throughput")
            if thr is None:
                continue
            unstable = any(not x["stable"] for x in results[(server, c)])
            mine = [x["throughput"] for x in results[(server, c)]]
            ratios = [a / b for a, b in zip(mine, base_rounds) if b]
            ratio = f"{statistics.median(ratios):.2f}x" if ratios else "-"
            lines.append(
                f"| {LABELS[server]} | {c} | {thr:,.0f}{' *' if unstable else ''} | {ratio} | "
                f"{median(server, c, 'latency_us') / 1000:.2f} | {median(server, c, 'cpu_us_per_request'):.0f} |"
            )
    lines += ["", "Every round:", ""]
    for (server, c), rs in sorted(results.items(), key=lambda kv: (kv[0][1], SERVERS.index(kv[0][0]))):
        lines.append(f"- {server} c={c}: " + ", ".join(f"{x['throughput']:,.0f}" for x in rs))
    lines += ["", f"Command: `python benchmarks/grpc_servers.py {' '.join(argv if argv is not None else sys.argv[1:])}`".rstrip()]
    ns.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What OpenTelemetry tracing and the redis response cache cost (issue 25), measured with perf_analyzer.

Configurations, each a `kernel serve` on the same add_sub model, measured in alternating rounds so
that drift on the shared box hits them alike:

* ``off``: tracing off, no cache (what every request pays when neither feature is on);
* ``otel-1000`` / ``otel-1``: ``--trace-config mode=opentelemetry``, level TIMESTAMPS, rate 1000 / 1,
  exporting to an OTLP/HTTP receiver started here (it reads and drops the exports);
* ``local-hits`` / ``redis-hits``: add_sub with ``response_cache { enable: true }`` under the local
  cache and under the redis cache (a redis-server started here); perf_analyzer sends the same
  inputs every time, so after the first request every request is a hit.

    .venv/bin/python benchmarks/trace_cache_cost.py                 # all, HTTP+gRPC, c=1 and 16
    .venv/bin/python benchmarks/trace_cache_cost.py --configs off --label before --rounds 2

Prints a markdown table per configuration, protocol and concurrency: infer/s, and the front
process's CPU time per request (user+system, all its threads, over the requests the server answered
during the point: a cost that other work on a shared box disturbs far less than throughput), the
median over rounds; with --json also writes the numbers. ``--root DIR`` serves from another checkout (e.g. a
``git worktree`` of the commit before a change, for a "before" figure) with this venv: the server
and its model workers import that checkout's code (PYTHONPATH; kernel/transports and
kernel/backends are linked to its transports/ and backends/ when missing).

    git worktree add /tmp/base <commit>
    .venv/bin/python benchmarks/trace_cache_cost.py --configs off --label "before " --root /tmp/base
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as harness  # noqa: E402  (benchmarks/run.py: server and perf_analyzer helpers)

CONFIGS = ("off", "otel-1000", "otel-1", "local-hits", "redis-hits")


class _Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    exports = 0

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        _Sink.exports += 1
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answered(port: int) -> int:
    """Requests the server has answered (success + fail over every model), from the statistics extension."""
    status, body = harness.http_get(f"http://127.0.0.1:{port}/v2/models/stats", timeout=5.0)
    if status != 200:
        return 0
    total = 0
    for s in json.loads(body)["model_stats"]:
        total += int(s["inference_stats"]["success"]["count"]) + int(s["inference_stats"]["fail"]["count"])
    return total


def flags_for(config: str, otlp_url: str, redis_port: int) -> list[str]:
    if config.startswith("otel-"):
        return ["--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
                "--trace-config", f"rate={config.split('-')[1]}", "--trace-config", f"opentelemetry,url={otlp_url}"]
    if config == "local-hits":
        return ["--cache-config", "local,size=1048576"]
    if config == "redis-hits":
        return ["--cache-config", "redis,host=127.0.0.1", "--cache-config", f"redis,port={redis_port}"]
    return []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    ap.add_argument("--label", default="", help="prefix for the configuration names in the table")
    ap.add_argument("--protocol", choices=["http", "grpc", "both"], default="both")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--duration-ms", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--ports", type=int, nargs=3, default=[19300, 19301, 19302])
    ap.add_argument("--json", help="also write the numbers here")
    ap.add_argument("--root", help="serve this checkout's code instead of this one's")
    args = ap.parse_args(argv)
    # what benchmarks/run.py's helpers read
    args.allow_unstable, args.stability_percentage, args.max_trials = True, 20.0, 4
    args.kernel_label, args.model, args.kernel_start_timeout = "Kernel", "add_sub", 90.0
    protocols = ["http", "grpc"] if args.protocol == "both" else [args.protocol]

    work = Path(tempfile.mkdtemp(prefix="kernel-trace-cache-"))
    plain = work / "plain"
    cached = work / "cached"
    shutil.copytree(HERE / "model_repo" / "add_sub", plain / "add_sub")
    shutil.copytree(HERE / "model_repo" / "add_sub", cached / "add_sub")
    config = cached / "add_sub" / "config.pbtxt"
    config.write_text(config.read_text() + "\nresponse_cache { enable: true }\n")

    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    otlp_url = f"http://127.0.0.1:{sink.server_address[1]}/v1/traces"
    redis = None
    redis_port = _free_port()
    if "redis-hits" in args.configs:
        binary = shutil.which("redis-server")
        if binary is None:
            print("redis-hits needs redis-server (apt-get install redis-server)", file=sys.stderr)
            return 2
        redis = subprocess.Popen([binary, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--dir", str(work)], stdout=subprocess.DEVNULL)
        time.sleep(0.5)

    prefix = ""
    if args.root:
        root = Path(args.root).resolve()
        for name in ("transports", "backends"):  # the layout the wheel installs (package-dir)
            link = root / "kernel" / name
            if not link.exists():
                link.symlink_to(Path("..") / name)
        prefix = f"cd {shlex.quote(str(root))} && PYTHONPATH={shlex.quote(str(root))} "
    results: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    try:
        for rnd in range(1, args.rounds + 1):
            for cfg in args.configs:
                repo = cached if cfg.endswith("-hits") else plain
                extra = " ".join(flags_for(cfg, otlp_url, redis_port))
                args.kernel_cmd = prefix + (
                    "exec {python} -m kernel serve --model-repository {repo} --http-port {http_port} "
                    "--grpc-port {grpc_port} --metrics-port {metrics_port} " + extra)
                out = work / f"{cfg}-r{rnd}"
                out.mkdir()
                srv, _ = harness.start_kernel(args, repo, args.ports, out)
                try:
                    for protocol in protocols:
                        for c in args.concurrency:
                            cpu0, done0 = harness.cpu_seconds(srv.main_pid), _answered(srv.http_port)
                            pt = harness.run_perf_analyzer(srv, protocol, c, args, out, rnd)
                            cpu1, done1 = harness.cpu_seconds(srv.main_pid), _answered(srv.http_port)
                            key = f"{args.label}{cfg} {protocol} c={c}"
                            value = pt.infer_per_s if not pt.error else float("nan")
                            us = (cpu1 - cpu0) / max(1, done1 - done0) * 1e6
                            results.setdefault(key, []).append(value)
                            cpu.setdefault(key, []).append(us)
                            print(f"round {rnd} {key}: {value:,.0f} infer/s, front CPU {us:,.0f} us/request",
                                  file=sys.stderr, flush=True)
                finally:
                    srv.stop()
    finally:
        sink.shutdown()
        if redis is not None:
            redis.kill()
            redis.wait()
        shutil.rmtree(work, ignore_errors=True)

    print("| configuration | infer/s (median) | front CPU us/request (median) | rounds: infer/s; us |")
    print("| --- | ---: | ---: | --- |")
    for key, values in results.items():
        print(f"| {key} | {statistics.median(values):,.0f} | {statistics.median(cpu[key]):,.0f} | "
              f"{', '.join(f'{v:,.0f}' for v in values)}; {', '.join(f'{v:,.0f}' for v in cpu[key])} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"infer_per_s": results, "front_cpu_us_per_request": cpu}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

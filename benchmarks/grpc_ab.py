"""A/B of Kernel's gRPC transport: two trees' `transports/` folders, everything else the same.

Why: the tree is shared with engineers changing the backend and the HTTP front at the same time;
to measure a change to `transports/grpc/` alone, both sides run the working tree's `kernel` and
`backends` and differ only in where `kernel.transports` is imported from (the editable install's
finder is pointed at the other folder before `kernel serve` starts). Rounds alternate A, B, A, B
(optionally real Triton too) and report per-round throughput, p50 and the front's CPU per request
(utime+stime of the front process from /proc/PID/stat over the requests it served).

    .venv/bin/python benchmarks/grpc_ab.py --a /tmp/before-grpc/transports --b transports \
        --shape INPUT0:4194304 --concurrency 2 --rounds 3 [--triton]

`--side LABEL=DIR[,FLAG...]` (repeatable) names the sides instead of --a/--b, each with `kernel
serve` flags of its own: the same tree with a flag off and on, e.g.
`--side off=/tmp/before/transports --side high=transports,--grpc-infer-response-compression-level=high`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import peers  # noqa: E402
import run as harness  # noqa: E402  (proc stat, statistics readers)

LAUNCH = (
    "import sys, runpy\n"
    "import __editable___kernel_inference_server_0_1_0_finder as f\n"
    "f.MAPPING['kernel.transports'] = sys.argv.pop(1)\n"
    "sys.argv[0] = 'kernel'\n"
    "runpy.run_module('kernel', run_name='__main__', alter_sys=True)\n"
)


def group_cpu_s(pgid: int) -> float:
    """CPU seconds of every process in the server's process group (front + model workers/stubs)."""
    total = 0.0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = harness.proc_stat(int(d.name))
            except OSError:
                continue
            if int(fields[2]) == pgid:
                total += (int(fields[11]) + int(fields[12])) / harness.TICK
    return total


def infer_count(http: int, model: str) -> int:
    try:
        return harness.model_counts(http, model)[0]
    except harness.BenchError:
        return 0


def start(side: str, repo: Path, ports: list[int], log: Path, flags: tuple = ()):
    if side == "triton":
        cmd = peers.tritonserver_cmd(repo, *ports)
        p = subprocess.Popen(cmd, cwd="/tmp", env=peers.env(), stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    else:
        cmd = [str(ROOT / ".venv/bin/python"), "-c", LAUNCH, str(Path(side).resolve()), "serve",
               "--model-repository", str(repo), "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
               "--metrics-port", str(ports[2]), *flags]
        p = subprocess.Popen(cmd, cwd=str(ROOT), stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    t0 = time.monotonic()
    while harness.http_get(f"http://127.0.0.1:{ports[0]}/v2/health/ready")[0] != 200:
        if p.poll() is not None or time.monotonic() - t0 > 60:
            stop(p)
            raise SystemExit(f"{side} did not start; see {log}")
        time.sleep(0.05)
    return p


def stop(p) -> None:
    try:
        os.killpg(p.pid, 15)
        p.wait(10)
    except Exception:  # noqa: BLE001
        try:
            os.killpg(p.pid, 9)
        except Exception:  # noqa: BLE001
            pass


def measure(side: str, args, ports: list[int], log: Path, flags: tuple = ()) -> dict:
    p = start(side, args.repo, ports, log, flags)
    try:
        with tempfile.TemporaryDirectory() as td:
            csv = Path(td) / "pa.csv"
            cmd = [*peers.perf_cmd(), "-m", args.model, "-u", f"localhost:{ports[1]}", "-i", "grpc",
                   "--concurrency-range", f"{args.concurrency}:{args.concurrency}",
                   "--measurement-interval", str(args.duration_ms), "--stability-percentage", "1000",
                   "--max-trials", "3", "-f", str(csv)]
            if args.shape:
                cmd += ["--shape", args.shape]
            if args.input_data:
                cmd += ["--input-data", args.input_data]
            n0, c0, g0 = infer_count(ports[0], args.model), harness.cpu_seconds(p.pid), group_cpu_s(p.pid)
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            out = subprocess.run(cmd, env=peers.env(), capture_output=True, text=True, timeout=300)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            c1, g1, n1 = harness.cpu_seconds(p.pid), group_cpu_s(p.pid), infer_count(ports[0], args.model)
            if out.returncode != 0 or not csv.exists():
                return {"side": side, "error": out.stdout[-800:] + out.stderr[-800:]}
            lines = csv.read_text().splitlines()
            head, row = lines[0].split(","), lines[1].split(",")
            d = dict(zip(head, row))
            reqs = max(n1 - n0, 1)
            return {"side": side, "infer_s": float(d["Inferences/Second"]), "p50_us": float(d["p50 latency"]),
                    "cpu_us_per_req": (c1 - c0) * 1e6 / reqs, "requests": reqs,
                    "server_cpu_us_per_req": (g1 - g0) * 1e6 / reqs,
                    "client_cpu_us_per_req": (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1e6 / reqs,
                    "command": shlex.join(["perf_analyzer", *cmd[1:]])}
    finally:
        stop(p)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", default="/tmp/before-grpc/transports")
    ap.add_argument("--b", default=str(ROOT / "transports"))
    ap.add_argument("--triton", action="store_true")
    ap.add_argument("--repo", type=Path, default=ROOT / "benchmarks/model_repo_suite")
    ap.add_argument("--model", default="identity_fp32")
    ap.add_argument("--shape", default="INPUT0:4194304")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--duration-ms", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=29110)
    ap.add_argument("--out", type=Path, default=Path("/tmp/grpc_ab.json"))
    ap.add_argument("--input-data", default="", help="perf_analyzer's --input-data (random, zero, a file)")
    ap.add_argument("--side", action="append", default=[], metavar="LABEL=DIR[,FLAG...]",
                    help="a side with its own transports folder and kernel serve flags (instead of --a/--b)")
    args = ap.parse_args()
    sides = (["triton"] if args.triton else []) + ([] if args.side else [args.a, args.b])
    flags_of: dict[str, tuple] = {}
    folder_of: dict[str, str] = {}
    for spec in args.side:
        label, _, rest = spec.partition("=")
        folder, *flags = rest.split(",")
        sides.append(label)
        folder_of[label], flags_of[label] = folder, tuple(flags)
    ports = [args.port, args.port + 1, args.port + 2]
    results = []
    for rnd in range(args.rounds):
        for side in sides:
            r = measure(folder_of.get(side, side), args, ports, Path(f"/tmp/grpc_ab_{len(results)}.log"),
                        flags_of.get(side, ()))
            r["side"] = side
            r["round"] = rnd
            r["load"] = os.getloadavg()[0]
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "command"}), flush=True)
    print("medians:")
    for side in sides:
        rs = [r for r in results if r["side"] == side and "error" not in r]
        if rs:
            print(f"  {side}: infer/s {statistics.median(r['infer_s'] for r in rs):.1f}  "
                  f"p50 {statistics.median(r['p50_us'] for r in rs):.0f} us  "
                  f"front CPU/req {statistics.median(r['cpu_us_per_req'] for r in rs):.0f} us  "
                  f"server (front+workers) {statistics.median(r['server_cpu_us_per_req'] for r in rs):.0f} us  "
                  f"client {statistics.median(r['client_cpu_us_per_req'] for r in rs):.0f} us  (n={len(rs)})")
    args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A/B of two whole Kernel trees (e.g. a worktree before a Python-backend change and one after).

Why: the backend's code runs in two processes (the front and each model worker), and the editable
install maps `kernel.*` to the shared working tree, which other engineers change at the same
time. Each side here runs with a `sitecustomize` (on PYTHONPATH, so worker processes get it too)
that points the editable finder at that side's tree. Rounds alternate A, B, A, B; each reports
perf_analyzer's throughput and p50 plus the CPU per request of the front and of its workers
(utime+stime from /proc/PID/stat over the requests the server counted).

    .venv/bin/python benchmarks/backend_ab.py --a /tmp/before-worker --b /tmp/after-worker \
        --model identity_fp32 --shape INPUT0:4194304 --protocol http --concurrency 2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import peers  # noqa: E402
import run as harness  # noqa: E402  (proc stat)

SITECUSTOMIZE = (
    "import os\n"
    "tree = os.environ.get('KERNEL_AB_TREE')\n"
    "if tree:\n"
    "    import __editable___kernel_inference_server_0_1_0_finder as f\n"
    "    f.MAPPING.update({'kernel': tree + '/kernel', 'kernel.backends': tree + '/backends',\n"
    "                      'kernel.transports': tree + '/transports',\n"
    "                      'triton_python_backend_utils': tree + '/triton_python_backend_utils'})\n"
)


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def served(port: int, model: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats", timeout=5) as r:
        doc = json.load(r)
    return sum(s["inference_stats"]["success"]["count"] for s in doc["model_stats"])


def one_round(tree: str, args, ports, site_dir: str) -> dict:
    env = dict(os.environ, KERNEL_AB_TREE=tree, PYTHONPATH=site_dir)
    log = open(Path(tempfile.gettempdir()) / f"backend_ab_{Path(tree).name}.log", "wb")
    cmd = [str(ROOT / ".venv/bin/python"), "-m", "kernel", "serve", "--model-repository", args.repo,
           "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/v2/health/ready", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"{tree}: server did not start")
                time.sleep(0.2)
        pids = [proc.pid] + children(proc.pid)
        port = ports[0] if args.protocol == "http" else ports[1]
        pa = [*peers.perf_cmd(), "-m", args.model, "-u", f"localhost:{port}", "-i", args.protocol,
              "--concurrency-range", f"{args.concurrency}:{args.concurrency}",
              "--measurement-interval", str(args.duration_ms), "--stability-percentage", "1000",
              "--max-trials", "3", *sum((["--shape", s] for s in args.shape), [])]
        with tempfile.TemporaryDirectory() as td:
            csv = Path(td) / "pa.csv"
            n0, c0 = served(ports[0], args.model), [harness.cpu_seconds(p) for p in pids]
            subprocess.run([*pa, "-f", str(csv)], check=True, capture_output=True, timeout=300, env=peers.env())
            n1, c1 = served(ports[0], args.model), [harness.cpu_seconds(p) for p in pids]
            rows = csv.read_text().splitlines()
        head, vals = rows[0].split(","), rows[1].split(",")
        row = dict(zip(head, vals))
        n = max(1, n1 - n0)
        return {"infer_s": float(row["Inferences/Second"]), "p50_us": float(row["p50 latency"]),
                "front_us": (c1[0] - c0[0]) / n * 1e6, "workers_us": sum(b - a for a, b in zip(c0[1:], c1[1:])) / n * 1e6,
                "load": os.getloadavg()[0]}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--repo", default=str(ROOT / "benchmarks" / "model_repo_suite"))
    ap.add_argument("--model", default="identity_fp32")
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--protocol", default="http")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration-ms", type=int, default=4000)
    ap.add_argument("--ports", default="29300,29301,29302")
    args = ap.parse_args()
    ports = [int(p) for p in args.ports.split(",")]
    site_dir = tempfile.mkdtemp(prefix="backend_ab_site_")
    Path(site_dir, "sitecustomize.py").write_text(SITECUSTOMIZE)
    results: dict[str, list] = {"A": [], "B": []}
    for rnd in range(args.rounds):
        for side, tree in (("A", args.a), ("B", args.b)):
            r = one_round(tree, args, ports, site_dir)
            results[side].append(r)
            print(f"round {rnd + 1} {side}: {r['infer_s']:.1f} infer/s, p50 {r['p50_us']:.0f} us, "
                  f"front {r['front_us']:.0f} us/req, workers {r['workers_us']:.0f} us/req, load {r['load']:.1f}",
                  flush=True)
    for side in ("A", "B"):
        rs = results[side]
        med = {k: statistics.median(r[k] for r in rs) for k in ("infer_s", "p50_us", "front_us", "workers_us")}
        print(f"median {side}: {med['infer_s']:.1f} infer/s, p50 {med['p50_us']:.0f} us, front {med['front_us']:.0f} "
              f"us/req, workers {med['workers_us']:.0f} us/req")


if __name__ == "__main__":
    main()

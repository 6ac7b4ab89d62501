"""Bound Python callables: Kernel's PyTriton-compatible API vs real PyTriton 0.7, with real Triton as the anchor.

Three servers, one at a time, each measured with perf_analyzer on the same add_sub model:

* Triton  - real Triton's Python backend on benchmarks/model_repo (the anchor of every ratio),
* Kernel  - benchmarks/bound_add_sub.py --api kernel  (the callable runs inside Kernel's process),
* PyTriton - benchmarks/bound_add_sub.py --api pytriton, run by real PyTriton 0.7 from benchmarks/peers.py's venv
  (with LD_LIBRARY_PATH set to that interpreter's libpython folder, see ../shared/DESIGN.md).

Writes OUT/bound_callables.md and OUT/bound_callables.json (default OUT: benchmarks/results).

    .venv/bin/python benchmarks/bound_callables.py --protocol both --concurrency 1 16
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import peers  # benchmarks/peers.py: real Triton, PyTriton and perf_analyzer from PyPI
import run as bench  # benchmarks/run.py: start/stop servers, perf_analyzer, rounds

HERE = Path(__file__).resolve().parent
ANCHORS_PY = peers.venv_python()
PROGRAM = HERE / "bound_add_sub.py"


def pytriton_command() -> str:
    libdir = subprocess.run(
        [str(ANCHORS_PY), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    # cd {out}: outside the project root, so nothing there shadows PyTriton's own modules.
    return (f"cd {{out}} && LD_LIBRARY_PATH={shlex.quote(libdir)} exec {shlex.quote(str(ANCHORS_PY))} "
            f"{shlex.quote(str(PROGRAM))} --api pytriton "
            "--http-port {http_port} --grpc-port {grpc_port} --metrics-port {metrics_port}")


def kernel_command() -> str:
    return (f"exec {{python}} {shlex.quote(str(PROGRAM))} --api kernel "
            "--http-port {http_port} --grpc-port {grpc_port} --metrics-port {metrics_port}")


def wait_model_ready(srv, timeout: float = 90.0) -> None:
    """PyTriton reports the server ready before it has loaded the bound models: wait for the model too."""
    deadline = time.monotonic() + timeout
    t0 = time.monotonic()
    while bench.http_get(f"http://127.0.0.1:{srv.http_port}/v2/models/add_sub/ready")[0] != 200:
        if time.monotonic() > deadline:
            srv.stop()
            raise bench.BenchError(f"{srv.label}: model add_sub not ready within {timeout:.0f} s")
        time.sleep(0.1)
    srv.startup_s += time.monotonic() - t0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python benchmarks/bound_callables.py", description=__doc__.splitlines()[0])
    ap.add_argument("--protocol", choices=["http", "grpc", "both"], default="both")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--duration-ms", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--skip", choices=["triton", "kernel", "pytriton"], nargs="*", default=[])
    ap.add_argument("--triton-ports", type=int, nargs=3, default=[18000, 18001, 18002])
    ap.add_argument("--ports", type=int, nargs=3, default=[19000, 19001, 19002], help="Kernel's and PyTriton's")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    protocols = ["http", "grpc"] if args.protocol == "both" else [args.protocol]
    # The settings run.py's helpers read.
    perf = SimpleNamespace(model="add_sub", concurrency=args.concurrency, duration_ms=args.duration_ms,
                           stability_percentage=20.0, max_trials=6, allow_unstable=True, rounds=args.rounds,
                           kernel_start_timeout=90.0)
    sides = [(label, cmd) for label, cmd in (("Kernel", kernel_command()), ("PyTriton", pytriton_command()))
             if label.lower() not in args.skip]
    runs: dict[str, list] = {"Triton": []} | {label: [] for label, _ in sides}
    peers.ensure()
    ports = args.ports
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    try:
        for rnd in range(1, args.rounds + 1):
            if "triton" not in args.skip:
                srv = bench.start_triton(HERE / "model_repo", args.triton_ports, out)
                try:
                    runs["Triton"].append(bench.measure(srv, perf, out, protocols, rnd))
                finally:
                    srv.stop()
            for label, cmd in sides:
                side = SimpleNamespace(**vars(perf), kernel_cmd=cmd, kernel_label=label)
                srv, _ = bench.start_kernel(side, HERE / "model_repo", ports, out)
                wait_model_ready(srv)
                print(f"  {label} ready (model loaded) in {srv.startup_s:.1f} s", file=sys.stderr)
                try:
                    runs[label].append(bench.measure(srv, side, out, protocols, rnd))
                finally:
                    srv.stop()
    except bench.BenchError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    points = {label: {(p.protocol, p.concurrency): p for p in bench.combine_rounds(r)} for label, r in runs.items() if r}
    labels = list(points)
    head = "| protocol | concurrency | " + " | ".join(f"{l} infer/s" for l in labels)
    head += "".join(f" | {l}/Triton" for l in labels if l != "Triton") + " |"
    lines = [head, "| --- | ---: |" + " ---: |" * (len(labels) * 2 - 1)]
    for proto in protocols:
        for c in args.concurrency:
            vals = [points[l].get((proto, c)) for l in labels]
            cells = [f"{v.infer_per_s:,.0f}" if v and v.infer_per_s else "error" for v in vals]
            base = points.get("Triton", {}).get((proto, c))
            for l, v in zip(labels, vals):
                if l != "Triton":
                    ok = base and base.infer_per_s and v and v.infer_per_s
                    cells.append(f"{v.infer_per_s / base.infer_per_s:.2f}x" if ok else "-")
            lines.append(f"| {proto.upper()} | {c} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    (out / "bound_callables.md").write_text(
        f"# Bound callables: Kernel vs PyTriton 0.7 (real Triton's Python backend as anchor)\n\n"
        f"{started}, `{' '.join(['python benchmarks/bound_callables.py', *sys.argv[1:]])}`, perf_analyzer "
        f"{args.duration_ms} ms windows, model add_sub (FP32 [4] x2, no batching, one instance).\n\n{table}\n"
    )
    (out / "bound_callables.json").write_text(json.dumps(
        {"started": started, "points": {l: [vars(p) for p in pts.values()] for l, pts in points.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

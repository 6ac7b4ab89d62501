"""Throughput read from the server's own statistics while perf_analyzer keeps it loaded.

Why this exists: on this box perf_analyzer 2.50's HTTP client at concurrency 64 never reports a
window against real Triton 2.51 on the batched add_sub (suite scenario `batched_http_c64`: killed
after 180 s in each of 3 rounds on 2026-11-24, while Triton's statistics showed it answering
~8,700 infer/s the whole time). The same perf_analyzer finishes against Kernel. To still compare the
two, this script leaves perf_analyzer running as the load and measures what each server *completed*:
the statistics extension's `inference_count` (and `execution_count`, for the average batch) read
twice, `--seconds` apart, after a warm-up. Servers alternate over rounds as in suite.py.

    .venv/bin/python benchmarks/server_rate.py                  # add_sub_batched, HTTP, c=64, 3 rounds

Writes results/server_rate.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peers  # noqa: E402
import run as harness  # noqa: E402

REPO = HERE / "model_repo_suite"


def measure(side: str, args, out: Path) -> dict:
    if side == "Triton":
        srv = harness.start_triton(REPO, args.triton_ports, out)
    else:
        ns = SimpleNamespace(kernel_cmd=None, kernel_label="Kernel", kernel_start_timeout=60.0)
        srv = harness.start_kernel(ns, REPO, args.kernel_ports, out)[0]
    load = None
    try:
        while not harness.http_get(f"http://127.0.0.1:{srv.http_port}/v2/models/{args.model}/ready")[0] == 200:
            time.sleep(0.05)
        cmd = [*peers.perf_cmd(), "-m", args.model, "-u", f"localhost:{srv.port(args.protocol)}", "-i", args.protocol,
               "--concurrency-range", f"{args.concurrency}:{args.concurrency}", "--measurement-interval", "60000"]
        load = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=peers.env(),
                                start_new_session=True)
        time.sleep(args.warmup)
        i0, e0 = harness.model_counts(srv.http_port, args.model)
        t0 = time.monotonic()
        time.sleep(args.seconds)
        i1, e1 = harness.model_counts(srv.http_port, args.model)
        dt = time.monotonic() - t0
        rate = (i1 - i0) / dt
        batch = (i1 - i0) / max(1, e1 - e0)
        print(f"  {side}: {rate:,.0f} infer/s, average batch {batch:.1f}", file=sys.stderr, flush=True)
        return {"server": side, "infer_per_s": round(rate, 1), "avg_batch": round(batch, 2),
                "loadavg_1m": round(os.getloadavg()[0], 2)}
    finally:
        if load is not None:
            harness.kill_group(load.pid, load.pid, grace=2.0)
        srv.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/server_rate.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="add_sub_batched")
    ap.add_argument("--protocol", choices=["http", "grpc"], default="http")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds of load before the first reading")
    ap.add_argument("--seconds", type=float, default=15.0, help="seconds between the two readings")
    ap.add_argument("--triton-ports", type=int, nargs=3, default=[28100, 28101, 28102])
    ap.add_argument("--kernel-ports", type=int, nargs=3, default=[28200, 28201, 28202])
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    logs = out / "server_rate"
    logs.mkdir(parents=True, exist_ok=True)
    peers.ensure()
    rows = []
    for rnd in range(1, args.rounds + 1):
        for side in (["Triton", "Kernel"] if rnd % 2 else ["Kernel", "Triton"]):
            print(f"[round {rnd}/{args.rounds}] {side}", file=sys.stderr, flush=True)
            rows.append({"round": rnd, **measure(side, args, logs)})
    med = {s: statistics.median(r["infer_per_s"] for r in rows if r["server"] == s) for s in ("Triton", "Kernel")}
    ratios = [k["infer_per_s"] / t["infer_per_s"] for k, t in
              ((next(r for r in rows if r["round"] == n and r["server"] == "Kernel"),
                next(r for r in rows if r["round"] == n and r["server"] == "Triton")) for n in range(1, args.rounds + 1))]
    title = f"{args.model} {args.protocol.upper()} c={args.concurrency}"
    md = [f"# Server-side throughput: {title} ({time.strftime('%Y-%m-%d %H:%M %Z')})", "",
          "| round | server | infer/s (statistics extension) | average batch | 1-min load |", "| ---: | --- | ---: | ---: | ---: |"]
    md += [f"| {r['round']} | {r['server']} | {r['infer_per_s']:,.0f} | {r['avg_batch']:.1f} | {r['loadavg_1m']} |" for r in rows]
    md += ["", f"Median: Triton {med['Triton']:,.0f}, Kernel {med['Kernel']:,.0f} infer/s: Kernel/Triton "
           f"**{med['Kernel'] / med['Triton']:.2f}×** (rounds {min(ratios):.2f}–{max(ratios):.2f}×).", "",
           f"Command: `python benchmarks/server_rate.py {' '.join(argv if argv is not None else sys.argv[1:])}`. "
           f"Load: perf_analyzer `--concurrency-range {args.concurrency}:{args.concurrency}` on `{REPO.name}`; "
           f"rate = completed inferences between two readings {args.seconds:g} s apart after {args.warmup:g} s of load."]
    (out / "server_rate.md").write_text("\n".join(md) + "\n")
    (out / "server_rate.json").write_text(json.dumps({"title": title, "rows": rows, "median": med,
                                                      "ratio_rounds": ratios}, indent=1) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())

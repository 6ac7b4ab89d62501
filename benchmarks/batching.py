"""Dynamic batching: Kernel vs real Triton on the same batching model repository.

The repository is benchmarks/model_repo_batching/: add_sub with max_batch_size 64 and
`dynamic_batching { max_queue_delay_microseconds: 100 }`, one CPU instance. perf_analyzer sends
batch-1 requests at concurrency 64, so every server-side batch is formed by the dynamic batcher.
Besides throughput and latency, the table shows the average batch size each server formed,
read from the statistics extension (inference_count / execution_count over the measurement).

Servers and perf_analyzer are driven by the same helpers as benchmarks/run.py (one server at a
time; Triton and Kernel alternate when --rounds > 1 and each side reports its median round).

    .venv/bin/python benchmarks/batching.py                       # HTTP, c=64, 5 s windows, 2 rounds
    .venv/bin/python benchmarks/batching.py --protocol both --rounds 3
    # several front processes batching one model (their Gather round), 2 ms queue delay:
    .venv/bin/python benchmarks/batching.py --queue-delay-us 2000 --kernel-arg=--front-processes \
        --kernel-arg=2 --name batching_two_fronts

Writes results/<name>.md and results/<name>.json (name: batching by default); raw perf_analyzer
output and server logs go to results/<name>/*.log. --queue-delay-us gives both servers a copy of
the repository with that max_queue_delay_microseconds.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as harness  # noqa: E402  (benchmarks/run.py: server and perf_analyzer helpers)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python benchmarks/batching.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", choices=["http", "grpc", "both"], default="http")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64])
    ap.add_argument("--duration-ms", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repo", default=str(HERE / "model_repo_batching"))
    ap.add_argument("--model", default="add_sub")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--stability-percentage", type=float, default=20.0)
    ap.add_argument("--max-trials", type=int, default=6)
    ap.add_argument("--triton-ports", type=int, nargs=3, default=[18000, 18001, 18002])
    ap.add_argument("--kernel-ports", type=int, nargs=3, default=[19000, 19001, 19002])
    ap.add_argument("--kernel-start-timeout", type=float, default=60.0)
    ap.add_argument("--queue-delay-us", type=int, default=None,
                    help="max_queue_delay_microseconds for both servers (a copy of --repo with it changed)")
    ap.add_argument("--kernel-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for `kernel serve` (repeatable; e.g. --kernel-arg=--front-processes "
                         "--kernel-arg=2)")
    ap.add_argument("--name", default="batching", help="results/<name>.md, .json and the logs' folder")
    args = ap.parse_args(argv)
    # what benchmarks/run.py's helpers read
    args.allow_unstable = True
    args.kernel_cmd = None
    args.kernel_label = "Kernel"
    args.kernel_args = args.kernel_arg  # what benchmarks/run.py's kernel_command adds
    return args


_QUEUE_DELAY = re.compile(r"max_queue_delay_microseconds:\s*(\d+)")


def with_queue_delay(repo: Path, delay_us: int, into: Path) -> Path:
    """A copy of `repo` under `into` whose every config.pbtxt has max_queue_delay_microseconds `delay_us`."""
    copy = into / repo.name
    shutil.copytree(repo, copy)
    for config in copy.glob("*/config.pbtxt"):
        text = config.read_text()
        changed = _QUEUE_DELAY.sub(f"max_queue_delay_microseconds: {delay_us}", text)
        if changed == text:
            raise SystemExit(f"{config}: no max_queue_delay_microseconds to change")
        config.write_text(changed)
    return copy


def queue_delay_of(repo: Path, model: str) -> str:
    found = _QUEUE_DELAY.search((repo / model / "config.pbtxt").read_text())
    return found.group(1) if found else "0"


def model_counts(srv, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) from the statistics extension."""
    try:
        return harness.model_counts(srv.http_port, model)
    except harness.BenchError:
        return 0, 0


def run_perf(srv, protocol: str, concurrency: int, args, out: Path, rnd: int):
    """perf_analyzer once with the stability check; if that fails for any reason (perf_analyzer
    cannot stabilise, or hangs past its time limit, as it can against Triton's HTTP endpoint at
    c=64 on this box), once more with the check off (average of 3 windows, marked unstable)."""
    pt = harness.Point(srv.label, protocol, concurrency, round=rnd, loadavg_1m=round(os.getloadavg()[0], 2))
    if not srv.alive() or not srv.ready():
        pt.error = f"{srv.label} is not running/ready"
        return pt
    side = "triton" if srv.label == "Triton" else "kernel"
    log_path = out / f"perf_{side}_{protocol}_c{concurrency}_r{rnd}.log"
    attempts = [(args.stability_percentage, args.max_trials, True), (1000, 3, False)]
    with open(log_path, "w") as logf:
        for stability, trials, stable in attempts:
            with tempfile.TemporaryDirectory() as td:
                csv_path = Path(td) / "pa.csv"
                cmd = [
                    *harness.peers.perf_cmd(), "-m", args.model, "-u", f"localhost:{srv.port(protocol)}",
                    "-i", protocol, "--concurrency-range", f"{concurrency}:{concurrency}",
                    "--measurement-interval", str(args.duration_ms), "--stability-percentage", str(stability),
                    "--max-trials", str(trials), "-f", str(csv_path),
                ]  # fmt: skip
                pt.command = shlex.join(["perf_analyzer", *cmd[1:]]).replace(str(csv_path), "OUT.csv")
                timeout = args.duration_ms / 1000.0 * (trials + 2) * 3 + 60
                t0 = time.monotonic()
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True, env=harness.peers.env())
                try:
                    stdout, _ = proc.communicate(timeout=timeout)
                except subprocess.TimeoutExpired:
                    harness.kill_group(proc.pid, proc.pid, grace=2.0)
                    stdout, _ = proc.communicate()
                    stdout += f"\n[benchmarks/batching.py] perf_analyzer killed after {timeout:.0f} s\n"
                pt.wall_s = round(time.monotonic() - t0, 1)
                logf.write(f"$ {shlex.join(cmd)}\n{stdout}\n[rc={proc.returncode}]\n\n")
                logf.flush()
                if proc.returncode == 0 and csv_path.exists():
                    try:
                        for k, v in harness.parse_perf_csv(csv_path.read_text()).items():
                            setattr(pt, k, v)
                        pt.stable, pt.error = stable, None
                        return pt
                    except (ValueError, KeyError) as e:
                        pt.error = f"cannot parse perf_analyzer CSV: {e}"
                        continue
                tail = "\n".join(stdout.strip().splitlines()[-4:])
                pt.error = f"perf_analyzer rc={proc.returncode}: {tail}"
    return pt


def measure(srv, args, out: Path, protocols, rnd: int) -> list:
    points = []
    for protocol in protocols:
        for c in args.concurrency:
            print(f"  {srv.label}: {protocol} c={c} ...", end="", file=sys.stderr, flush=True)
            before = model_counts(srv, args.model)
            pt = run_perf(srv, protocol, c, args, out, rnd)
            after = model_counts(srv, args.model)
            inferences, executions = after[0] - before[0], after[1] - before[1]
            pt.avg_batch = inferences / executions if executions > 0 else None
            if pt.error:
                print(f" FAILED ({pt.error.splitlines()[0]})", file=sys.stderr, flush=True)
            else:
                batch = f", avg batch {pt.avg_batch:.1f}" if pt.avg_batch else ""
                print(f" {pt.infer_per_s:,.0f} infer/s, p99 {pt.p99_ms:.2f} ms{batch}", file=sys.stderr, flush=True)
            points.append(pt)
    return points


def median_points(runs: list[list]) -> list:
    combined = harness.combine_rounds(runs)
    # combine_rounds rebuilds Points from their dataclass fields: carry avg_batch over by round.
    by_key = {(p.protocol, p.concurrency, p.round, p.infer_per_s): getattr(p, "avg_batch", None)
              for pts in runs for p in pts}
    for p in combined:
        p.avg_batch = by_key.get((p.protocol, p.concurrency, p.round, p.infer_per_s))
    return combined


def table(protocols, concurrencies, triton_pts, kernel_pts) -> tuple[str, list[dict]]:
    t = {(p.protocol, p.concurrency): p for p in triton_pts}
    k = {(p.protocol, p.concurrency): p for p in kernel_pts}
    lines = [
        "| protocol | concurrency | Triton infer/s | Kernel infer/s | Kernel/Triton | Triton avg batch "
        "| Kernel avg batch | Triton p50 ms | Kernel p50 ms | Triton p99 ms | Kernel p99 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows = []

    def cell(p, attr, spec):
        if p is None:
            return "-"
        if p.error:
            return "error"
        v = getattr(p, attr, None)
        s = harness.fmt(v, spec)
        return s + ("*" if attr == "infer_per_s" and p.stable is False else "")

    for proto in protocols:
        for c in concurrencies:
            tp, kp = t.get((proto, c)), k.get((proto, c))
            ratio = kp.infer_per_s / tp.infer_per_s if tp and kp and tp.infer_per_s and kp.infer_per_s else None
            rows.append({"protocol": proto, "concurrency": c, "ratio": ratio})
            lines.append(
                f"| {proto.upper()} | {c} | {cell(tp, 'infer_per_s', ',.0f')} | {cell(kp, 'infer_per_s', ',.0f')} | "
                f"{f'{ratio:.2f}x' if ratio else '-'} | {cell(tp, 'avg_batch', '.1f')} | {cell(kp, 'avg_batch', '.1f')} | "
                f"{cell(tp, 'p50_ms', '.2f')} | {cell(kp, 'p50_ms', '.2f')} | "
                f"{cell(tp, 'p99_ms', '.2f')} | {cell(kp, 'p99_ms', '.2f')} |"
            )
    return "\n".join(lines), rows


def main(argv=None) -> int:
    args = parse_args(argv)
    protocols = ["http", "grpc"] if args.protocol == "both" else [args.protocol]
    repo = Path(args.repo).resolve()
    if args.queue_delay_us is not None:
        copies = Path(tempfile.mkdtemp(prefix="kernel-batching-"))
        atexit.register(shutil.rmtree, copies, True)
        repo = with_queue_delay(repo, args.queue_delay_us, copies)
    results = Path(args.out).resolve()
    logs = results / args.name
    logs.mkdir(parents=True, exist_ok=True)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    command_line = shlex.join(["python", "benchmarks/batching.py", *(sys.argv[1:] if argv is None else argv)])
    servers = []
    kernel, kernel_cmds = harness.kernel_side(f"Kernel on {repo}", args, repo, logs)
    sides = [
        harness.Side(f"real Triton on {repo}", lambda: harness.start_triton(repo, args.triton_ports, logs)),
        kernel,
    ]
    (triton_runs, kernel_runs), rc, _ = harness.alternate_rounds(
        args.rounds, sides, lambda srv, rnd: measure(srv, args, logs, protocols, rnd), servers)
    kernel_cmd = kernel_cmds[-1] if kernel_cmds else ""
    if rc or not triton_runs or not kernel_runs:
        return rc or 2

    triton_pts = median_points(triton_runs)
    kernel_pts = median_points(kernel_runs)
    text, rows = table(protocols, args.concurrency, triton_pts, kernel_pts)
    print(text)
    ratios = ", ".join(f"{r['protocol'].upper()} c={r['concurrency']}: {r['ratio']:.2f}x" for r in rows if r["ratio"])
    # The box's load drifts between rounds: Kernel and Triton measured back to back in the same
    # round are the fairest pairs, so their per-round ratios are reported too.
    paired = []
    for proto in protocols:
        for c in args.concurrency:
            per_round = []
            for t_pts, k_pts in zip(triton_runs, kernel_runs):
                tp = next((p for p in t_pts if p.protocol == proto and p.concurrency == c), None)
                kp = next((p for p in k_pts if p.protocol == proto and p.concurrency == c), None)
                if tp and kp and tp.infer_per_s and kp.infer_per_s and not tp.error and not kp.error:
                    per_round.append(kp.infer_per_s / tp.infer_per_s)
            if per_round:
                median = sorted(per_round)[(len(per_round) - 1) // 2]
                paired.append(f"{proto.upper()} c={c}: " + ", ".join(f"{r:.2f}x" for r in per_round)
                              + f" (median {median:.2f}x)")
    md = [
        "# Dynamic batching: Kernel vs real Triton",
        "",
        f"Measured {started} on this box ({os.cpu_count()} CPUs, loopback) by `{command_line}`.",
        "",
        f"Model: `benchmarks/model_repo_batching/add_sub` (Python backend, `max_batch_size: 64`, "
        f"`dynamic_batching {{ max_queue_delay_microseconds: {queue_delay_of(repo, args.model)} }}`, one CPU "
        f"instance), the same files for both servers; Kernel started as `{kernel_cmd}`. perf_analyzer sends "
        "batch-1 requests; every batch is formed server-side. \"avg batch\" is "
        "inference_count / execution_count from each server's statistics extension over the measurement.",
        "",
        f"perf_analyzer `-m {args.model} --concurrency-range C:C --measurement-interval {args.duration_ms} "
        f"--stability-percentage {args.stability_percentage:g} --max-trials {args.max_trials}`; "
        f"{args.rounds} round(s), servers alternating, median round shown"
        + ("; `*` = perf_analyzer could not stabilise (or hung), so the point is the average of 3 windows "
           "measured with the stability check off." if any(p.stable is False for p in triton_pts + kernel_pts) else "."),
        f"Box load average (1 min) when the points started: "
        + ", ".join(f"{p.server} {p.protocol} {p.loadavg_1m}" for p in triton_pts + kernel_pts) + ".",
        "",
        text,
        "",
        f"**Kernel / Triton throughput (median rounds): {ratios}**",
        "",
        "Kernel / Triton within each round (the two servers measured back to back): " + "; ".join(paired),
        "",
        "Per-round throughput (infer/s): "
        + "; ".join(
            f"{p.server} {p.protocol} c={p.concurrency}: "
            + ", ".join(f"{v:,.0f}" if v else "n/a" for v in (p.rounds_infer_per_s or [p.infer_per_s]))
            for p in triton_pts + kernel_pts
        ),
        "",
    ]
    (results / f"{args.name}.md").write_text("\n".join(md))
    (results / f"{args.name}.json").write_text(json.dumps({
        "started": started,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "repo": str(repo),
        "settings": {k: getattr(args, k) for k in ("protocol", "concurrency", "duration_ms", "rounds",
                                                   "stability_percentage", "max_trials", "queue_delay_us",
                                                   "kernel_arg")},
        "kernel_command": kernel_cmd if kernel_runs else None,
        "rows": [{"protocol": r["protocol"], "concurrency": r["concurrency"], "ratio": r["ratio"]} for r in rows],
        "points": [
            {k: getattr(p, k, None) for k in ("server", "protocol", "concurrency", "infer_per_s", "p50_ms", "p90_ms",
                                               "p99_ms", "stable", "avg_batch", "rounds_infer_per_s", "loadavg_1m",
                                               "error", "command")}
            for p in triton_pts + kernel_pts
        ],
    }, indent=2))
    print(f"wrote {results / (args.name + '.md')}", file=sys.stderr)
    return 1 if any(p.error for p in triton_pts + kernel_pts) else 0


if __name__ == "__main__":
    sys.exit(main())

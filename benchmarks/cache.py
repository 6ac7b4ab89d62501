"""Response cache: Kernel vs real Triton, both with the local cache on, on the same add_sub model.

The repository is benchmarks/model_repo/add_sub copied into a temporary folder with
`response_cache { enable: true }` added (the files both servers load are the same). Both servers
run with `--cache-config local,size=<bytes>`; real Triton also needs `--cache-directory` (its local
cache is a shared library under the anchors' tritonserver). perf_analyzer sends the same input
tensors in every request, so after the first request every request is a cache hit: this measures
a cached request's path through each server (transport, lookup, response), not the model.

The table also shows how many requests each server answered from its cache during the
measurement (cache_hit count from the statistics extension), so a run where the cache did not
hit is visible.

    .venv/bin/python benchmarks/cache.py                      # HTTP and gRPC, c=1 and c=16, 1 round
    .venv/bin/python benchmarks/cache.py --protocol http --rounds 2

Writes results/cache.md and results/cache.json; server logs and raw perf_analyzer output go to
results/cache/*.log. Servers are started one at a time (the box has two cores) and stopped at
the end, on error and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as harness  # noqa: E402  (benchmarks/run.py: server and perf_analyzer helpers)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python benchmarks/cache.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", choices=["http", "grpc", "both"], default="both")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--duration-ms", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cache-bytes", type=int, default=1 << 20)
    ap.add_argument("--model-dir", default=str(HERE / "model_repo" / "add_sub"))
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--stability-percentage", type=float, default=20.0)
    ap.add_argument("--max-trials", type=int, default=6)
    ap.add_argument("--triton-ports", type=int, nargs=3, default=[18100, 18101, 18102])
    ap.add_argument("--kernel-ports", type=int, nargs=3, default=[19100, 19101, 19102])
    ap.add_argument("--kernel-start-timeout", type=float, default=60.0)
    args = ap.parse_args(argv)
    # what benchmarks/run.py's helpers read
    args.allow_unstable = True
    args.kernel_label = "Kernel"
    args.model = "add_sub"
    args.kernel_cmd = ("exec {python} -m kernel serve --model-repository {repo} --http-port {http_port} "
                       "--grpc-port {grpc_port} --metrics-port {metrics_port} "
                       f"--cache-config local,size={args.cache_bytes}")
    return args


def cached_repository(model_dir: Path, into: Path) -> Path:
    """A repository holding the add_sub model with the response cache enabled."""
    repo = into / "repo"
    shutil.copytree(model_dir, repo / "add_sub")
    config = repo / "add_sub" / "config.pbtxt"
    config.write_text(config.read_text() + "\nresponse_cache { enable: true }\n")
    return repo


def start_triton_cached(repo: Path, ports: list[int], out: Path, cache_bytes: int) -> harness.Server:
    """Real Triton with its local cache on (anchors.sh's `triton` command passes no extra flags)."""
    srv = harness.Server("Triton", *ports, log=out / "triton.log")
    harness.check_ports_free(*ports)
    script = (
        f'eval "$(bash {shlex.quote(str(harness.ANCHORS))} env)"; '
        'exec "$TRITON_HOME/bin/tritonserver" --backend-directory="$TRITON_HOME/backends" '
        '--cache-directory="$TRITON_HOME/caches" '
        f"--model-repository={shlex.quote(str(repo))} --cache-config=local,size={cache_bytes} "
        f"--http-port={ports[0]} --grpc-port={ports[1]} --metrics-port={ports[2]} --log-verbose=0"
    )
    # Not the project root: its triton_python_backend_utils/ (Kernel's shim) would shadow the real
    # one inside Triton's Python-backend stub.
    return harness.launch(srv, ["bash", "-c", script], out, None, 120.0,
                          lambda code: f"real Triton did not become ready\n{harness.log_tail(srv.log)}")


def cache_counts(srv, model: str) -> tuple[int, int, int]:
    """(cache hits, cache misses, executions) from the statistics extension."""
    url = f"http://127.0.0.1:{srv.http_port}/v2/models/{model}/stats"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            s = json.loads(r.read())["model_stats"][0]
        inf = s["inference_stats"]
        return int(inf["cache_hit"]["count"]), int(inf["cache_miss"]["count"]), int(s["execution_count"])
    except (OSError, ValueError, KeyError, IndexError):
        return 0, 0, 0


def measure(srv, args, out: Path, protocols, rnd: int) -> list:
    points = []
    for protocol in protocols:
        for c in args.concurrency:
            print(f"  {srv.label}: {protocol} c={c} ...", end="", file=sys.stderr, flush=True)
            before = cache_counts(srv, args.model)
            pt = harness.run_perf_analyzer(srv, protocol, c, args, out, rnd)
            after = cache_counts(srv, args.model)
            pt.hits, pt.misses, pt.executions = (a - b for a, b in zip(after, before))
            if pt.error:
                print(f" FAILED ({pt.error.splitlines()[0]})", file=sys.stderr, flush=True)
            else:
                print(f" {pt.infer_per_s:,.0f} infer/s, p99 {pt.p99_ms:.2f} ms, {pt.hits} hits, "
                      f"{pt.executions} executions", file=sys.stderr, flush=True)
            points.append(pt)
    return points


def main(argv=None) -> int:
    args = parse_args(argv)
    protocols = ["http", "grpc"] if args.protocol == "both" else [args.protocol]
    results = Path(args.out).resolve()
    logs = results / "cache"
    logs.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="kernel-cache-bench-"))
    repo = cached_repository(Path(args.model_dir), tmp)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    servers = []
    kernel, kernel_cmds = harness.kernel_side(f"Kernel (cache on) on {repo}", args, repo, logs)
    sides = [
        harness.Side(f"real Triton (cache on) on {repo}",
                     lambda: start_triton_cached(repo, args.triton_ports, logs, args.cache_bytes)),
        kernel,
    ]
    try:
        (triton_runs, kernel_runs), rc, _ = harness.alternate_rounds(
            args.rounds, sides, lambda srv, rnd: measure(srv, args, logs, protocols, rnd), servers)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    kernel_cmd = kernel_cmds[-1] if kernel_cmds else ""
    if rc or not triton_runs or not kernel_runs:
        return rc or 2

    extra = {(p.server, p.protocol, p.concurrency, p.round): (p.hits, p.executions)
             for pts in triton_runs + kernel_runs for p in pts}
    triton_pts = harness.combine_rounds(triton_runs)
    kernel_pts = harness.combine_rounds(kernel_runs)
    for p in triton_pts + kernel_pts:
        p.hits, p.executions = extra.get((p.server, p.protocol, p.concurrency, p.round), (None, None))
    t = {(p.protocol, p.concurrency): p for p in triton_pts}
    k = {(p.protocol, p.concurrency): p for p in kernel_pts}

    def cell(p, attr, spec):
        if p is None:
            return "-"
        if p.error:
            return "error"
        s = harness.fmt(getattr(p, attr, None), spec)
        return s + ("*" if attr == "infer_per_s" and p.stable is False else "")

    lines = [
        "| protocol | concurrency | Triton infer/s | Kernel infer/s | Kernel/Triton | Triton p50 ms | Kernel p50 ms "
        "| Triton p99 ms | Kernel p99 ms | Triton hits / executions | Kernel hits / executions |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows = []
    for proto in protocols:
        for c in args.concurrency:
            tp, kp = t.get((proto, c)), k.get((proto, c))
            ratio = kp.infer_per_s / tp.infer_per_s if tp and kp and tp.infer_per_s and kp.infer_per_s else None
            rows.append({"protocol": proto, "concurrency": c, "ratio": ratio})
            lines.append(
                f"| {proto.upper()} | {c} | {cell(tp, 'infer_per_s', ',.0f')} | {cell(kp, 'infer_per_s', ',.0f')} | "
                f"{f'{ratio:.2f}x' if ratio else '-'} | {cell(tp, 'p50_ms', '.2f')} | {cell(kp, 'p50_ms', '.2f')} | "
                f"{cell(tp, 'p99_ms', '.2f')} | {cell(kp, 'p99_ms', '.2f')} | "
                f"{tp.hits if tp else '-'} / {tp.executions if tp else '-'} | "
                f"{kp.hits if kp else '-'} / {kp.executions if kp else '-'} |"
            )
    text = "\n".join(lines)
    print(text)
    ratios = ", ".join(f"{r['protocol'].upper()} c={r['concurrency']}: {r['ratio']:.2f}x" for r in rows if r["ratio"])
    md = [
        "# Response cache: Kernel vs real Triton, both with the local cache on",
        "",
        f"Measured {started} on this box ({os.cpu_count()} CPUs, loopback) by `benchmarks/cache.py`.",
        "",
        "Model: `benchmarks/model_repo/add_sub` (Python backend, one CPU instance) with "
        "`response_cache { enable: true }`, the same files for both servers; both run with "
        f"`--cache-config local,size={args.cache_bytes}`. perf_analyzer sends the same tensors in every request, "
        "so every request after the first is answered from the cache: the model does not run. "
        "\"hits / executions\" are the cache_hit count and execution_count from each server's statistics "
        "extension over the measurement (perf_analyzer's warm-up requests included).",
        "",
        f"perf_analyzer `-m add_sub --concurrency-range C:C --measurement-interval {args.duration_ms} "
        f"--stability-percentage {args.stability_percentage:g} --max-trials {args.max_trials}`; "
        f"{args.rounds} round(s), servers alternating, median round shown"
        + ("; `*` = perf_analyzer could not stabilise, so the point is the average of 3 windows measured with "
           "the stability check off." if any(p.stable is False for p in triton_pts + kernel_pts) else "."),
        "Box load average (1 min) when the points started: "
        + ", ".join(f"{p.server} {p.protocol} c={p.concurrency} {p.loadavg_1m}" for p in triton_pts + kernel_pts)
        + ".",
        "",
        text,
        "",
        f"**Kernel / Triton throughput, cached requests: {ratios}**",
        "",
        f"Kernel command: `{kernel_cmd}`",
        "",
    ]
    (results / "cache.md").write_text("\n".join(md))
    (results / "cache.json").write_text(json.dumps({
        "started": started,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "settings": {k: getattr(args, k) for k in ("protocol", "concurrency", "duration_ms", "rounds", "cache_bytes",
                                                   "stability_percentage", "max_trials")},
        "kernel_command": kernel_cmd,
        "rows": rows,
        "points": [
            {k: getattr(p, k, None) for k in ("server", "protocol", "concurrency", "infer_per_s", "p50_ms", "p90_ms",
                                               "p99_ms", "stable", "hits", "executions", "rounds_infer_per_s",
                                               "loadavg_1m", "error", "command")}
            for p in triton_pts + kernel_pts
        ],
    }, indent=2))
    print(f"wrote {results / 'cache.md'}", file=sys.stderr)
    return 1 if any(p.error for p in triton_pts + kernel_pts) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Kernel with N front processes beside real Triton 2.51, in one run on one box (issue 32).

Servers, one at a time, each on the same repository (add_sub, add_sub_batched, repeat_int32 and
tiny_lm, each with --instances CPU instances, 8 by default): real Triton, then Kernel with
`--front-processes` 1, 8, auto, 4, 2 (measured in that order so a run cut short by its deadline
still has the ends; tables list them in order). On each:

| scenario | load |
| --- | --- |
| add_sub HTTP / gRPC, c=64 and c=256 | perf_analyzer |
| add_sub_batched (dynamic batcher, max 64, 100 µs) HTTP and gRPC c=64 | perf_analyzer |
| repeat_int32 decoupled gRPC stream c=64, 100 responses per request | perf_analyzer --streaming |
| tiny_lm c=64, 128-token answers | gen_load.py: Kernel's OpenAI route, Triton's generate_stream |

Every point gives infer/s and p50/p99 (perf_analyzer's own, 3 windows of --window-ms), the
completed rate the server itself counted, CPU µs per request per kind of process (fronts,
workers, supervisor; tritonserver and stubs; the load client), the cores each front used, the
connections each front holds, and the whole box's busy share. A load that stops making progress is
stopped within seconds and described (scale_run.py); the first gRPC stall is tried once more with
one connection per perf_analyzer context (TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT=1) to tell
"many streams on one connection" from "many requests".

    python benchmarks/scale.py                         # everything (about 6 minutes on 16 cores)
    python benchmarks/scale.py --dry-run               # short windows, 2 instances: checks the harness
    python benchmarks/scale.py --servers triton,1 --scenarios add_sub_grpc_c256

scripts/scale-check.sh runs it on a lent machine with what it carries (perf_analyzer, packed
Triton). Writes OUT/scale.json, OUT/scale.md; logs in OUT/logs/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import procs  # noqa: E402
import run as harness  # noqa: E402
import scale_run as sr  # noqa: E402

MODELS = ["add_sub", "add_sub_batched", "repeat_int32", "tiny_lm"]
REPEAT = ("--streaming", "--shape", "IN:100", "--shape", "DELAY:100", "--input-data", "zero")
SCENARIOS = [
    sr.Scenario("add_sub_http_c64", "add_sub HTTP c=64", "add_sub", "http", 64),
    sr.Scenario("add_sub_http_c256", "add_sub HTTP c=256", "add_sub", "http", 256),
    sr.Scenario("add_sub_grpc_c64", "add_sub gRPC c=64", "add_sub", "grpc", 64),
    sr.Scenario("add_sub_grpc_c256", "add_sub gRPC c=256", "add_sub", "grpc", 256),
    sr.Scenario("batched_http_c64", "add_sub_batched HTTP c=64", "add_sub_batched", "http", 64),
    sr.Scenario("batched_grpc_c64", "add_sub_batched gRPC c=64", "add_sub_batched", "grpc", 64),
    sr.Scenario("decoupled_grpc_c64", "repeat_int32 gRPC stream c=64 (100 responses/request)", "repeat_int32", "grpc",
                64, REPEAT, 100),
    sr.Scenario("tiny_lm_c64", "tiny_lm c=64 (Kernel OpenAI route, Triton generate_stream), tokens/s", "tiny_lm",
                "openai", 64),
]
BY_NAME = {s.name: s for s in SCENARIOS}
ORDER = ["triton", "1", "8", "auto", "4", "2"]
TRITON_PORTS = sr.Ports(28510, 28511, 28512, 0)
KERNEL_PORTS = sr.Ports(28500, 28501, 28502, 28503)


def say(msg: str) -> None:
    print(f"[scale] {msg}", file=sys.stderr, flush=True)


def label(server: str) -> str:
    return "Triton" if server == "triton" else f"Kernel N={server}"


def estimate(args, scenarios: list[sr.Scenario], server: str) -> float:
    """Seconds a server's turn takes: start, and each point's load with its margins."""
    start = 12.0 if server == "triton" else 6.0
    per = [(args.gen_warmup + args.gen_duration + 2.5) if s.protocol == "openai" else (3 * args.window_ms / 1000 + 1.5)
           for s in scenarios]
    return start + sum(per)


def measure_server(server: str, args, tools: sr.Tools, repo: Path, logs: Path, deadline: float, state: dict) -> dict:
    entry: dict = {"server": label(server), "requested": server, "points": []}
    kind = "triton" if server == "triton" else "kernel"
    fronts = None if server == "triton" or (server == "1" and not state["flag"]) else server
    ports = TRITON_PORTS if kind == "triton" else KERNEL_PORTS
    say(f"{label(server)}: starting")
    try:
        srv = sr.start_server(kind, fronts, repo, ports, logs, tools, MODELS, label=label(server))
    except harness.BenchError as e:
        entry["error"] = str(e)[:2000]
        say(f"{label(server)}: did not start: {str(e).splitlines()[0]}")
        return entry
    try:
        entry.update(startup_s=round(srv.startup_s, 2), command=srv.command, version=srv.metadata.get("version"))
        time.sleep(1.0)
        entry["idle_memory"] = sr.idle_memory(srv)
        kinds = procs.classify(srv.main_pid)
        entry["fronts_seen"] = sum(1 for k in kinds.values() if k == procs.FRONT) if kind == "kernel" else None
        say(f"{label(server)}: ready in {srv.startup_s:.1f} s, processes "
            + ", ".join(f"{k} x{n['processes']}" for k, n in entry["idle_memory"].items()))
        for sc in args.selected:
            left = deadline - time.monotonic()
            need = estimate(args, [sc], server)
            if left < need:
                entry["points"].append({"scenario": sc.name, "server": label(server), "skipped": f"out of time ({left:.0f} s left)"})
                continue
            if sc.protocol == "openai":
                route, port = ("generate_stream", ports.http) if kind == "triton" else ("openai", ports.openai)
                pt = sr.gen_point(srv, sc, port, route, args.gen_clients, args.gen_duration, args.gen_warmup, logs)
            elif tools.perf is None:
                pt = {"scenario": sc.name, "server": label(server), "skipped": "no perf_analyzer"}
            else:
                pt = sr.perf_point(srv, sc, tools, args.window_ms, logs)
                failed = "stall" in pt or pt.get("infer_per_s") is None
                if failed and sc.protocol == "grpc" and kind == "kernel" and not state["variant_done"] and args.variant \
                        and deadline - time.monotonic() > need + 5:
                    state["variant_done"] = True
                    say(f"  {sc.name}: {'stalled' if 'stall' in pt else 'no figure'}; again with one connection per context")
                    pt["one_connection_per_context"] = sr.perf_point(
                        srv, sc, tools, args.window_ms, logs, env_extra={"TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT": "1"})
            say(f"  {sc.name}: {one_line(pt)}")
            entry["points"].append(pt)
    finally:
        srv.stop()
    return entry


def one_line(pt: dict) -> str:
    if pt.get("skipped"):
        return f"skipped ({pt['skipped']})"
    rate = pt.get("tokens_per_s") or pt.get("infer_per_s")
    unit = "tokens/s" if "tokens_per_s" in pt else "infer/s"
    cpu = pt.get("cpu_us_per_token") or pt.get("cpu_us_per_request") or {}
    parts = [f"{rate:,.0f} {unit}" if rate else "no client figure"]
    if pt.get("server_infer_per_s") is not None:
        parts.append(f"server counted {pt['server_infer_per_s']:,.0f}/s")
    if pt.get("p99_ms") is not None:
        parts.append(f"p50 {pt['p50_ms']:.2f} / p99 {pt['p99_ms']:.2f} ms")
    if cpu:
        parts.append("CPU µs/" + ("token " if "tokens_per_s" in pt else "req ") +
                     " ".join(f"{k} {v:g}" for k, v in cpu.items()))
    if pt.get("error"):
        parts.append(f"ERROR {pt['error'][:160]}")
    return ", ".join(parts)


# ---- report ----------------------------------------------------------------------------------------


def _f(v, spec=",.0f") -> str:
    return "-" if v is None else format(v, spec)


def _rate(pt: dict):
    return pt.get("tokens_per_s") or pt.get("infer_per_s")


def steadiness(pt: dict) -> str:
    """Completed infer/s between successive 0.5 s readings of the server's count (after the first)."""
    series = [r for r in pt.get("series") or [] if r[1] is not None]
    rates = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(series[1:], series[2:]) if b[0] > a[0]]
    if len(rates) < 2:
        return "-"
    rates.sort()
    return f"{rates[0]:,.0f} / {rates[len(rates) // 2]:,.0f} / {rates[-1]:,.0f}"


def markdown(result: dict) -> str:
    servers = sorted(result["servers"], key=lambda e: ["triton", "1", "2", "4", "8", "auto"].index(e["requested"])
                     if e["requested"] in ("triton", "1", "2", "4", "8", "auto") else 99)
    names = [e["server"] + (f" ({e['fronts_seen']} fronts)" if e.get("fronts_seen") and e["requested"] == "auto" else "")
             for e in servers]
    lines = [f"# Front processes side by side ({result['meta']['date']}, {result['meta']['host']})", "",
             "## Throughput (perf_analyzer infer/s; tiny_lm tokens/s; `s`: perf_analyzer gave none, the server's own count)",
             "", "| scenario | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(servers)]
    for sc in result["scenarios"]:
        cells = []
        for e in servers:
            pt = next((p for p in e["points"] if p["scenario"] == sc), None)
            if pt is None or pt.get("skipped"):
                cells.append("skipped" if pt else "-")
            elif _rate(pt):
                cells.append(_f(_rate(pt)) + (f" (p99 {pt['p99_ms']:.1f} ms)" if pt.get("p99_ms") is not None else ""))
            elif pt.get("server_infer_per_s"):
                cells.append(_f(pt["server_infer_per_s"]) + " s" + (" STALL" if "stall" in pt else ""))
            else:
                cells.append("FAILED" + (" STALL" if "stall" in pt else ""))
        lines.append(f"| {BY_NAME[sc].title if sc in BY_NAME else sc} | " + " | ".join(cells) + " |")
    lines += ["", "## CPU per request by process kind (µs; tiny_lm: per token)", "",
              "| scenario | server | fronts | workers | supervisor | tritonserver | stubs | server total | client | "
              "cores: fronts (each) | box busy | connections per front |",
              "| --- | --- |" + " ---: |" * 7 + " --- | ---: | --- |"]
    for sc in result["scenarios"]:
        for e in servers:
            pt = next((p for p in e["points"] if p["scenario"] == sc and not p.get("skipped")), None)
            if pt is None:
                continue
            cpu = pt.get("cpu_us_per_request") or pt.get("cpu_us_per_token") or {}
            each = pt.get("front_cores_each") or []
            front_cores = f"{sum(each):.2f} ({', '.join(f'{c:.2f}' for c in each[:8])}{', ...' if len(each) > 8 else ''})" if each else "-"
            conns = pt.get("connections_per_front") or []
            lines.append(f"| {sc} | {e['server']} | " + " | ".join(_f(cpu.get(k), ",.1f") for k in (
                procs.FRONT, procs.WORKER, procs.SUPERVISOR, procs.SERVER, procs.STUB, "server", "client"))
                + f" | {front_cores} | {_f(pt.get('box_busy'), '.0%')} | {','.join(map(str, conns)) or '-'} |")
    lines += ["", "## Idle memory (PSS MB by kind, after ready)", "",
              "| server | start to ready s | " + " | ".join(procs.KINDS) + " |", "| --- | ---: |" + " ---: |" * len(procs.KINDS)]
    for e in servers:
        mem = e.get("idle_memory") or {}
        lines.append(f"| {e['server']} | {_f(e.get('startup_s'), '.1f')} | " + " | ".join(
            f"{mem[k]['pss_mb']:.0f} ({mem[k]['processes']})" if k in mem else "-" for k in procs.KINDS) + " |")
    lines += ["", "## Steadiness at c=256 (completed infer/s per 0.5 s reading while the load ran: min / median / max)", "",
              "| scenario | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(servers)]
    for sc in [s for s in result["scenarios"] if s.endswith("_c256")]:
        lines.append(f"| {sc} | " + " | ".join(steadiness(next((p for p in e["points"] if p["scenario"] == sc), {}))
                                                for e in servers) + " |")
    failed = [(e["server"], p) for e in servers for p in e["points"]
              if "stall" in p or "one_connection_per_context" in p]
    if failed:
        lines += ["", "## Stalls and failed gRPC points", ""]
        for server, p in failed:
            st = p.get("stall")
            lines.append(f"- {server} {p['scenario']}: " + (
                f"no progress for 3 s after {st['after_s']} s (completed {st['completed']}); socket queues {st['queues']}; "
                f"gauges {st['gauges']}; connections per front {st['connections_per_front']}; front cores in the last "
                f"0.5 s {st['front_cores_last_interval']}" if st else f"{one_line(p)}"))
            var = p.get("one_connection_per_context")
            if var:
                lines.append(f"  - again with one connection per perf_analyzer context: {one_line(var)}"
                             + (" (stalled too)" if "stall" in var else ""))
    errors = [(e["server"], p) for e in servers for p in e["points"] if p.get("error") and "stall" not in p]
    errors += [(e["server"], {"scenario": "(start)", "error": e["error"]}) for e in servers if e.get("error")]
    if errors:
        lines += ["", "## Errors", ""]
        for server, p in errors:
            tail = [ln for ln in (p.get("server_log_tail") or "").splitlines() if ln.strip() and not ln.startswith("I")]
            lines.append(f"- {server} {p['scenario']}: {p['error'][:300]}".replace("\n", " ")
                         + (f" (server log: `{' / '.join(tail[-3:])[:300]}`)" if tail else ""))
    lines += ["", "## Notes", ""] + [f"- {n}" for n in result["meta"]["notes"]]
    return "\n".join(lines) + "\n"


# ---- main --------------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python benchmarks/scale.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default=",".join(ORDER), help="in measuring order: triton and front counts (N or auto)")
    ap.add_argument("--scenarios", default="all", help="comma-separated names: " + ", ".join(BY_NAME))
    ap.add_argument("--instances", type=int, help="CPU instances of every model (default 8; --dry-run 2)")
    ap.add_argument("--window-ms", type=int, help="perf_analyzer window (default 1500; --dry-run 500); 3 per point")
    ap.add_argument("--gen-duration", type=float, help="tiny_lm window, s (default 3; --dry-run 1)")
    ap.add_argument("--gen-warmup", type=float, default=1.0)
    ap.add_argument("--gen-clients", type=int, help="gen_load.py processes for tiny_lm (default: CPUs/4, 1 to 4)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting points after this many seconds")
    ap.add_argument("--dry-run", action="store_true", help="short windows and 2 instances: checks the harness")
    ap.add_argument("--no-variant", dest="variant", action="store_false", help="no second try of a gRPC stall")
    ap.add_argument("--perf-dir", help="folder with perf_analyzer and its libraries (default: benchmarks/.peers)")
    ap.add_argument("--triton-root", help="unpacked pack-triton.sh folder (default: benchmarks/.peers)")
    ap.add_argument("--triton-venv", help="a venv with numpy 1.x for the packed Triton's Python-backend stub")
    ap.add_argument("--out", default=str(HERE / "results" / "scale"))
    args = ap.parse_args(argv)
    args.instances = args.instances or (2 if args.dry_run else 8)
    args.window_ms = args.window_ms or (500 if args.dry_run else 1500)
    args.gen_duration = args.gen_duration or (1.0 if args.dry_run else 3.0)
    args.gen_clients = args.gen_clients or max(1, min(4, (os.cpu_count() or 1) // 4))
    names = list(BY_NAME) if args.scenarios == "all" else [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; known: {', '.join(BY_NAME)}")
    args.selected = [BY_NAME[n] for n in names]
    args.server_list = [s.strip() for s in args.servers.split(",") if s.strip()]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    t_start = time.monotonic()
    deadline = t_start + args.budget_s
    out = Path(args.out).resolve()
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cpus = len(os.sched_getaffinity(0))
    tools = sr.find_tools(args.perf_dir, args.triton_root, args.triton_venv)
    flag = sr.kernel_has_front_processes(sr.kernel_python())
    notes = list(tools.notes)
    if not flag:
        notes.append("this Kernel has no --front-processes: only N=1 (plain `kernel serve`) measured")
    repo = sr.build_repo(out / "repo", MODELS, args.instances)
    state = {"flag": flag, "variant_done": False}
    servers: list[dict] = []
    notes += [
        f"{cpus} CPUs; each model with {args.instances} CPU instances; perf_analyzer `--measurement-interval "
        f"{args.window_ms} -s 1000 -r 3` (3 windows, the CSV's figures); the server's side read over 2 windows' time "
        "from once requests flow (half a window after the load started at the earliest).",
        "CPU per request: utime+stime from /proc/<pid>/stat of every process of the server, by kind, over the "
        "window, divided by the inferences the server counted in it (statistics extension). `server total` "
        "leaves the load client out. Kernel with one front: the `kernel serve` process is the front.",
        f"tiny_lm: {args.gen_clients} gen_load.py process(es) sharing the 64 slots, {args.gen_warmup:g} s warm-up, "
        f"{args.gen_duration:g} s window, 128-token answers; TTFT p50/p99 in the p50/p99 columns.",
    ]
    if args.dry_run:
        notes.insert(0, "**Dry run** (`--dry-run`): short windows and 2 instances; checks the harness, not a result.")

    def write() -> str:
        """The results so far (after every server: a run stopped from outside keeps what it measured)."""
        result = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "host": f"{platform.node()} ({cpus} CPUs)",
                           "python": platform.python_version(), "argv": argv if argv is not None else sys.argv[1:],
                           "wall_s": round(time.monotonic() - t_start, 1), "notes": notes,
                           "settings": {k: v for k, v in vars(args).items() if k not in ("selected",)}},
                  "scenarios": [s.name for s in args.selected], "servers": servers}
        (out / "scale.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        md = markdown(result)
        (out / "scale.md").write_text(md)
        return md

    for server in args.server_list:
        if server == "triton" and tools.triton_home is None:
            continue
        if server not in ("triton", "1") and not flag:
            continue
        if server.isdigit() and int(server) > cpus:
            notes.append(f"N={server} skipped: more fronts than the {cpus} CPUs here")
            continue
        left = deadline - time.monotonic()
        if left < estimate(args, args.selected, server) * 0.6:
            notes.append(f"{label(server)} skipped: out of time ({left:.0f} s left of --budget-s {args.budget_s:.0f})")
            continue
        try:
            servers.append(measure_server(server, args, tools, repo, logs, deadline, state))
        except KeyboardInterrupt:  # SIGTERM too (scale-check.sh's time limit): the servers were stopped
            notes.append(f"interrupted during {label(server)}: the run stopped there")
            print(write())
            return 130
        write()
    print(write())
    failed = any(e.get("error") for e in servers) or any(p.get("error") for e in servers for p in e["points"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

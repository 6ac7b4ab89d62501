"""What several front processes can give on a many-core box, predicted from a small one (issue 32).

On 2 cores nothing scales, but the CPU each kind of process spends per request does not depend
on how many cores there are. So this measures, on add_sub with 8 CPU instances under perf_analyzer
(HTTP and gRPC, several concurrencies), the CPU µs per request of the front(s), the workers, the
supervisor and the load client, with `kernel serve` (one front) and, where the flag exists,
`--front-processes 2`; then it predicts the infer/s of a C-core box (16 by default) with N fronts
as the lowest of three ceilings:

* fronts:  N / f     (a front is one event loop: at most one core; f = front CPU per request at
                      the per-front concurrency c/N, the measured point closest to it)
* workers: W / w     (each of the W instances is one process: at most one core)
* box:     C / (f + w + s + p)   (every core busy: fronts, workers, supervisor s, and the load
                      client p, which shares the box in the device run as here)

With N >= 2 the figures measured with 2 fronts are used (their per-front concurrency matched the
same way): what a second front adds per request (links, relays, the supervisor) is in them. The
prediction is checked against what one front did on the 16-core machine (issue 32's table).

    .venv/bin/python benchmarks/front_capacity.py                  # 2 rounds, HTTP + gRPC, c = 8..256
    .venv/bin/python benchmarks/front_capacity.py --rounds 1 --concurrency 16,64 --protocols http

Writes results/front_processes.md (the measured table, the prediction, and a section the
connection-spread measurement fills) and results/front_processes.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import procs  # noqa: E402
import scale_run as sr  # noqa: E402

PORTS = sr.Ports(28600, 28601, 28602, 28603)
# What one front did on the 16-core H200 machine with real Triton beside it (issue 32), infer/s.
SIXTEEN_CORE = {("http", 64): {"Kernel N=1": 11054, "Triton": 27292}, ("grpc", 64): {"Kernel N=1": 8690, "Triton": 29208},
                ("http", 256): {"Kernel N=1": 6471, "Triton": 26885}, ("grpc", 256): {"Triton": None}}
TARGET_RATIO = 1.5  # issue 32: add_sub >= 1.5x Triton at c=64 and c=256
SPREAD_MARK = "<!-- connection spread: the lead's measurement goes here -->"


def say(msg: str) -> None:
    print(f"[front_capacity] {msg}", file=sys.stderr, flush=True)


def measure(args, tools, repo: Path, logs: Path, flag: bool) -> list[dict]:
    points = []
    for rnd in range(1, args.rounds + 1):
        for n in args.fronts:
            fronts = str(n) if flag else None
            srv = sr.start_server("kernel", fronts, repo, PORTS, logs, tools, ["add_sub"], label=f"Kernel N={n}",
                                  python=args.kernel_python)
            try:
                seen = sum(1 for k in procs.classify(srv.main_pid).values() if k == procs.FRONT)
                say(f"round {rnd}: N={n} ready in {srv.startup_s:.1f} s ({seen} front process(es))")
                for proto in args.protocols:
                    for c in args.concurrency:
                        sc = sr.Scenario(f"add_sub_{proto}_c{c}", "", "add_sub", proto, c)
                        pt = sr.perf_point(srv, sc, tools, args.window_ms, logs)
                        pt.update(round=rnd, fronts=n, fronts_seen=seen, protocol=proto, concurrency=c,
                                  loadavg_1m=round(os.getloadavg()[0], 2))
                        cpu = pt.get("cpu_us_per_request") or {}
                        say(f"  N={n} {proto} c={c}: {pt.get('infer_per_s') or 0:,.0f} infer/s; CPU µs/request "
                            + " ".join(f"{k} {v:g}" for k, v in cpu.items()) + (f"; ERROR {pt['error']}" if pt.get("error") else ""))
                        pt.pop("series", None)
                        points.append(pt)
            finally:
                srv.stop()
    return points


def medians(points: list[dict]) -> dict:
    """(fronts, protocol, concurrency) -> median over rounds of each kind's µs per request, infer/s."""
    out: dict = {}
    keys = {(p["fronts"], p["protocol"], p["concurrency"]) for p in points}
    for key in sorted(keys):
        rows = [p for p in points if (p["fronts"], p["protocol"], p["concurrency"]) == key and p.get("cpu_us_per_request")]
        if not rows:
            continue
        kinds = {k for r in rows for k in r["cpu_us_per_request"]}
        cell = {k: statistics.median(r["cpu_us_per_request"].get(k, 0.0) for r in rows) for k in kinds}
        cell["infer_per_s"] = statistics.median(r.get("infer_per_s") or r.get("server_infer_per_s") or 0 for r in rows)
        cell["rounds"] = len(rows)
        cell["spread_front"] = [min(r["cpu_us_per_request"].get("front", 0) for r in rows),
                                max(r["cpu_us_per_request"].get("front", 0) for r in rows)]
        out[key] = cell
    return out


def predict(med: dict, protocol: str, c: int, n: int, cores: int, instances: int, k: float = 1.0) -> dict | None:
    """Predicted infer/s with N fronts at total concurrency C on CORES, from the measured point
    (1 front for N=1, else the largest measured front count) whose per-front concurrency is closest;
    every CPU figure multiplied by K (a calibration to the other machine's cores)."""
    measured = sorted({k[0] for k in med if k[1] == protocol})
    if not measured:
        return None
    base = 1 if n == 1 or measured == [1] else max(m for m in measured if m <= n)
    want = c / n
    cands = [(abs(k[2] / base - want) / want, k) for k in med if k[0] == base and k[1] == protocol]
    if not cands:
        return None
    _, key = min(cands)
    m = med[key]
    f, w = k * m.get(procs.FRONT, 0.0), k * m.get(procs.WORKER, 0.0)
    s, p = k * m.get(procs.SUPERVISOR, 0.0), k * m.get("client", 0.0)
    caps = {"fronts": n * 1e6 / f if f else float("inf"), "workers": instances * 1e6 / w if w else float("inf"),
            "box": cores * 1e6 / (f + w + s + p)}
    limit = min(caps, key=caps.get)
    return {"infer_per_s": caps[limit], "limit": limit, "caps": caps, "from": key, "front_us": f, "worker_us": w,
            "supervisor_us": s, "client_us": p}


def calibration(med: dict) -> float | None:
    """Factor that makes one front's predicted HTTP c=64 rate the 16-core machine's measured one (a
    front was the ceiling there: it sat at 1.0 core): that machine's µs per request over this box's."""
    m = med.get((1, "http", 64))
    if not m or not m.get(procs.FRONT):
        return None
    return (1e6 / SIXTEEN_CORE[("http", 64)]["Kernel N=1"]) / m[procs.FRONT]


def auto_fronts(python: str, cores: int) -> int | None:
    """What `--front-processes auto` picks for CORES, when the Kernel PYTHON runs has the rule."""
    out = subprocess.run([python, "-c", f"from kernel.serve.fronts.count import auto_count; print(auto_count({cores}))"],
                         capture_output=True, text=True, cwd="/")
    return int(out.stdout) if out.returncode == 0 and out.stdout.strip().isdigit() else None


def _n(v) -> str:
    return f"{v:,.0f}" if v else "-"


def markdown(args, med: dict, points: list[dict], flag: bool, meta: dict) -> str:
    lines = [f"# Front processes: CPU per request and the capacity it predicts ({meta['date']})", "",
             f"`{meta['command']}` on {meta['host']}; add_sub with {args.instances} CPU instances, perf_analyzer "
             f"`--measurement-interval {args.window_ms} -s 1000 -r 3`, {args.rounds} round(s), medians; load average "
             f"{meta['load']}. CPU per request: utime+stime of each process (/proc/<pid>/stat) over two windows "
             "inside the load, divided by the inferences the server counted meanwhile (benchmarks/scale_run.py).", ""]
    load = meta.get("load", "")
    if load.startswith("median ") and float(load.split()[1].rstrip(",")) > 2 * (os.cpu_count() or 1):
        lines += [f"**The box was busy with other work** (load {load} on {os.cpu_count()} CPUs): contention (caches, "
                  "scheduler) inflates CPU per request, so the first prediction table is pessimistic; the scaled one "
                  "divides that out as far as it hits every process alike. Rerun on a quiet box.", ""]
    if not flag:
        lines += ["**This Kernel has no `--front-processes` yet**: only one front is measured; the N >= 2 rows below "
                  "assume a second front adds nothing per request. Rerun once the flag has landed.", ""]
    lines += ["## Measured (µs of CPU per request)", "",
              "| fronts | protocol | c | c per front | infer/s here | front (min–max) | workers | supervisor | server total | client |",
              "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for (n, proto, c), m in sorted(med.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
        lo, hi = m["spread_front"]
        lines.append(f"| {n} | {proto.upper()} | {c} | {c / n:g} | {m['infer_per_s']:,.0f} | {m.get('front', 0):.0f} "
                     f"({lo:.0f}–{hi:.0f}) | {m.get('worker', 0):.0f} | {m.get('supervisor', 0):.0f} | "
                     f"{m.get('server', 0):.0f} | {m.get('client', 0):.0f} |")
    auto = auto_fronts(args.kernel_python or sr.kernel_python(), args.cores)
    ns = sorted({1, 2, 4, 8} | ({auto} if auto else set()))
    k = calibration(med)
    lines += ["", f"## Predicted for {args.cores} cores, {args.instances} instances (infer/s; limit)", "",
              f"Lowest of: fronts N×10⁶/f, workers {args.instances}×10⁶/w, box {args.cores}×10⁶/(f+w+s+client). "
              + (f"`auto` picks {auto} fronts on {args.cores} CPUs. " if auto else "")
              + f"Target: ≥ {TARGET_RATIO}× Triton's 16-core figure."]
    tables = [("With this box's CPU figures as measured:", 1.0)]
    if k:
        tables.append((f"Scaled (×{k:.2f}) so that one front's HTTP c=64 rate is the {_n(SIXTEEN_CORE[('http', 64)]['Kernel N=1'])} "
                       "infer/s it did on the 16-core machine, where it was the ceiling (that machine's cores do the same "
                       "work in less CPU time than this shared 2-core VM's):", k))
    for title, factor in tables:
        lines += ["", title, "", "| protocol | c | " + " | ".join(f"N={n}" + (" (auto)" if n == auto else "") for n in ns)
                  + " | one front measured on 16 cores | Triton on 16 cores | target |",
                  "| --- | ---: |" + " ---: |" * len(ns) + " ---: | ---: | ---: |"]
        for proto in args.protocols:
            for c in (64, 256):
                cells = []
                for n in ns:
                    pr = predict(med, proto, c, n, args.cores, args.instances, factor)
                    cells.append("-" if pr is None else f"{pr['infer_per_s']:,.0f} ({pr['limit']})")
                known = SIXTEEN_CORE.get((proto, c), {})
                tri = known.get("Triton")
                lines.append(f"| {proto.upper()} | {c} | " + " | ".join(cells) + f" | {_n(known.get('Kernel N=1'))} | "
                             f"{_n(tri) if tri else 'not measured'} | {_n(tri and tri * TARGET_RATIO)} |")
    lines += ["", "How to read it: where the limit is `fronts`, more fronts help; where it is `box`, the CPU the whole "
              "server and the client spend per request is what is left to cut (Triton spent 473 µs per request on the "
              "16-core machine, Kernel 224 µs there); `workers` means the 8 instances are the ceiling. The "
              "16-core column is what one front did there: compare it with the N=1 prediction to see how far this "
              "box's per-request CPU carries over (the machines' cores differ). Where the 16-core figure is well below "
              "the N=1 prediction (there: gRPC c=64 and HTTP c=256; gRPC c=256 gave no figure at all), something other "
              "than the front's CPU held one front back there: scale-check.sh's steadiness and stall sections are "
              "there to show what.",
              "", "## 16 cores, measured", "",
              "`scripts/scale-check.sh` on a lent 16-core machine (see its header for the device command) measures "
              "the same points with N = 1, 2, 4, 8, auto and real Triton side by side; its `scale.md` goes here.",
              "", "## Connection spread across fronts", "", SPREAD_MARK, ""]
    errors = [p for p in points if p.get("error")]
    if errors:
        lines += ["## Errors", ""] + [f"- N={p['fronts']} {p['protocol']} c={p['concurrency']} round {p['round']}: "
                                      f"{p['error'][:200]}" for p in errors] + [""]
    return "\n".join(lines)


def keep_spread_section(old: Path, new_text: str) -> str:
    """The connection-spread section is written by hand: keep what an earlier file had there."""
    try:
        text = old.read_text()
    except OSError:
        return new_text
    head = "## Connection spread across fronts"
    if head not in text:
        return new_text
    kept = text.split(head, 1)[1].split("\n## ", 1)[0]
    if SPREAD_MARK in kept and kept.strip() == SPREAD_MARK:
        return new_text
    before, after = new_text.split(head, 1)
    rest = after.split("\n## ", 1)
    return before + head + kept + ("\n## " + rest[1] if len(rest) > 1 else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/front_capacity.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fronts", default="1,2", help="front counts to measure (N >= 2 only where the flag exists)")
    ap.add_argument("--protocols", default="http,grpc")
    ap.add_argument("--concurrency", default="8,16,32,64,256")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window-ms", type=int, default=2000)
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--cores", type=int, default=16, help="the box to predict for")
    ap.add_argument("--kernel-python", help="the interpreter whose `-m kernel` runs (default: this tree's .venv)")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--retable", action="store_true", help="rewrite the md from the saved JSON (no measuring)")
    args = ap.parse_args(argv)
    args.fronts = [int(x) for x in args.fronts.split(",")]
    args.protocols = [x.strip() for x in args.protocols.split(",")]
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    out = Path(args.out)
    if args.retable:
        saved = json.loads((out / "front_processes.json").read_text())
        for key in ("instances", "window_ms", "rounds", "protocols"):
            setattr(args, key, saved["meta"]["settings"][key])
        write(args, out, saved["points"], saved["flag"], saved["meta"])
        return 0
    logs = out / "front_capacity"
    logs.mkdir(parents=True, exist_ok=True)
    tools = sr.find_tools(None, None)
    if tools.perf is None:
        import peers

        peers.ensure()
        tools = sr.find_tools(None, None)
    flag = sr.kernel_has_front_processes(args.kernel_python or sr.kernel_python())
    if not flag and any(n > 1 for n in args.fronts):
        say("this Kernel has no --front-processes: measuring one front only")
        args.fronts = [1]
    repo = sr.build_repo(logs / "repo", ["add_sub"], args.instances)
    t0 = time.monotonic()
    points = measure(args, tools, repo, logs, flag)
    loads = sorted(p["loadavg_1m"] for p in points)
    command = "python benchmarks/front_capacity.py " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "host": f"{platform.node()} ({os.cpu_count()} CPUs)",
            "command": command.strip(), "wall_s": round(time.monotonic() - t0),
            "load": f"median {statistics.median(loads)}, {loads[0]}–{loads[-1]}" if loads else "-",
            "settings": {k: getattr(args, k) for k in ("fronts", "protocols", "concurrency", "rounds", "window_ms",
                                                       "instances", "cores", "kernel_python")}}
    write(args, out, points, flag, meta)
    return 1 if any(p.get("error") for p in points) else 0


def write(args, out: Path, points: list[dict], flag: bool, meta: dict) -> None:
    med = medians(points)
    md = markdown(args, med, points, flag, meta)
    target = out / "front_processes.md"
    md = keep_spread_section(target, md)
    target.write_text(md)
    (out / "front_processes.json").write_text(json.dumps(
        {"meta": meta, "flag": flag, "points": points,
         "medians": [{"fronts": k[0], "protocol": k[1], "concurrency": k[2], **v} for k, v in med.items()]},
        indent=1, default=str) + "\n")
    print(md)


if __name__ == "__main__":
    sys.exit(main())

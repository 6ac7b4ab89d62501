"""Kernel vs real Triton on every scenario of issue 17, in one command: `make bench`.

Real Triton (with its Python backend) and perf_analyzer come from PyPI (benchmarks/peers.py installs
them into benchmarks/.peers on first use). Both servers load the same repository,
benchmarks/model_repo_suite/ (four Python-backend models: add_sub, add_sub_batched, identity_fp32,
repeat_int32), one server at a time. Each round starts each server once and measures, in order:

* start to ready: spawn -> GET /v2/health/ready == 200 and every model's ready == 200;
* idle memory: RSS and PSS summed over the server and all its descendants (model stubs/workers),
  read from /proc a moment after ready, before any request;
* the perf_analyzer scenarios (throughput, p50, p99 from its CSV);

then bound callables (Kernel's kernel.triton vs real PyTriton 0.7, anchored on real Triton) run
through benchmarks/bound_callables.py with the same rounds. Rounds alternate the order of the
servers (Triton, Kernel | Kernel, Triton | ...) so drift on the box hits both alike. Every scenario
reports the MEDIAN over rounds and the spread (min-max), never one good round.

Writes results/suite.md (dated table), suite.json (every round's numbers and settings),
suite.png (throughput ratio per scenario with spread bars) and suite_latency.png (p50/p99);
perf_analyzer output and server logs go to results/suite/*.log (git-ignored).

    python benchmarks/suite.py                          # everything, 3 rounds, 5 s windows
    python benchmarks/suite.py --quick --rounds 1       # check the harness (1 s windows)
    python benchmarks/suite.py --scenarios add_sub_http_c1,add_sub_grpc_c1 --rounds 5
    python benchmarks/suite.py --list                   # scenario names and groups
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import peers  # noqa: E402
import run as harness  # noqa: E402  (server start/stop, CSV parsing)
from procs import descendants  # noqa: E402

REPO = HERE / "model_repo_suite"
MODELS = ["add_sub", "add_sub_batched", "identity_fp32", "repeat_int32"]
UNSTABLE_MARK = "Failed to obtain stable measurement"
SERVER_META: dict = {}  # side -> GET /v2 name/version, filled as servers start


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str  # perf | memory | startup | bound
    title: str
    model: str = ""
    protocol: str = ""
    concurrency: int = 0
    extra: tuple = ()
    target: str = ""  # the target, as text
    target_ratio: float | None = None  # Kernel/Triton throughput ratio to reach (>=)
    unit: str = "infer/s"


def _perf(name, title, model, proto, c, extra=(), target="", ratio=None, unit="infer/s"):
    return Scenario(name, "perf", title, model, proto, c, tuple(extra), target, ratio, unit)


MIB4 = ("--shape", "INPUT0:1048576")
MIB16 = ("--shape", "INPUT0:4194304")
# The same tensors through system shared memory (the client's regions; the body carries no data).
SHM4 = (*MIB4, "--shared-memory", "system", "--output-shared-memory-size", str(4 << 20))
SHM16 = (*MIB16, "--shared-memory", "system", "--output-shared-memory-size", str(16 << 20))
REPEAT = ("--streaming", "--shape", "IN:100", "--shape", "DELAY:100", "--input-data", "zero")
SCENARIOS = [
    _perf("add_sub_http_c1", "add_sub HTTP c=1", "add_sub", "http", 1, target="≥ 1.25×", ratio=1.25),
    _perf("add_sub_grpc_c1", "add_sub gRPC c=1", "add_sub", "grpc", 1, target="≥ 1.25×", ratio=1.25),
    _perf("add_sub_http_c16", "add_sub HTTP c=16", "add_sub", "http", 16, target="≥ 2×", ratio=2.0),
    _perf("add_sub_grpc_c16", "add_sub gRPC c=16", "add_sub", "grpc", 16, target="≥ 2.5×", ratio=2.5),
    _perf("batched_http_c64", "add_sub_batched (max 64, 100 µs) HTTP c=64", "add_sub_batched", "http", 64,
          target="≥ 1.25×", ratio=1.25),
    _perf("batched_grpc_c64", "add_sub_batched (max 64, 100 µs) gRPC c=64", "add_sub_batched", "grpc", 64,
          target="≥ 1.25×", ratio=1.25),
    _perf("identity_4m_http_c2", "identity FP32 4 MiB HTTP c=2", "identity_fp32", "http", 2, MIB4, "≥ 1.5×", 1.5),
    _perf("identity_4m_grpc_c2", "identity FP32 4 MiB gRPC c=2", "identity_fp32", "grpc", 2, MIB4, "≥ 1.5×", 1.5),
    _perf("identity_16m_http_c2", "identity FP32 16 MiB HTTP c=2", "identity_fp32", "http", 2, MIB16, "≥ 1.5×", 1.5),
    _perf("identity_16m_grpc_c2", "identity FP32 16 MiB gRPC c=2", "identity_fp32", "grpc", 2, MIB16, "≥ 1.5×", 1.5),
    _perf("identity_4m_shm_http_c2", "identity FP32 4 MiB, system shared memory, HTTP c=2", "identity_fp32", "http",
          2, SHM4, "(reported)"),
    _perf("identity_4m_shm_grpc_c2", "identity FP32 4 MiB, system shared memory, gRPC c=2", "identity_fp32", "grpc",
          2, SHM4, "(reported)"),
    _perf("identity_16m_shm_http_c2", "identity FP32 16 MiB, system shared memory, HTTP c=2", "identity_fp32", "http",
          2, SHM16, "(reported)"),
    _perf("identity_16m_shm_grpc_c2", "identity FP32 16 MiB, system shared memory, gRPC c=2", "identity_fp32", "grpc",
          2, SHM16, "(reported)"),
    _perf("decoupled_grpc_c1", "decoupled repeat, 100 responses/request, gRPC stream c=1", "repeat_int32", "grpc",
          1, REPEAT, "keep (≥ 2×)", 2.0, "req/s"),
    _perf("decoupled_grpc_c4", "decoupled repeat, 100 responses/request, gRPC stream c=4", "repeat_int32", "grpc",
          4, REPEAT, "keep (≥ 2×)", 2.0, "req/s"),
    Scenario("memory_idle", "memory", "resident memory, 4 models idle (server + workers)", target="≤ Triton"),
    Scenario("startup", "startup", "start to ready, 4 models", target="≤ 0.5 s"),
    Scenario("bound_callables", "bound", "bound callables: Kernel vs PyTriton 0.7 (add_sub, c=1/16)",
             target="(reported)"),
]
BY_NAME = {s.name: s for s in SCENARIOS}
GROUPS = {
    "all": [s.name for s in SCENARIOS],
    "add_sub": [s.name for s in SCENARIOS if s.model == "add_sub"],
    "c1": ["add_sub_http_c1", "add_sub_grpc_c1"],
    "batched": [s.name for s in SCENARIOS if s.model == "add_sub_batched"],
    "identity": [s.name for s in SCENARIOS if s.model == "identity_fp32"],
    "shm": [s.name for s in SCENARIOS if "--shared-memory" in s.extra],
    "decoupled": [s.name for s in SCENARIOS if s.model == "repeat_int32"],
    "perf": [s.name for s in SCENARIOS if s.kind == "perf"],
    "memory": ["memory_idle"],
    "bound": ["bound_callables"],
}


@dataclass
class Sample:
    """One scenario on one server in one round."""

    scenario: str
    server: str
    round: int
    value: float | None = None  # infer/s (req/s for streaming), MB for memory, s for start-up
    p50_us: float | None = None
    p99_us: float | None = None
    stable: bool | None = None
    error: str | None = None
    command: str = ""
    loadavg_1m: float | None = None
    detail: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- measuring


def memory_of(pid: int) -> dict:
    """RSS and PSS (kB -> MB) of a process tree. RSS counts shared pages once per process (as `ps`
    does); PSS splits them, so it is the fairer sum for many processes sharing libraries."""
    rss = pss = 0
    procs = []
    for p in descendants(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
            r = next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError):
            continue
        try:
            rollup = Path(f"/proc/{p}/smaps_rollup").read_text()
            s = next(int(ln.split()[1]) for ln in rollup.splitlines() if ln.startswith("Pss:"))
        except (OSError, StopIteration, ValueError):
            s = 0
        try:
            name = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            name = "?"
        rss, pss = rss + r, pss + s
        procs.append({"pid": p, "rss_mb": round(r / 1024, 1), "pss_mb": round(s / 1024, 1), "cmd": name})
    return {"rss_mb": round(rss / 1024, 1), "pss_mb": round(pss / 1024, 1), "processes": procs}


def wait_models(srv, timeout: float) -> float:
    """Seconds until every model of the suite answers ready (0 when they already do)."""
    t0 = time.monotonic()
    pending = list(MODELS)
    while pending:
        pending = [m for m in pending
                   if harness.http_get(f"http://127.0.0.1:{srv.http_port}/v2/models/{m}/ready")[0] != 200]
        if not pending:
            break
        if time.monotonic() - t0 > timeout:
            raise harness.BenchError(f"{srv.label}: models {pending} not ready within {timeout:.0f} s")
        time.sleep(0.01)
    return time.monotonic() - t0


def run_perf(srv, sc: Scenario, args, logs: Path, rnd: int) -> Sample:
    smp = Sample(sc.name, srv.label, rnd, loadavg_1m=round(os.getloadavg()[0], 2))
    if not srv.alive() or not srv.ready():
        smp.error = f"{srv.label} is not running/ready"
        return smp
    attempts = [(args.stability_percentage, args.max_trials, True), (1000, 3, False)]
    log_path = logs / f"{sc.name}_{srv.label.lower()}_r{rnd}.log"
    with open(log_path, "w") as logf:
        for stability, trials, stable in attempts:
            with tempfile.TemporaryDirectory() as td:
                csv_path = Path(td) / "pa.csv"
                cmd = [*peers.perf_cmd(), "-m", sc.model, "-u", f"localhost:{srv.port(sc.protocol)}",
                       "-i", sc.protocol, "--concurrency-range", f"{sc.concurrency}:{sc.concurrency}",
                       "--measurement-interval", str(args.duration_ms), "--stability-percentage", str(stability),
                       "--max-trials", str(trials), *sc.extra, "-f", str(csv_path)]
                smp.command = shlex.join(["perf_analyzer", *cmd[1:]]).replace(str(csv_path), "OUT.csv")
                timeout = args.duration_ms / 1000.0 * (trials + 2) * 3 + 60
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env=peers.env(), start_new_session=True)
                try:
                    stdout, _ = proc.communicate(timeout=timeout)
                except subprocess.TimeoutExpired:
                    harness.kill_group(proc.pid, proc.pid, grace=2.0)
                    stdout, _ = proc.communicate()
                    stdout += f"\n[suite.py] perf_analyzer killed after {timeout:.0f} s\n"
                except BaseException:
                    harness.kill_group(proc.pid, proc.pid, grace=2.0)
                    raise
                logf.write(f"$ {shlex.join(cmd)}\n{stdout}\n[rc={proc.returncode}]\n\n")
                logf.flush()
                if proc.returncode == 0 and csv_path.exists():
                    try:
                        row = harness.parse_perf_csv(csv_path.read_text())
                    except (ValueError, KeyError) as e:
                        smp.error = f"cannot parse perf_analyzer CSV: {e}"
                        return smp
                    smp.value = row["infer_per_s"]
                    smp.p50_us = row["p50_ms"] * 1000 if row["p50_ms"] is not None else None
                    smp.p99_us = row["p99_ms"] * 1000 if row["p99_ms"] is not None else None
                    smp.stable, smp.error = stable, None
                    return smp
                smp.error = f"perf_analyzer rc={proc.returncode}: " + " | ".join(stdout.strip().splitlines()[-3:])
                if UNSTABLE_MARK not in stdout:
                    return smp
    return smp


def start(side: str, args, logs: Path):
    if side == "Triton":
        return harness.start_triton(REPO, args.triton_ports, logs, timeout=args.start_timeout)
    ns = SimpleNamespace(kernel_cmd=None, kernel_label="Kernel", kernel_start_timeout=args.start_timeout,
                         kernel_args=args.kernel_arg)
    return harness.start_kernel(ns, REPO, args.kernel_ports, logs)[0]


def measure_server(side: str, selected: list[Scenario], args, logs: Path, rnd: int) -> list[Sample]:
    print(f"[round {rnd}/{args.rounds}] {side}: starting on {REPO.name} ...", file=sys.stderr, flush=True)
    srv = start(side, args, logs)
    samples = []
    try:
        startup = srv.startup_s + wait_models(srv, args.start_timeout)
        print(f"  ready in {startup:.2f} s ({srv.metadata})", file=sys.stderr, flush=True)
        SERVER_META[side] = srv.metadata
        names = {s.name for s in selected}
        if "startup" in names:
            samples.append(Sample("startup", side, rnd, value=round(startup, 3), loadavg_1m=round(os.getloadavg()[0], 2),
                                  detail={"server_ready_s": round(srv.startup_s, 3)}))
        if "memory_idle" in names:
            time.sleep(args.settle_s)
            mem = memory_of(srv.main_pid)
            samples.append(Sample("memory_idle", side, rnd, value=mem["rss_mb"], loadavg_1m=round(os.getloadavg()[0], 2),
                                  detail=mem))
            print(f"  idle memory: RSS {mem['rss_mb']:.0f} MB, PSS {mem['pss_mb']:.0f} MB in {len(mem['processes'])} "
                  "processes", file=sys.stderr, flush=True)
        for sc in selected:
            if sc.kind != "perf":
                continue
            print(f"  {sc.name} ...", end="", file=sys.stderr, flush=True)
            smp = run_perf(srv, sc, args, logs, rnd)
            if smp.error:
                print(f" FAILED ({smp.error[:200]})", file=sys.stderr, flush=True)
            else:
                print(f" {smp.value:,.1f} {sc.unit}, p50 {smp.p50_us:,.0f} µs, p99 {smp.p99_us:,.0f} µs"
                      + ("" if smp.stable else " (unstable)"), file=sys.stderr, flush=True)
            samples.append(smp)
    finally:
        srv.stop()
    return samples


def run_bound(args, rounds: int) -> dict:
    """bound_callables.py with the suite's rounds and windows; returns its JSON (or an error)."""
    cmd = [sys.executable, str(HERE / "bound_callables.py"), "--protocol", "both", "--concurrency", "1", "16",
           "--rounds", str(rounds), "--duration-ms", str(args.duration_ms), "--out", str(Path(args.out) / "suite"),
           "--triton-ports", *map(str, args.triton_ports), "--ports", *map(str, args.kernel_ports)]
    print(f"bound callables: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL)
    try:
        data = json.loads((Path(args.out) / "suite" / "bound_callables.json").read_text())
    except (OSError, ValueError) as e:
        return {"error": f"bound_callables.py rc={proc.returncode}, no JSON: {e}"}
    data["exit_status"] = proc.returncode
    data["command"] = shlex.join(["python", *cmd[1:]])
    return data


# --------------------------------------------------------------------------- summarising


def spread(values: list[float]) -> dict | None:
    v = [x for x in values if x is not None]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def summarise(sc: Scenario, samples: list[Sample]) -> dict:
    by = {side: [s for s in samples if s.scenario == sc.name and s.server == side] for side in ("Triton", "Kernel")}
    summ = {"scenario": sc.name, "title": sc.title, "kind": sc.kind, "unit": sc.unit, "target": sc.target}
    for side, ss in by.items():
        ok = [s for s in ss if not s.error and s.value is not None]
        summ[side] = {
            "value": spread([s.value for s in ok]),
            "p50_us": spread([s.p50_us for s in ok]),
            "p99_us": spread([s.p99_us for s in ok]),
            "rounds": [s.value if not s.error else None for s in ss],
            "unstable_rounds": sum(1 for s in ok if s.stable is False),
            "errors": [s.error for s in ss if s.error],
        }
        if sc.kind == "memory":
            summ[side]["pss_mb"] = spread([s.detail.get("pss_mb") for s in ok])
    t, k = summ["Triton"]["value"], summ["Kernel"]["value"]
    summ["ratio"] = k["median"] / t["median"] if t and k and t["median"] else None
    paired = {}
    for s in by["Triton"]:
        if not s.error and s.value:
            paired.setdefault(s.round, [None, None])[0] = s.value
    for s in by["Kernel"]:
        if not s.error and s.value is not None:
            paired.setdefault(s.round, [None, None])[1] = s.value
    per_round = [kv / tv for tv, kv in paired.values() if tv and kv is not None]
    summ["ratio_rounds"] = per_round
    summ["ratio_spread"] = spread(per_round)
    met = None
    if sc.kind == "perf" and summ["ratio"] is not None and sc.target_ratio:
        met = summ["ratio"] >= sc.target_ratio
    elif sc.kind == "memory" and summ["ratio"] is not None:
        met = summ["ratio"] <= 1.0
    elif sc.kind == "startup" and k:
        met = k["median"] <= 0.5
    summ["met"] = met
    return summ


def _num(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit in ("s",):
        return f"{v:.2f}"
    return f"{v:,.0f}" if v >= 100 else f"{v:,.1f}"


def _cell(sp: dict | None, unit: str) -> str:
    if not sp:
        return "error"
    if sp["n"] == 1:
        return _num(sp["median"], unit)
    return f"{_num(sp['median'], unit)} ({_num(sp['min'], unit)}–{_num(sp['max'], unit)})"


def _lat(side: dict) -> str:
    a, b = side["p50_us"], side["p99_us"]
    if not a or not b:
        return "-"
    return f"{a['median']:,.0f} / {b['median']:,.0f}"


def markdown(summaries: list[dict], bound: dict | None, meta: dict, judged: bool = True) -> str:
    lines = [
        "| scenario | Triton | Kernel | Kernel/Triton (rounds min–max) | Triton p50 / p99 µs | Kernel p50 / p99 µs "
        "| target | met |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | :---: |",
    ]
    for s in summaries:
        if s["kind"] == "bound":
            continue
        unit = {"memory": "MB", "startup": "s"}.get(s["kind"], s["unit"])
        t, k = s["Triton"], s["Kernel"]
        tv = _cell(t["value"], unit) + ("*" if t["unstable_rounds"] else "")
        kv = _cell(k["value"], unit) + ("*" if k["unstable_rounds"] else "")
        ratio = "-" if s["ratio"] is None else f"{s['ratio']:.2f}×"
        rs = s["ratio_spread"]
        if rs and rs["n"] > 1:
            ratio += f" ({rs['min']:.2f}–{rs['max']:.2f})"
        lat_t = _lat(t) if s["kind"] == "perf" else "-"
        lat_k = _lat(k) if s["kind"] == "perf" else "-"
        if s["kind"] == "memory":
            lat_t = f"PSS {_cell(t.get('pss_mb'), 'MB')} MB"
            lat_k = f"PSS {_cell(k.get('pss_mb'), 'MB')} MB"
        met = {True: "yes", False: "no", None: "-"}[s["met"]] if judged else "not judged"
        lines.append(f"| {s['title']} ({unit}) | {tv} | {kv} | {ratio} | {lat_t} | {lat_k} | {s['target']} | {met} |")
    out = "\n".join(lines)
    if bound is not None:
        out += "\n\n### Bound callables (`benchmarks/bound_callables.py`, add_sub, infer/s)\n\n"
        if bound.get("error"):
            out += f"FAILED: {bound['error']}\n"
        else:
            pts = bound.get("points", {})
            labels = list(pts)
            out += "| protocol | c | " + " | ".join(f"{lbl} (rounds min–max)" for lbl in labels) + " | Kernel/PyTriton |\n"
            out += "| --- | ---: |" + " ---: |" * (len(labels) + 1) + "\n"
            keys = sorted({(p["protocol"], p["concurrency"]) for ps in pts.values() for p in ps}, key=lambda x: (x[0] != "http", x[1]))
            for proto, c in keys:
                cells, med = [], {}
                for lbl in labels:
                    p = next((p for p in pts[lbl] if p["protocol"] == proto and p["concurrency"] == c), None)
                    vals = [v for v in (p or {}).get("rounds_infer_per_s") or [(p or {}).get("infer_per_s")] if v]
                    sp = spread(vals)
                    med[lbl] = sp["median"] if sp else None
                    cells.append(_cell(sp, "infer/s"))
                r = (f"{med['Kernel'] / med['PyTriton']:.1f}×" if med.get("Kernel") and med.get("PyTriton") else "-")
                out += f"| {proto.upper()} | {c} | " + " | ".join(cells) + f" | {r} |\n"
    return out


def plot(summaries: list[dict], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [s for s in summaries if s["ratio"] is not None]
    if not rows:
        return
    # Throughput (and memory/start-up) ratio per scenario, spread over rounds as error bars.
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.6), dpi=120)
    ys = list(range(len(rows)))[::-1]
    vals = [s["ratio"] for s in rows]
    lo = [s["ratio"] - (s["ratio_spread"] or {"min": s["ratio"]})["min"] for s in rows]
    hi = [(s["ratio_spread"] or {"max": s["ratio"]})["max"] - s["ratio"] for s in rows]
    lo, hi = [max(0.0, v) for v in lo], [max(0.0, v) for v in hi]
    colors = []
    for s in rows:
        better = s["ratio"] >= 1.0 if s["kind"] == "perf" else s["ratio"] <= 1.0
        colors.append("#3b6fb6" if better else "#d9822b")
    ax.barh(ys, vals, xerr=[lo, hi], color=colors, capsize=3, error_kw={"elinewidth": 1})
    for y, s, h in zip(ys, rows, hi):
        ax.text(s["ratio"] + h + 0.03, y, f"{s['ratio']:.2f}×", va="center", fontsize=7)
    ax.axvline(1.0, color="black", lw=0.8)
    tgt = [(y, BY_NAME[s["scenario"]].target_ratio) for y, s in zip(ys, rows) if BY_NAME[s["scenario"]].target_ratio]
    if tgt:
        ax.scatter([t for _, t in tgt], [y for y, _ in tgt], marker="|", s=300, color="#c0392b", zorder=3,
                   label="issue 17 target")
        ax.legend(fontsize=7, loc="lower right")
    labels = []
    for s in rows:
        what = {"memory": " [memory, lower is better]", "startup": " [time, lower is better]"}.get(s["kind"], "")
        labels.append(s["title"] + what)
    ax.set_yticks(ys, labels, fontsize=7)
    ax.set_xlabel("Kernel / Triton (median over rounds; bars: min–max of per-round ratios)")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "suite.png")
    plt.close(fig)

    lat = [s for s in summaries if s["kind"] == "perf" and s["Triton"]["p50_us"] and s["Kernel"]["p50_us"]]
    if not lat:
        return
    fig, ax = plt.subplots(figsize=(10, 4.6), dpi=120)
    x = list(range(len(lat)))
    w = 0.2
    series = [("Triton", "p50_us", -1.5, "#76b900", None), ("Triton", "p99_us", -0.5, "#b5dc6e", "//"),
              ("Kernel", "p50_us", 0.5, "#3b6fb6", None), ("Kernel", "p99_us", 1.5, "#9db7dc", "//")]
    for side, key, off, color, hatch in series:
        med = [s[side][key]["median"] for s in lat]
        err = [[s[side][key]["median"] - s[side][key]["min"] for s in lat],
               [s[side][key]["max"] - s[side][key]["median"] for s in lat]]
        ax.bar([i + off * w for i in x], med, w, yerr=err, color=color, hatch=hatch, capsize=2,
               label=f"{side} {key[:3]}", error_kw={"elinewidth": 0.8})
    ax.set_yscale("log")
    ax.set_xticks(x, ["\n".join(s["scenario"].rsplit("_", 2)) for s in lat], fontsize=7)
    ax.set_ylabel("latency, µs (log scale; bars: min–max over rounds)")
    ax.set_title(title + " — latency", fontsize=9)
    ax.legend(fontsize=7, ncol=4)
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(out / "suite_latency.png")
    plt.close(fig)


# --------------------------------------------------------------------------- main


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python benchmarks/suite.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="all",
                    help="comma-separated scenario names or groups (see --list); default all")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per server (default 3)")
    ap.add_argument("--quick", action="store_true",
                    help="short windows (1 s, at most 3 trials): checks the harness, the numbers are not results")
    ap.add_argument("--duration-ms", type=int, help="perf_analyzer measurement window (default 5000; --quick 1000)")
    ap.add_argument("--stability-percentage", type=float, default=20.0)
    ap.add_argument("--max-trials", type=int, help="perf_analyzer -r (default 6; --quick 3)")
    ap.add_argument("--settle-s", type=float, help="wait after ready before reading idle memory (default 3; --quick 1)")
    ap.add_argument("--start-timeout", type=float, default=120.0)
    ap.add_argument("--triton-ports", type=int, nargs=3, default=[28100, 28101, 28102])
    ap.add_argument("--kernel-ports", type=int, nargs=3, default=[28200, 28201, 28202])
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--note", action="append", default=[], help="a line to add under the table (repeatable)")
    ap.add_argument("--kernel-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for `kernel serve` (repeatable; e.g. --kernel-arg=--front-processes "
                         "--kernel-arg=1 to compare with the default front count)")
    ap.add_argument("--list", action="store_true", help="print scenarios and groups, then exit")
    args = ap.parse_args(argv)
    if args.list:
        for s in SCENARIOS:
            print(f"{s.name:24} {s.title}")
        print("\ngroups: " + ", ".join(f"{g} ({len(v)})" for g, v in GROUPS.items()))
        sys.exit(0)
    args.duration_ms = args.duration_ms or (1000 if args.quick else 5000)
    args.max_trials = args.max_trials or (3 if args.quick else 6)
    args.settle_s = args.settle_s if args.settle_s is not None else (1.0 if args.quick else 3.0)
    names: list[str] = []
    for part in [p.strip() for p in args.scenarios.split(",") if p.strip()]:
        if part in GROUPS:
            names += GROUPS[part]
        elif part in BY_NAME:
            names.append(part)
        else:
            ap.error(f"unknown scenario or group {part!r} (see --list)")
    args.selected = [s for s in SCENARIOS if s.name in set(names)]
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    return args


def compile_kernel() -> None:
    """Write Kernel's .pyc files once, as a pip install does. An editable install under
    PYTHONDONTWRITEBYTECODE=1 (set on this box) would otherwise compile every module from source at
    each start, which is start-up time a user's installed Kernel never pays."""
    folders = [str(ROOT / d) for d in ("kernel", "transports", "backends", "triton_python_backend_utils")]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *folders], check=True, stdout=subprocess.DEVNULL)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    args.out = str(out)
    logs = out / "suite"
    logs.mkdir(parents=True, exist_ok=True)
    peers.ensure()
    compile_kernel()

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    t_start = time.monotonic()
    server_scenarios = [s for s in args.selected if s.kind != "bound"]
    samples: list[Sample] = []
    bound = None
    rc = 0
    try:
        if server_scenarios:
            for rnd in range(1, args.rounds + 1):
                order = ["Triton", "Kernel"] if rnd % 2 else ["Kernel", "Triton"]
                for side in order:
                    samples += measure_server(side, server_scenarios, args, logs, rnd)
        if any(s.kind == "bound" for s in args.selected):
            bound = run_bound(args, args.rounds)
    except harness.BenchError as e:
        print(f"\nERROR: {e}", file=sys.stderr)
        rc = 2
    except KeyboardInterrupt:
        print("\ninterrupted: results files left untouched", file=sys.stderr)
        return 130

    summaries = [summarise(s, samples) for s in args.selected if s.kind != "bound"]
    if bound is not None:
        summaries.append({"scenario": "bound_callables", "kind": "bound", "title": BY_NAME["bound_callables"].title,
                          "ratio": None, "bound": bound})
    if rc == 0 and (any(s.error for s in samples) or (bound or {}).get("error") or (bound or {}).get("exit_status")):
        rc = 1
    loads = [s.loadavg_1m for s in samples if s.loadavg_1m is not None]
    command = "python benchmarks/suite.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    meta = {
        "started": started,
        "wall_s": round(time.monotonic() - t_start, 1),
        "command": command.strip(),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "repo": str(REPO.relative_to(ROOT)),
        "peers": {"packages": peers.PACKAGES, "venv": str(peers.DEFAULT_DIR)},
        "servers": SERVER_META,
        "settings": {"rounds": args.rounds, "quick": args.quick, "duration_ms": args.duration_ms,
                     "kernel_args": args.kernel_arg,
                     "stability_percentage": args.stability_percentage, "max_trials": args.max_trials,
                     "settle_s": args.settle_s, "order": "alternating: odd rounds Triton first, even rounds Kernel first"},
        "loadavg_1m": {"min": min(loads), "max": max(loads)} if loads else None,
        "notes": args.note,
    }
    (out / "suite.json").write_text(json.dumps(
        {**meta, "summary": summaries, "samples": [asdict(s) for s in samples], "exit_status": rc}, indent=1) + "\n")

    # a quick run checks the harness; whether a target is met is for >= 3 full rounds to say
    table = markdown(summaries, bound, meta, judged=not args.quick and args.rounds >= 3)
    notes = []
    if args.quick or args.rounds < 3:
        notes.append(f"**Not a result**: {'`--quick` (1 s windows), ' if args.quick else ''}{args.rounds} round(s). "
                     "This run only checks that the harness works end to end; publish medians of ≥ 3 rounds "
                     "with 5 s windows on a quiet box.")
    if loads and max(loads) > 1.5:
        notes.append(f"The 1-min load average was {min(loads):.1f}–{max(loads):.1f} during the run. It counts runnable "
                     "threads: perf_analyzer's (one per concurrent request) and a server's own threads raise it, and "
                     "so does any other work on the box, which makes the numbers noisy: check which it was.")
    notes += args.note
    notes += [
        f"Command: `{meta['command']}` ({meta['wall_s'] / 60:.0f} min). Servers: real Triton "
        f"{SERVER_META.get('Triton', {}).get('version', '')} from the `nvidia-pytriton==0.7.0` wheel and perf_analyzer "
        "from `tritonclient[all]==2.50.0`, installed by `benchmarks/peers.py`; Kernel from this tree "
        f"(`kernel serve --model-repository benchmarks/model_repo_suite{''.join(' ' + a for a in args.kernel_arg)}`).",
        f"{os.cpu_count()} CPUs, loopback, one server at a time; both servers load the same four models "
        "(`benchmarks/model_repo_suite/`). Rounds alternate the order of the servers.",
        "Cells: median over rounds (min–max). Ratio: Kernel median / Triton median, with the min–max of per-round "
        "ratios. For memory and start-up lower is better; the start-up target is absolute (Kernel ≤ 0.5 s).",
        f"perf_analyzer `--measurement-interval {args.duration_ms}` `-s {args.stability_percentage:g}` "
        f"`-r {args.max_trials}`; `*`: some round did not stabilise and is the average of 3 windows with the "
        "check off. Decoupled rows count requests (each with 100 streamed responses) per second.",
        "Memory: RSS summed over the server process and its descendants from /proc/<pid>/status, "
        f"{args.settle_s:g} s after ready and before any request; PSS (/proc/<pid>/smaps_rollup) splits shared "
        "pages between processes.",
    ]
    for s in samples:
        if s.error:
            notes.append(f"error: {s.server} {s.scenario} round {s.round}: {s.error[:300]}")
    title = f"Kernel vs Triton, issue 17 suite ({started})"
    md = f"# {title}\n\n{table}\n\n" + "\n".join(f"- {n}" for n in notes) + "\n\n![throughput ratios](suite.png)\n\n![latency](suite_latency.png)\n"
    (out / "suite.md").write_text(md)
    print(md)
    try:
        plot(summaries, out, title)
    except Exception as e:  # the numbers matter more than the pictures
        print(f"plot failed: {e!r}", file=sys.stderr)
    print(f"written {out / 'suite.md'}, suite.json, suite.png, suite_latency.png (exit {rc})", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())

"""Kernel vs real Triton, side by side, on the same model repository, measured with perf_analyzer.

Starts real Triton (installed from PyPI by ``benchmarks/peers.py`` into ``benchmarks/.peers``, on
first use) on the repository, measures it with
perf_analyzer for every (protocol, concurrency) point, stops it; then does the same with Kernel
(``<venv python> -m kernel serve ...``). Only one server runs at a time: the box has two cores and
perf_analyzer needs one of them. Both servers are stopped at the end, on error and on Ctrl-C.

Writes ``<out>/latest.md`` (markdown table), ``<out>/latest.json`` (all numbers and settings) and
``<out>/latest.png`` (bar plot); server logs and raw perf_analyzer output go to ``<out>/*.log``.

Examples::

    python benchmarks/run.py                                   # http+grpc, c=1 and c=16, 5 s windows
    python benchmarks/run.py --protocol http --concurrency 1 16 --duration-ms 5000

    # Check the harness itself with a second real Triton standing in for Kernel:
    python benchmarks/run.py --protocol http --kernel-label "Triton #2" --kernel-cmd \\
      'exec {python} benchmarks/peers.py triton {repo} {http_port} {grpc_port} {metrics_port}'

    (peers.py starts tritonserver from its venv folder: started from the project root, Triton's
    Python-backend stub would import Kernel's triton_python_backend_utils/ shim instead of its own.)
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# The old external installer; run.py itself now uses peers.py (kept: other scripts still read it).
ANCHORS = Path(os.environ.get("KERNEL_ANCHORS_SH", "/work/shared/bench/anchors.sh"))
sys.path.insert(0, str(HERE))
import peers  # noqa: E402  (benchmarks/peers.py: real Triton + perf_analyzer from PyPI)

UNSTABLE_MARK = "Failed to obtain stable measurement"


class BenchError(RuntimeError):
    pass


# --------------------------------------------------------------------------- process helpers


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def http_get(url: str, timeout: float = 1.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except (OSError, ValueError):
        return 0, b""


TICK = os.sysconf("SC_CLK_TCK")


def proc_stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name: [2] is the process group, [11] and [12]
    utime and stime in clock ticks (all threads)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far (all its threads)."""
    fields = proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICK


def model_counts(port: int, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) of MODEL, summed over its versions, from the statistics
    extension on HTTP PORT; BenchError when the server does not give them."""
    status, body = http_get(f"http://127.0.0.1:{port}/v2/models/{model}/stats", timeout=5.0)
    try:
        if status != 200:
            raise ValueError(f"answered {status}")
        stats = json.loads(body)["model_stats"]
        return (sum(int(s["inference_count"]) for s in stats), sum(int(s["execution_count"]) for s in stats))
    except (ValueError, KeyError, TypeError) as e:
        raise BenchError(f"statistics of {model} on port {port}: {e}") from None


def log_tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    if not lines:
        return f"(log {path} is empty)"
    # one generated-code line can be megabytes long; keep the tail readable
    return "\n".join(ln if len(ln) <= 400 else ln[:200] + f" ...[{len(ln) - 400} chars]... " + ln[-200:] for ln in lines[-n:])


def pids_in_group(pgid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = proc_stat(int(entry))  # state ppid pgrp session ...
        except OSError:
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry))
    return out


def kill_group(pgid: int, leader: int | None = None, grace: float = 15.0) -> None:
    """Stop a server started in its own session: SIGTERM its main process first so it can shut its
    model stubs/workers down itself, then SIGTERM whatever is left in the group, then SIGKILL."""
    if leader is not None and leader in pids_in_group(pgid):
        try:
            os.kill(leader, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and leader in pids_in_group(pgid):
            time.sleep(0.05)
    if not pids_in_group(pgid):
        return
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if not pids_in_group(pgid):
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    time.sleep(0.2)


@dataclass
class Server:
    """One server under test, started in its own session so the whole tree can be stopped."""

    label: str
    http_port: int
    grpc_port: int
    metrics_port: int
    log: Path
    pgid: int | None = None
    main_pid: int | None = None
    popen: subprocess.Popen | None = None
    metadata: dict = field(default_factory=dict)
    startup_s: float | None = None

    def port(self, protocol: str) -> int:
        return self.http_port if protocol == "http" else self.grpc_port

    def ready(self) -> bool:
        return http_get(f"http://127.0.0.1:{self.http_port}/v2/health/ready")[0] == 200

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return bool(self.pgid and pids_in_group(self.pgid))

    def fetch_metadata(self) -> None:
        status, body = http_get(f"http://127.0.0.1:{self.http_port}/v2", timeout=2.0)
        if status == 200:
            try:
                meta = json.loads(body)
                self.metadata = {"name": meta.get("name"), "version": meta.get("version")}
            except ValueError:
                pass

    def stop(self) -> None:
        if self.pgid is not None:
            kill_group(self.pgid, self.main_pid)
            self.pgid = None
        if self.popen is not None:
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                pass
            self.popen = None


def check_ports_free(*ports: int) -> None:
    busy = [p for p in ports if port_in_use(p)]
    if busy:
        raise BenchError(f"port(s) {busy} already in use on 127.0.0.1; stop whatever listens there or pick other ports")


def launch(srv: Server, cmd: list[str], cwd: Path, env: dict | None, timeout: float,
           failure: Callable[[int | None], str], paths: tuple = ("/v2/health/ready",)) -> Server:
    """Start CMD as SRV in a session of its own (the server and its model processes are one group
    to stop), output into srv.log, and wait until every HTTP path of PATHS answers 200, in order.
    startup_s is the time from spawn to ready. If it exits first or is not ready within TIMEOUT
    seconds, it is stopped and BenchError says failure(exit code, or None for the timeout)."""
    t0 = time.monotonic()
    with open(srv.log, "wb") as logf:
        srv.popen = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
    srv.pgid = srv.main_pid = srv.popen.pid
    pending = list(paths)
    while pending:
        if http_get(f"http://127.0.0.1:{srv.http_port}{pending[0]}")[0] == 200:
            pending.pop(0)
            continue
        if srv.popen.poll() is not None or time.monotonic() - t0 > timeout:
            code = srv.popen.poll()
            srv.stop()
            raise BenchError(failure(code))
        time.sleep(0.01)
    srv.startup_s = time.monotonic() - t0
    srv.fetch_metadata()
    return srv


def start_triton(repo: Path, ports: list[int], out: Path, timeout: float = 120.0) -> Server:
    """Real Triton (benchmarks/peers.py's venv, installed on first use) on REPO; returns once
    GET /v2/health/ready answers 200. startup_s is the time from spawn to ready."""
    peers.ensure()
    srv = Server("Triton", *ports, log=out / "triton.log")
    check_ports_free(*ports)

    def failure(code):
        what = f"exited with code {code} before becoming ready" if code is not None else f"did not become ready in {timeout:.0f} s"
        return f"real Triton {what}\n{log_tail(srv.log)}"

    # Not the project root as working directory: its triton_python_backend_utils/ (Kernel's shim)
    # would shadow the real one inside Triton's Python-backend stub and every model would fail to load.
    return launch(srv, peers.tritonserver_cmd(repo, *ports), out, peers.env(), timeout, failure)


def kernel_command(args, repo: Path, ports: list[int], log: Path) -> tuple[list[str], str]:
    """The command that starts Kernel (a list for Popen) and its printable form."""
    if args.kernel_cmd:
        text = args.kernel_cmd.format(
            repo=shlex.quote(str(repo)),
            http_port=ports[0],
            grpc_port=ports[1],
            metrics_port=ports[2],
            log=shlex.quote(str(log.with_suffix(".inner.log"))),
            out=shlex.quote(str(log.parent)),
            python=shlex.quote(default_python()),
        )
        return ["bash", "-c", text], text
    cmd = [
        default_python(), "-m", "kernel", "serve",
        "--model-repository", str(repo),
        "--http-port", str(ports[0]),
        "--grpc-port", str(ports[1]),
        "--metrics-port", str(ports[2]),
        *getattr(args, "kernel_args", ()),  # suite.py --kernel-arg, e.g. --front-processes 1
    ]  # fmt: skip
    return cmd, shlex.join(cmd)


def default_python() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def start_kernel(args, repo: Path, ports: list[int], out: Path) -> tuple[Server, str]:
    srv = Server(args.kernel_label, *ports, log=out / "kernel.log")
    check_ports_free(*ports)
    cmd, printable = kernel_command(args, repo, ports, srv.log)

    def failure(code):
        what = (f"exited with code {code} before becoming ready." if code is not None else
                f"was not ready (GET /v2/health/ready != 200) within {args.kernel_start_timeout:.0f} s.")
        return f"{srv.label} {what}\ncommand: {printable}\n--- last lines of {srv.log} ---\n{log_tail(srv.log)}"

    return launch(srv, cmd, ROOT, None, args.kernel_start_timeout, failure), printable


# --------------------------------------------------------------------------- perf_analyzer


@dataclass
class Point:
    server: str
    protocol: str
    concurrency: int
    infer_per_s: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    stable: bool | None = None
    error: str | None = None
    command: str = ""
    wall_s: float | None = None
    round: int = 1
    loadavg_1m: float | None = None  # box load when the point started (other work on the box skews numbers)
    rounds_infer_per_s: list = field(default_factory=list)  # every round's figure when --rounds > 1


def parse_perf_csv(text: str) -> dict:
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise ValueError("empty perf_analyzer CSV")
    row = rows[-1]

    def us_to_ms(key: str) -> float | None:
        v = row.get(key)
        return float(v) / 1000.0 if v not in (None, "") else None

    return {
        "infer_per_s": float(row["Inferences/Second"]),
        "p50_ms": us_to_ms("p50 latency"),
        "p90_ms": us_to_ms("p90 latency"),
        "p99_ms": us_to_ms("p99 latency"),
    }


def run_perf_analyzer(srv: Server, protocol: str, concurrency: int, args, out: Path, rnd: int = 1) -> Point:
    pt = Point(srv.label, protocol, concurrency, round=rnd, loadavg_1m=round(os.getloadavg()[0], 2))
    if not srv.alive() or not srv.ready():
        pt.error = f"{srv.label} is not running/ready"
        return pt
    side = "triton" if srv.label == "Triton" else "kernel"
    log_path = out / f"perf_{side}_{protocol}_c{concurrency}{'' if args.rounds == 1 else f'_r{rnd}'}.log"
    attempts = [(args.stability_percentage, args.max_trials, True)]
    if args.allow_unstable:
        # perf_analyzer prints nothing usable when it cannot stabilise; a second attempt with the
        # check effectively off still yields the average over 3 windows, flagged as unstable.
        attempts.append((1000, 3, False))
    with open(log_path, "w") as logf:
        for stability, trials, stable in attempts:
            with tempfile.TemporaryDirectory() as td:
                csv_path = Path(td) / "pa.csv"
                cmd = [
                    *peers.perf_cmd(),
                    "-m", args.model,
                    "-u", f"localhost:{srv.port(protocol)}",
                    "-i", protocol,
                    "--concurrency-range", f"{concurrency}:{concurrency}",
                    "--measurement-interval", str(args.duration_ms),
                    "--stability-percentage", str(stability),
                    "--max-trials", str(trials),
                    "-f", str(csv_path),
                ]  # fmt: skip
                pt.command = shlex.join(["perf_analyzer", *cmd[1:]]).replace(str(csv_path), "OUT.csv")
                timeout = args.duration_ms / 1000.0 * (trials + 2) + 60
                t0 = time.monotonic()
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=peers.env())
                try:
                    stdout, _ = proc.communicate(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    stdout, _ = proc.communicate()
                    stdout += f"\n[benchmarks/run.py] perf_analyzer killed after {timeout:.0f} s\n"
                except BaseException:
                    proc.kill()
                    proc.wait()
                    raise
                pt.wall_s = round(time.monotonic() - t0, 1)
                logf.write(f"$ {shlex.join(cmd)}\n{stdout}\n[rc={proc.returncode}]\n\n")
                logf.flush()
                if proc.returncode == 0 and csv_path.exists():
                    try:
                        for k, v in parse_perf_csv(csv_path.read_text()).items():
                            setattr(pt, k, v)
                        pt.stable, pt.error = stable, None
                        return pt
                    except (ValueError, KeyError) as e:
                        pt.error = f"cannot parse perf_analyzer CSV: {e}"
                        return pt
                tail = "\n".join(stdout.strip().splitlines()[-6:])
                pt.error = f"perf_analyzer rc={proc.returncode}: {tail}"
                if UNSTABLE_MARK not in stdout:
                    return pt  # a real failure, not instability: do not retry
    return pt


def measure(srv: Server, args, out: Path, protocols: list[str], rnd: int = 1) -> list[Point]:
    points = []
    for protocol in protocols:
        for c in args.concurrency:
            print(f"  {srv.label}: {protocol} c={c} ...", end="", file=sys.stderr, flush=True)
            pt = run_perf_analyzer(srv, protocol, c, args, out, rnd)
            if pt.error:
                print(f" FAILED ({pt.error.splitlines()[0]})", file=sys.stderr, flush=True)
            else:
                flag = "" if pt.stable else " (unstable)"
                print(f" {pt.infer_per_s:,.0f} infer/s, p99 {pt.p99_ms:.2f} ms{flag}", file=sys.stderr, flush=True)
            points.append(pt)
    return points


@dataclass
class Side:
    """One server of a comparison: what to print before it starts, and how to start it."""

    banner: str
    start: Callable[[], "Server"]


def kernel_side(banner: str, args, repo: Path, out: Path) -> tuple[Side, list[str]]:
    """A Side that starts Kernel; each command it ran is appended to the returned list."""
    commands: list[str] = []

    def start():
        srv, command = start_kernel(args, repo, args.kernel_ports, out)
        commands.append(command)
        return srv

    return Side(banner, start), commands


def alternate_rounds(rounds: int, sides: list[Side], measure_one: Callable, servers: list) -> tuple[list, int, Optional[str]]:
    """Each round starts, measures and stops every side in turn (Triton, Kernel, Triton, Kernel, ...),
    so slow drift on the box hits both alike; one server runs at a time. Every server started is
    appended to `servers` and all are stopped at the end, on error and on Ctrl-C.

    Returns the points per side (a list per round), the exit status (0; 2 after a BenchError;
    130 after Ctrl-C or SIGTERM) and the first line of the failure, if any.
    """
    runs: list[list] = [[] for _ in sides]
    rc, failure = 0, None
    try:
        for rnd in range(1, rounds + 1):
            tag = f"[round {rnd}/{rounds}] " if rounds > 1 else ""
            for side, side_runs in zip(sides, runs):
                print(f"{tag}{side.banner}", file=sys.stderr, flush=True)
                srv = side.start()
                servers.append(srv)
                print(f"  ready in {srv.startup_s:.1f} s ({srv.metadata})", file=sys.stderr, flush=True)
                side_runs.append(measure_one(srv, rnd))
                srv.stop()
    except BenchError as e:
        print(f"\nERROR: {e}", file=sys.stderr)
        failure = str(e).splitlines()[0]
        rc = 2
    except KeyboardInterrupt:
        print("\ninterrupted; stopping servers", file=sys.stderr)
        rc = 130
    finally:
        for s in servers:
            s.stop()
    return runs, rc, failure


def combine_rounds(runs: list[list[Point]]) -> list[Point]:
    """One point per (protocol, concurrency): the round with the median throughput (lower median)."""
    if len(runs) == 1:
        return runs[0]
    groups: dict[tuple, list[Point]] = {}
    for pts in runs:
        for p in pts:
            groups.setdefault((p.protocol, p.concurrency), []).append(p)
    combined = []
    for pts in groups.values():
        ok = sorted((p for p in pts if not p.error and p.infer_per_s), key=lambda p: p.infer_per_s)
        chosen = ok[(len(ok) - 1) // 2] if ok else pts[-1]
        chosen = Point(**{**asdict(chosen), "rounds_infer_per_s": [p.infer_per_s for p in pts]})
        if ok and len(ok) < len(pts):
            chosen.error = None  # some rounds failed; the per-round list shows which (None)
        combined.append(chosen)
    return combined


# --------------------------------------------------------------------------- reporting


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def build_rows(protocols, concurrencies, triton_pts, kernel_pts) -> list[dict]:
    t = {(p.protocol, p.concurrency): p for p in triton_pts}
    k = {(p.protocol, p.concurrency): p for p in kernel_pts}
    rows = []
    for proto in protocols:
        for c in concurrencies:
            tp, kp = t.get((proto, c)), k.get((proto, c))
            ratio = None
            if tp and kp and tp.infer_per_s and kp.infer_per_s:
                ratio = kp.infer_per_s / tp.infer_per_s
            rows.append({"protocol": proto, "concurrency": c, "triton": tp, "kernel": kp, "ratio": ratio})
    return rows


def markdown_table(rows: list[dict], kernel_label: str) -> str:
    K = kernel_label
    lines = [
        f"| protocol | concurrency | Triton infer/s | {K} infer/s | {K}/Triton | Triton p50 ms | {K} p50 ms "
        f"| Triton p99 ms | {K} p99 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        tp, kp = r["triton"], r["kernel"]

        def cell(p, attr, spec):
            if p is None:
                return "-"
            if p.error:
                return "error"
            s = fmt(getattr(p, attr), spec)
            return s + ("*" if attr == "infer_per_s" and p.stable is False else "")

        lines.append(
            f"| {r['protocol'].upper()} | {r['concurrency']} | {cell(tp, 'infer_per_s', ',.0f')} | "
            f"{cell(kp, 'infer_per_s', ',.0f')} | {fmt(r['ratio'], '.2f') + 'x' if r['ratio'] else '-'} | "
            f"{cell(tp, 'p50_ms', '.2f')} | {cell(kp, 'p50_ms', '.2f')} | "
            f"{cell(tp, 'p99_ms', '.2f')} | {cell(kp, 'p99_ms', '.2f')} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, kernel_label: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['protocol'].upper()}\nc={r['concurrency']}" for r in rows]

    def val(p):
        return p.infer_per_s if p is not None and p.infer_per_s and not p.error else 0.0

    tv = [val(r["triton"]) for r in rows]
    kv = [val(r["kernel"]) for r in rows]
    x = range(len(rows))
    w = 0.38
    fig, ax = plt.subplots(figsize=(max(5.0, 1.9 * len(rows) + 1.5), 4.2), dpi=120)
    bt = ax.bar([i - w / 2 for i in x], tv, w, label="Triton", color="#76b900")
    bk = ax.bar([i + w / 2 for i in x], kv, w, label=kernel_label, color="#3b6fb6")
    ax.bar_label(bt, labels=[f"{v:,.0f}" if v else "n/a" for v in tv], fontsize=7, padding=2)
    ax.bar_label(bk, labels=[f"{v:,.0f}" if v else "n/a" for v in kv], fontsize=7, padding=2)
    top = max(tv + kv + [1.0])
    for i, r in enumerate(rows):
        if r["ratio"]:
            ax.text(i, top * 1.1, f"{r['ratio']:.2f}x", ha="center", fontsize=9, fontweight="bold")
    ax.set_ylim(0, top * 1.4)
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("inferences / s (higher is better)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper center", ncol=2, fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        prog="python benchmarks/run.py",
        description="Kernel vs real Triton on the same model repository, measured with perf_analyzer.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "Writes OUT/latest.md, OUT/latest.json, OUT/latest.png; server logs and raw perf_analyzer output in OUT/*.log.\n"
            "Exit status: 0 all points measured; 1 some point failed; 2 a server failed to start; 130 interrupted."
        ),
    )
    ap.add_argument("--protocol", choices=["http", "grpc", "both"], default="both")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16], metavar="C", help="default: 1 16")
    ap.add_argument("--duration-ms", type=int, default=5000, help="perf_analyzer measurement window (default 5000)")
    ap.add_argument("--repo", default=str(HERE / "model_repo"), help="model repository (default benchmarks/model_repo)")
    ap.add_argument("--out", default=str(HERE / "results"), help="results folder (default benchmarks/results)")
    ap.add_argument("--model", default="add_sub", help="model to load (default add_sub)")
    ap.add_argument("--stability-percentage", type=float, default=20.0,
                    help="perf_analyzer -s (default 20; the 2-core box is noisy)")  # fmt: skip
    ap.add_argument("--max-trials", type=int, default=6, help="perf_analyzer -r (default 6)")
    ap.add_argument("--no-allow-unstable", dest="allow_unstable", action="store_false",
                    help="fail a point that does not stabilise instead of re-measuring it with the check off "
                         "(such numbers are marked * in the table)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternate Triton/Kernel this many times and report the median round (default 1)")  # fmt: skip
    ap.add_argument("--only", choices=["triton", "kernel"], help="measure just one side")
    ap.add_argument("--triton-ports", type=int, nargs=3, default=[18000, 18001, 18002], metavar=("HTTP", "GRPC", "METRICS"))
    ap.add_argument("--kernel-ports", type=int, nargs=3, default=[19000, 19001, 19002], metavar=("HTTP", "GRPC", "METRICS"))
    ap.add_argument("--kernel-start-timeout", type=float, default=60.0, help="seconds to wait for Kernel ready (default 60)")
    dev = ap.add_argument_group("harness testing")
    dev.add_argument(
        "--kernel-cmd",
        help="shell command that replaces '<venv python> -m kernel serve ...' for the Kernel side; placeholders "
        "{repo} {http_port} {grpc_port} {metrics_port} {log} {out} {python}. It runs in the project root and "
        "must keep running while the server runs. Used to check the harness with a second real Triton (see the module docstring).",
    )
    dev.add_argument("--kernel-label", default="Kernel", help="name of the Kernel side in the table/plot")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if any(c < 1 for c in args.concurrency):
        ap.error("--concurrency values must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    protocols = ["http", "grpc"] if args.protocol == "both" else [args.protocol]
    repo = Path(args.repo).resolve()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not (repo / args.model / "config.pbtxt").exists():
        print(f"no {args.model}/config.pbtxt in {repo}", file=sys.stderr)
        return 2
    peers.ensure()  # real Triton + perf_analyzer from PyPI, into benchmarks/.peers on first use

    # SIGTERM behaves like Ctrl-C so the finally blocks stop the servers.
    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)

    servers: list[Server] = []
    kernel_printable = kernel_command(args, repo, args.kernel_ports, out / "kernel.log")[1]
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    sides = []
    if args.only != "kernel":
        sides.append(Side(f"starting real Triton on {repo} (ports {args.triton_ports}) ...",
                          lambda: start_triton(repo, args.triton_ports, out)))
    if args.only != "triton":
        sides.append(Side(f"starting {args.kernel_label}: {kernel_printable}",
                          lambda: start_kernel(args, repo, args.kernel_ports, out)[0]))
    runs, rc, failure = alternate_rounds(args.rounds, sides, lambda srv, rnd: measure(srv, args, out, protocols, rnd),
                                         servers)
    triton_runs = runs[0] if args.only != "kernel" else []
    kernel_runs = runs[-1] if args.only != "triton" else []

    triton_pts = combine_rounds(triton_runs) if triton_runs else []
    kernel_pts = combine_rounds(kernel_runs) if kernel_runs else []
    if not triton_pts and not kernel_pts:
        return rc or 2

    rows = build_rows(protocols, args.concurrency, triton_pts, kernel_pts)
    table = markdown_table(rows, args.kernel_label)
    print(table)
    if rc == 130:
        print("(interrupted: results files left untouched)", file=sys.stderr)
        return rc
    if rc == 0 and any(p.error for p in triton_pts + kernel_pts):
        rc = 1

    by_label = {s.label: s for s in servers}
    meta = {
        "started": started,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "repo": str(repo),
        "model": args.model,
        "settings": {
            "protocols": protocols,
            "concurrency": args.concurrency,
            "duration_ms": args.duration_ms,
            "stability_percentage": args.stability_percentage,
            "max_trials": args.max_trials,
            "allow_unstable": args.allow_unstable,
            "rounds": args.rounds,
        },
        "servers": {
            "triton": {
                "command": shlex.join(peers.tritonserver_cmd(repo, *args.triton_ports)),
                "metadata": by_label.get("Triton").metadata if "Triton" in by_label else None,
                "startup_s": by_label.get("Triton").startup_s if "Triton" in by_label else None,
            },
            "kernel": {
                "label": args.kernel_label,
                "command": kernel_printable,
                "overridden": bool(args.kernel_cmd),
                "metadata": by_label[args.kernel_label].metadata if args.kernel_label in by_label else None,
                "startup_s": by_label[args.kernel_label].startup_s if args.kernel_label in by_label else None,
            },
        },
    }
    result = {
        **meta,
        "rows": [
            {
                "protocol": r["protocol"],
                "concurrency": r["concurrency"],
                "triton": asdict(r["triton"]) if r["triton"] else None,
                "kernel": asdict(r["kernel"]) if r["kernel"] else None,
                "kernel_over_triton": r["ratio"],
            }
            for r in rows
        ],
        "exit_status": rc,
        "failure": failure,
    }
    (out / "latest.json").write_text(json.dumps(result, indent=2) + "\n")

    def describe(meta_dict):
        return f"{meta_dict.get('name')} {meta_dict.get('version')}" if meta_dict else "n/a"

    sides = []
    if triton_pts:
        sides.append(f"Triton: {describe(meta['servers']['triton']['metadata'])} via `benchmarks/peers.py` (nvidia-pytriton 0.7.0 wheel)")
    if args.only != "triton":
        sides.append(f"{args.kernel_label}: {describe(meta['servers']['kernel']['metadata'])} via `{kernel_printable}`")
    notes = [
        f"Model `{args.model}` from `{repo}`; perf_analyzer `--measurement-interval {args.duration_ms}` "
        f"`--stability-percentage {args.stability_percentage:g}` `--max-trials {args.max_trials}`; "
        f"one server at a time; {os.cpu_count()} CPUs, loopback"
        + (f"; {args.rounds} alternating rounds, median round shown." if args.rounds > 1 else "."),
        "; ".join(sides),
    ]
    if args.rounds > 1:
        for p in triton_pts + kernel_pts:
            figs = " / ".join("failed" if v is None else f"{v:,.0f}" for v in p.rounds_infer_per_s)
            notes.append(f"{p.server} {p.protocol.upper()} c={p.concurrency}, infer/s by round: {figs}")
    loads = [p.loadavg_1m for p in triton_pts + kernel_pts if p.loadavg_1m is not None]
    if loads:
        notes.append(
            f"1-min load average when points started: {min(loads):.2f}-{max(loads):.2f} "
            "(the box is shared; ~1 is this benchmark itself, more means other work was competing)."
        )
    if failure:
        notes.append(f"FAILED: {failure} (server logs in `{out}`)")
    if any(p.stable is False for p in triton_pts + kernel_pts):
        notes.append("`*` = perf_analyzer did not stabilise; value is the average of 3 windows with the check off.")
    errors = [p for p in triton_pts + kernel_pts if p.error]
    for p in errors:
        notes.append(f"error {p.server} {p.protocol} c={p.concurrency}: {p.error.splitlines()[-1]}")
    title = f"{args.model}: {args.kernel_label} vs Triton ({started})"
    md = f"# {title}\n\n{table}\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    (out / "latest.md").write_text(md)
    try:
        plot(rows, out / "latest.png", args.kernel_label, title)
    except Exception as e:  # the numbers matter more than the picture
        print(f"plot failed: {e!r}", file=sys.stderr)
    print(f"\nwritten {out / 'latest.md'}, latest.json, latest.png", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())

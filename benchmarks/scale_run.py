"""The measuring parts of the front-process runs (benchmarks/scale.py, benchmarks/front_capacity.py):
the model repository, where perf_analyzer and real Triton come from, starting a server, one point.

One point = one load (perf_analyzer at a fixed concurrency, or gen_load.py clients for tiny_lm)
with the server's side read over a window inside it: the completed inferences (statistics
extension), the CPU of each kind of process (benchmarks/procs.py: fronts, workers, supervisor;
tritonserver and stubs), the load client's CPU and the whole box's. perf_analyzer's own infer/s
and p50/p99 come from its CSV. Every 0.5 s the point also reads the completed count, so a load that
stops making progress (issue 32: perf_analyzer got no measurement from Kernel over gRPC at c=256)
is seen within seconds, stopped, and described: bytes waiting in each side's socket queues, the
server's pending/in-flight gauges, connections per front, and the CPU of each front meanwhile.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import procs  # noqa: E402
import run as harness  # noqa: E402  (Server, kill_group, http_get, model_counts, parse_perf_csv, log_tail)

SUITE = HERE / "model_repo_suite"
TINY_LM = ROOT / "model_repo_examples" / "tiny_lm"


# ---- the models ------------------------------------------------------------------------------------


def build_repo(dest: Path, models: list[str], instances: int) -> Path:
    """A repository with MODELS (from model_repo_suite/, tiny_lm from the examples), each with
    INSTANCES CPU instances: the same model.py files both servers load."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name in models:
        src = TINY_LM if name == "tiny_lm" else SUITE / name
        shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        cfg = dest / name / "config.pbtxt"
        text, n = re.subn(r"count:\s*1\b", f"count: {instances}", cfg.read_text())
        if n != 1:
            raise RuntimeError(f"{cfg}: expected one instance_group count to set, found {n}")
        cfg.write_text(text)
    return dest


# ---- the tools -------------------------------------------------------------------------------------


@dataclass
class Tools:
    """perf_analyzer and real Triton: from a carried folder (scripts/scale-check.sh on a machine
    with no registry) or from benchmarks/.peers (benchmarks/peers.py, where pip works). None: not
    available, the points or server that need it are skipped (and said so)."""

    perf: list[str] | None = None
    perf_env: dict = field(default_factory=dict)
    triton_home: Path | None = None  # .../pytriton/tritonserver
    triton_env: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _libpython_dir() -> str | None:
    """The folder with this interpreter's libpython3.X.so.1.0 (the Python-backend stub embeds it)."""
    name = f"libpython{sys.version_info[0]}.{sys.version_info[1]}.so.1.0"
    candidates = [sysconfig.get_config_var("LIBDIR") or "", sys.base_prefix + "/lib", "/usr/lib/x86_64-linux-gnu",
                  "/usr/lib", "/usr/local/lib"]
    for d in candidates:
        if d and Path(d, name).exists():
            return d
    for top in ("/usr/lib", "/usr/local/lib", sys.base_prefix):
        for p in Path(top).rglob(name) if Path(top).is_dir() else ():
            return str(p.parent)
    return None


def find_tools(perf_dir: str | None, triton_root: str | None, triton_venv: str | None = None) -> Tools:
    """TRITON_VENV: the venv real Triton's Python-backend stub takes its packages from (it finds the
    first one on PATH; default: the one running this). Triton 2.51's stub needs numpy 1.x there:
    with numpy 2 it reads a BYTES tensor's length prefixes from the wrong bytes and aborts."""
    import peers

    t = Tools()
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if perf_dir and Path(perf_dir, "perf_analyzer").exists():
        t.perf = [str(Path(perf_dir, "perf_analyzer"))]
        t.perf_env = dict(base, LD_LIBRARY_PATH=":".join(filter(None, [perf_dir, os.environ.get("LD_LIBRARY_PATH")])))
    elif peers.installed():
        t.perf, t.perf_env = peers.perf_cmd(), peers.env()
    else:
        t.notes.append("no perf_analyzer (neither a carried one nor benchmarks/.peers): perf_analyzer points skipped")
    if triton_root and Path(triton_root, "pytriton", "tritonserver", "bin", "tritonserver").exists():
        root = Path(triton_root)
        libpy = _libpython_dir()
        t.triton_home = root / "pytriton" / "tritonserver"
        libs = [str(root / "nvidia_pytriton.libs"), libpy or "", perf_dir or ""]
        venv_bin = str(Path(triton_venv, "bin")) if triton_venv else str(Path(sys.executable).parent)
        t.triton_env = dict(base, LD_LIBRARY_PATH=":".join(filter(None, libs)), PATH=f"{venv_bin}:{base.get('PATH', '')}")
        t.triton_env.pop("PYTHONHOME", None)
        if triton_venv is None:
            import numpy

            if int(numpy.__version__.split(".")[0]) >= 2:
                t.notes.append(f"real Triton's stub runs with numpy {numpy.__version__}: its BYTES model (tiny_lm) "
                               "aborts with numpy 2 (scale-check.sh gives it numpy 1.26 when .whl/triton/ has it)")
        if libpy is None:
            t.notes.append(f"libpython{sys.version_info[0]}.{sys.version_info[1]}.so.1.0 not found: "
                           "real Triton's Python-backend stub will not start")
    elif peers.installed():
        t.triton_home = Path(peers.tritonserver_cmd(Path("."), 0, 0, 0)[0]).parent.parent
        t.triton_env = peers.env()
    else:
        t.notes.append("no real Triton (neither a carried pack nor benchmarks/.peers): Triton skipped")
    return t


# ---- servers -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int
    openai: int


def kernel_has_front_processes(python: str) -> bool:
    out = subprocess.run([python, "-m", "kernel", "serve", "--help"], capture_output=True, text=True, cwd="/")
    return "--front-processes" in out.stdout


def kernel_python() -> str:
    """The interpreter running this (scale-check.sh picks it: the image's python3 on a lent machine)."""
    return sys.executable


def start_server(kind: str, fronts: str | None, repo: Path, ports: Ports, logs: Path, tools: Tools,
                 models: list[str], timeout: float = 120.0, label: str = "", python: str | None = None,
                 extra: list[str] = ()) -> harness.Server:
    """Real Triton (kind "triton") or `kernel serve` (PYTHON -m kernel, this tree's by default; with
    --front-processes FRONTS unless None) on REPO, in a session of its own, with EXTRA arguments;
    returns once it and every one of MODELS answer ready."""
    label = label or ("Triton" if kind == "triton" else f"Kernel N={fronts or '1'}")
    srv = harness.Server(label, ports.http, ports.grpc, ports.metrics,
                         log=logs / (re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_").lower() + ".log"))
    harness.check_ports_free(ports.http, ports.grpc, ports.metrics, *([ports.openai] if kind != "triton" else []))
    if kind == "triton":
        home = tools.triton_home
        cmd = [str(home / "bin" / "tritonserver"), f"--model-repository={repo}", f"--backend-directory={home / 'backends'}",
               f"--http-port={ports.http}", f"--grpc-port={ports.grpc}", f"--metrics-port={ports.metrics}",
               "--log-verbose=0", "--exit-timeout-secs=5", *extra]  # a stop never waits 30 s on a stream left open
        env, cwd = tools.triton_env, logs  # never the project root (its triton_python_backend_utils shim)
    else:
        cmd = [python or kernel_python(), "-m", "kernel", "serve", "--model-repository", str(repo),
               "--http-port", str(ports.http), "--grpc-port", str(ports.grpc), "--metrics-port", str(ports.metrics),
               "--openai-port", str(ports.openai), *(["--front-processes", fronts] if fronts else []), *extra]
        env, cwd = None, ROOT if python is None else logs  # another tree's Kernel: not this tree on sys.path
    srv.command = shlex.join(cmd)  # type: ignore[attr-defined]

    def failure(code):
        why = f"exited with {code}" if code is not None else f"not ready in {timeout:.0f} s"
        return f"{label} {why} (waiting for {', '.join(paths)})\n{harness.log_tail(srv.log)}"

    paths = ("/v2/health/ready", *(f"/v2/models/{m}/ready" for m in models))
    return harness.launch(srv, cmd, cwd, env, timeout, failure, paths)


def idle_memory(srv: harness.Server) -> dict:
    """PSS (MB) per kind of process, and how many of each, a moment after ready."""
    out: dict = {}
    for pid, kind in procs.classify(srv.main_pid).items():
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            pss = next(int(ln.split()[1]) for ln in rollup.splitlines() if ln.startswith("Pss:")) / 1024
        except (OSError, StopIteration, ValueError):
            continue
        k = out.setdefault(kind, {"processes": 0, "pss_mb": 0.0})
        k["processes"] += 1
        k["pss_mb"] = round(k["pss_mb"] + pss, 1)
    return out


# ---- one point -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    model: str
    protocol: str  # http | grpc | openai (tiny_lm through gen_load.py)
    concurrency: int
    extra: tuple = ()
    responses: int = 1  # responses per request (decoupled)


def _gauges(metrics_port: int, model: str) -> dict:
    status, body = harness.http_get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2.0)
    out: dict = {}
    if status != 200:
        return out
    for ln in body.decode(errors="replace").splitlines():
        for name in ("nv_inference_pending_request_count", "nv_inference_inflight_request_count"):
            if ln.startswith(name + "{") and f'model="{model}"' in ln:
                out[name[13:]] = out.get(name[13:], 0.0) + float(ln.rsplit(" ", 1)[1])
    return out


def _count(srv: harness.Server, model: str) -> int | None:
    try:
        return harness.model_counts(srv.http_port, model)[0]
    except harness.BenchError:
        return None


def _per_request(cpu: dict, requests: float, client_kind: str = "client") -> dict:
    """µs of CPU per request (per token for tiny_lm, the caller scales) per kind, and the total over
    the server's own kinds."""
    if not requests:
        return {}
    out = {k: round(v.seconds * 1e6 / requests, 1) for k, v in cpu.items()}
    out["server"] = round(sum(v.seconds for k, v in cpu.items() if k != client_kind) * 1e6 / requests, 1)
    return out


def _fronts(srv: harness.Server) -> list[int]:
    kinds = procs.classify(srv.main_pid)
    return [p for p, k in kinds.items() if k in (procs.FRONT, procs.SERVER)]


def stall_report(srv: harness.Server, sc: Scenario, port: int, last_cpu: dict) -> dict:
    """What a stalled load looks like from outside both processes."""
    table = procs.tcp_table()
    fronts = _fronts(srv)
    return {"queues": procs.queues_on(port, table), "gauges": _gauges(srv.metrics_port, sc.model),
            "connections_per_front": list(procs.connections_per_process(fronts, port, table).values()),
            "front_cores_last_interval": last_cpu, "server_log_tail": harness.log_tail(srv.log, 15)}


def _follow(srv: harness.Server, sc: Scenario, pa: subprocess.Popen, point: dict, port: int, skip_s: float,
            span: float, hard: float, stall_s: float) -> tuple[list, tuple | None, tuple | None, bool]:
    """Watch a running load: the window's two readings (CPU by kind with the load client, the
    server's count, the box, the time), a reading of the count and of each front's cores every
    0.5 s, and a stall (no progress for STALL_S) described into POINT. Returns (series, before,
    after, stalled); AFTER is taken when the load ends before the window does."""
    t0 = time.monotonic()
    extra = {pa.pid: "client"}
    series, before, after = [], None, None
    first = last_n = _count(srv, sc.model)
    last_move, stalled = time.monotonic(), False
    last_fronts, last_t = {p: procs.cpu_ticks(p) for p in _fronts(srv)}, 0.0
    while pa.poll() is None and time.monotonic() - t0 < hard:
        time.sleep(0.25 if before is None or after is not None else 0.05)
        now = time.monotonic() - t0
        if before is None and now >= skip_s and (n0 := _count(srv, sc.model)) is not None and n0 != first:
            # the window opens once requests flow (hundreds of connections can take a while to open)
            before = (procs.Snapshot.take(srv.main_pid, extra), _count(srv, sc.model), procs.box_busy(), now)
            point["connections_per_front"] = list(procs.connections_per_process(_fronts(srv), port).values())
        elif before is not None and after is None and now >= before[3] + span:
            after = (procs.Snapshot.take(srv.main_pid, extra), _count(srv, sc.model), procs.box_busy(), now)
        if len(series) < 2 * now:  # one reading per 0.5 s
            n = _count(srv, sc.model)
            cur = {p: procs.cpu_ticks(p) for p in last_fronts}
            cores = [round(((cur[p] or 0) - (last_fronts[p] or 0)) / procs.TICK / max(0.05, now - last_t), 2) for p in cur]
            last_fronts, last_t = cur, now
            series.append((round(now, 2), n, cores))
            if n is not None and n != last_n:
                last_n, last_move = n, time.monotonic()
            elif now > skip_s and time.monotonic() - last_move >= stall_s:
                stalled = True
                point["stall"] = {"after_s": round(now, 1), "completed": n, **stall_report(srv, sc, port, cores)}
                break
    if before is not None and after is None:  # the load ended first: the window ends here
        after = (procs.Snapshot.take(srv.main_pid, extra), _count(srv, sc.model), procs.box_busy(), time.monotonic() - t0)
        point["window_cut"] = True
    return series, before, after, stalled


def perf_point(srv: harness.Server, sc: Scenario, tools: Tools, window_ms: int, logs: Path, stall_s: float = 3.0,
               env_extra: dict | None = None) -> dict:
    """perf_analyzer at sc.concurrency for 3 windows of WINDOW_MS; the server's side read from half
    a window (and its start-up) after the load started, for 2 windows' time or until the load ends.
    Stopped early when the server's completed count stands still for STALL_S while the load runs."""
    port = srv.http_port if sc.protocol == "http" else srv.grpc_port
    point: dict = {"scenario": sc.name, "server": srv.label}
    span, hard = 2 * window_ms / 1000, 3 * window_ms / 1000 + 8.0
    with tempfile.TemporaryDirectory() as td:
        csv = Path(td) / "pa.csv"
        cmd = [*tools.perf, "-m", sc.model, "-u", f"localhost:{port}", "-i", sc.protocol, "--concurrency-range",
               f"{sc.concurrency}:{sc.concurrency}", "--measurement-interval", str(window_ms),
               "--stability-percentage", "1000", "--max-trials", "3", *sc.extra, "-f", str(csv)]
        point["command"] = shlex.join(["perf_analyzer", *cmd[len(tools.perf):]]).replace(str(csv), "OUT.csv")
        log = logs / f"{point['server']}_{sc.name}{'_variant' if env_extra else ''}.perf.log".replace(" ", "_").replace("=", "")
        with open(log, "w") as logf:
            logf.write(f"$ {shlex.join(cmd)}\n")
            logf.flush()
            pa = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=dict(tools.perf_env, **(env_extra or {})),
                                  start_new_session=True)
            stalled = False
            try:
                series, before, after, stalled = _follow(srv, sc, pa, point, port, 0.3 + window_ms / 2000, span, hard,
                                                         stall_s)
            finally:
                if pa.poll() is None:
                    harness.kill_group(pa.pid, pa.pid, grace=2.0)
                    point.setdefault("error", f"stalled: no progress for {stall_s:.0f} s" if stalled else
                                     f"perf_analyzer still running after {hard:.0f} s: stopped")
                pa.wait()
        point["series"] = series
        if csv.exists():
            try:
                row = harness.parse_perf_csv(csv.read_text())
                point.update(infer_per_s=row["infer_per_s"], p50_ms=row["p50_ms"], p99_ms=row["p99_ms"])
            except (ValueError, KeyError) as e:
                point["error"] = f"perf_analyzer CSV: {e}"
        elif "error" not in point:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            point["error"] = f"perf_analyzer rc={pa.returncode}: " + " | ".join(tail)
    if before and after:
        cpu, changed = procs.cpu_between(before[0], after[0])
        dt = after[3] - before[3]
        done = (after[1] or 0) - (before[1] or 0)
        point.update(server_infer_per_s=round(done / dt, 1), window_s=round(dt, 2), cpu_us_per_request=_per_request(cpu, done),
                     processes_changed=changed, **_shares(cpu, before[2], after[2], dt))
    return point


def _shares(cpu: dict, box0: tuple, box1: tuple, dt: float) -> dict:
    """The box's busy share over the window, cores per kind, and each front's cores."""
    return {"box_busy": round((box1[0] - box0[0]) / max(1, box1[1] - box0[1]), 3),
            "cores": {k: round(v.seconds / dt, 2) for k, v in cpu.items()},
            "front_cores_each": [round(s / dt, 2) for s in cpu.get(procs.FRONT, procs.KindCpu()).per_process]}


def gen_point(srv: harness.Server, sc: Scenario, route_port: int, route: str, clients: int, duration: float,
              warmup: float, logs: Path, max_tokens: int = 128) -> dict:
    """tiny_lm streamed by CLIENTS gen_load.py processes (sc.concurrency slots split among them):
    tokens/s summed, TTFT percentiles over every client's samples, CPU per 1,000 tokens per kind."""
    clients = max(1, min(clients, sc.concurrency))
    shares = [sc.concurrency // clients + (1 if i < sc.concurrency % clients else 0) for i in range(clients)]
    point: dict = {"scenario": sc.name, "server": srv.label, "route": route, "clients": clients}
    cmds = [[kernel_python(), str(HERE / "gen_load.py"), "--kind", route, "--port", str(route_port), "--model", sc.model,
             "--concurrency", str(c), "--duration", str(duration), "--warmup", str(warmup), "--max-tokens", str(max_tokens),
             "--samples"] for c in shares]
    point["command"] = " & ".join(shlex.join(["python", *c[1:]]) for c in cmds)
    t0 = time.monotonic()
    loads = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds]
    results, errors = [], []
    try:
        extra = {p.pid: "client" for p in loads}
        time.sleep(max(0.0, warmup + 0.3 - (time.monotonic() - t0)))
        before = (procs.Snapshot.take(srv.main_pid, extra), procs.box_busy(), time.monotonic())
        point["connections_per_front"] = list(procs.connections_per_process(_fronts(srv), route_port).values())
        time.sleep(max(0.0, duration - 0.2))
        after = (procs.Snapshot.take(srv.main_pid, extra), procs.box_busy(), time.monotonic())
        end = time.monotonic() + 15.0  # answers still streaming when the window closed finish in this
        for p in loads:
            try:
                out, err = p.communicate(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                err += "\ngen_load.py did not end within 15 s of its window"
            if p.returncode == 0 and out.strip():
                results.append(json.loads(out))
            else:
                errors.append(err.strip()[-300:])
    finally:
        for p in loads:
            if p.poll() is None:
                p.kill()
                p.wait()
    (logs / f"{srv.label}_{sc.name}.gen.log".replace(" ", "_").replace("=", "")).write_text(
        point["command"] + "\n" + json.dumps(results)[:20000] + "\n" + "\n".join(errors))
    if errors or not results:
        point["error"] = (errors or ["no client answered"])[0]
        point["server_log_tail"] = harness.log_tail(srv.log, 12)
        return point
    ttft = sorted(v for r in results for v in (r.get("ttft_samples_ms") or []))
    pick = lambda q: ttft[min(len(ttft) - 1, round(q * (len(ttft) - 1)))] if ttft else None  # noqa: E731
    tokens = sum(r["tokens_per_s"] for r in results)
    point.update(tokens_per_s=round(tokens, 1), p50_ms=pick(0.5), p99_ms=pick(0.99), requests=sum(r["requests"] for r in results),
                 errors=sum(r["errors"] for r in results), first_error=next((r["first_error"] for r in results if r["first_error"]), None))
    cpu, changed = procs.cpu_between(before[0], after[0])
    dt = after[2] - before[2]
    point.update(window_s=round(dt, 2), cpu_us_per_token=_per_request(cpu, tokens * dt), processes_changed=changed,
                 **_shares(cpu, before[1], after[1], dt))
    return point

"""Where an add_sub request's time goes at concurrency 1 (issue 17, "Concurrency 1").

For each server (Kernel, real Triton) and protocol (HTTP, gRPC) it starts the server on
benchmarks/model_repo (add_sub only, one instance), warms it up, then drives it with perf_analyzer
at concurrency 1 three times:

1. clean: CPU time per request of every process (front/tritonserver, worker/stub, perf_analyzer),
   split user/system, and context switches (all threads) per request, from /proc deltas divided by
   the server's own request count (statistics extension); p50/p99 from perf_analyzer;
2. py-spy: ``py-spy record --native --full-filenames -f raw`` on the front and on the worker at the
   same time (Kernel only); samples are grouped by the code they are in (HTTP/1.1 parse, app,
   protobuf, HTTP/2 framing, core, backend IPC, event loop, model, syscalls ...) and scaled by the
   process's clean CPU per request into µs per request;
3. strace: ``strace -f -c`` on each server process: syscalls per request by name (counts only:
   strace slows every call, so its times are not used).

Writes results/latency_budget.json and results/latency_budget_tables.md (generated tables; the
analysis is results/latency_budget.md, written by hand from them); raw profiles go to
results/latency_budget/ (git-ignored). Run as root (py-spy --native and strace attach to processes).

    .venv/bin/python benchmarks/latency_budget.py                  # both servers, both protocols
    .venv/bin/python benchmarks/latency_budget.py --servers kernel --protocols http --seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import peers  # noqa: E402
import run as harness  # noqa: E402

REPO = HERE / "model_repo"
TICK = os.sysconf("SC_CLK_TCK")

# First match walking a stack from its innermost frame outwards names the bucket. Order matters:
# the model's own file and the shim before "backends", protobuf before "transports/grpc".
BUCKETS = [
    ("model execute (add_sub model.py + numpy)", re.compile(r"model_repo/add_sub/1/model\.py|/numpy/")),
    ("pb_utils shim (Tensor, InferenceResponse, get_input)", re.compile(r"triton_python_backend_utils")),
    ("worker: receive, decode, dispatch, encode, send", re.compile(r"backends/python/(worker|wire|framing|messages|inline_channel|responses|arena|model_thread|execution_record)")),
    ("front: backend IPC (frame, send, match response)", re.compile(r"backends/python/")),
    ("msgspec encode/decode", re.compile(r"msgspec")),
    ("protobuf (upb) parse/serialize", re.compile(r"google/protobuf|_upb")),
    ("gRPC HTTP/2 framing (native server)", re.compile(r"transports/grpc/http2/")),
    ("gRPC service: request/response build", re.compile(r"transports/grpc/")),
    ("HTTP/1.1 parse + ASGI glue (uvicorn, httptools)", re.compile(r"uvicorn/|httptools")),
    ("HTTP app: route, decode body, encode response", re.compile(r"transports/(http/|asgi|http_limits|restrictions|header_forward)")),
    ("core: request, validate, schedule, stats", re.compile(r"kernel/core/|kernel/observe/")),
    ("other Kernel code", re.compile(r"/work/main/kernel/|/kernel/")),
    ("socket I/O (uvloop stream read/write, syscalls)", re.compile(r"uvloop/handles/(stream|tcp|pipe|udp)|uv__(read|write|try_write|stream)|uv_try_write|uv_write")),
    ("event loop (uvloop/asyncio)", re.compile(r"uvloop|asyncio/|uv__|uv_run")),
    ("threading", re.compile(r"threading\.py|concurrent/")),
]
# A sample whose innermost frames are a blocking wait is a thread with nothing to do (py-spy's idle
# detection does not catch these with --native): not counted.
IDLE = re.compile(r"PyThread_acquire_lock|epoll_wait|epoll_pwait|sem_clockwait|sem_timedwait|pthread_cond_(timed)?wait|"
                  r"futex_wait|__select|\bselect \(|\bpoll \(|accept4? \(|time_sleep|pysleep|clock_nanosleep")
SYSCALL_LEAF = re.compile(r"^(__)?(libc_)?(send|sendmsg|sendto|recv|recvmsg|recvfrom|read|write|writev|readv|epoll_wait|epoll_ctl|"
                          r"futex|poll|select|accept4?|clock_gettime|getpid|ioctl|__GI_|syscall)", re.I)


def tasks_stats(pid: int) -> dict:
    """utime/stime (s) of the process (all threads) and context switches summed over its threads."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return {}
    f = stat[stat.rfind(")") + 2:].split()
    out = {"user_s": int(f[11]) / TICK, "sys_s": int(f[12]) / TICK, "vol": 0, "invol": 0, "threads": 0}
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            st = (t / "status").read_text()
        except OSError:
            continue
        out["threads"] += 1
        for ln in st.splitlines():
            if ln.startswith("voluntary_ctxt_switches:"):
                out["vol"] += int(ln.split()[1])
            elif ln.startswith("nonvoluntary_ctxt_switches:"):
                out["invol"] += int(ln.split()[1])
    return out


def request_count(srv) -> int:
    code, body = harness.http_get(f"http://127.0.0.1:{srv.http_port}/v2/models/add_sub/stats", timeout=3)
    if code != 200:
        return 0
    st = json.loads(body)["model_stats"]
    return sum(int(m["inference_stats"]["success"]["count"]) for m in st)


def server_procs(srv, side: str) -> dict[str, int]:
    from suite import descendants

    procs = {}
    for p in descendants(srv.main_pid):
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if p == srv.main_pid:
            procs["front" if side == "Kernel" else "tritonserver"] = p
        elif "kernel.backends.python.worker" in cmd or "triton_python_backend_stub" in cmd:
            procs["worker" if side == "Kernel" else "stub"] = p
    return procs


def perf(srv, protocol: str, seconds: float, logs: Path, tag: str) -> dict:
    with tempfile.TemporaryDirectory() as td:
        csv = Path(td) / "pa.csv"
        cmd = [*peers.perf_cmd(), "-m", "add_sub", "-u", f"localhost:{srv.port(protocol)}", "-i", protocol,
               "--concurrency-range", "1:1", "--measurement-interval", str(int(seconds * 1000 / 3)),
               "--stability-percentage", "1000", "--max-trials", "3", "-f", str(csv)]
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run(cmd, capture_output=True, text=True, env=peers.env())
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        (logs / f"perf_{tag}.log").write_text(shlex.join(cmd) + "\n" + p.stdout + p.stderr)
        row = harness.parse_perf_csv(csv.read_text()) if csv.exists() else {}
    return {"rc": p.returncode, "infer_per_s": row.get("infer_per_s"),
            "p50_us": (row.get("p50_ms") or 0) * 1000, "p99_us": (row.get("p99_ms") or 0) * 1000,
            "client_user_s": ru1.ru_utime - ru0.ru_utime, "client_sys_s": ru1.ru_stime - ru0.ru_stime}


def clean_run(srv, side, protocol, args, logs) -> dict:
    procs = server_procs(srv, side)
    before = {k: tasks_stats(p) for k, p in procs.items()}
    n0 = request_count(srv)
    pa = perf(srv, protocol, args.seconds, logs, f"{side.lower()}_{protocol}_clean")
    n = request_count(srv) - n0
    after = {k: tasks_stats(p) for k, p in procs.items()}
    per = {}
    for k in procs:
        b, a = before[k], after[k]
        per[k] = {
            "cpu_us": round((a["user_s"] + a["sys_s"] - b["user_s"] - b["sys_s"]) / n * 1e6, 1),
            "user_us": round((a["user_s"] - b["user_s"]) / n * 1e6, 1),
            "sys_us": round((a["sys_s"] - b["sys_s"]) / n * 1e6, 1),
            "voluntary_cs": round((a["vol"] - b["vol"]) / n, 2),
            "involuntary_cs": round((a["invol"] - b["invol"]) / n, 2),
            "threads": a["threads"],
        }
    # perf_analyzer's requests include its warm-up and every window; the server's count covers the same.
    per["perf_analyzer (client)"] = {
        "cpu_us": round((pa["client_user_s"] + pa["client_sys_s"]) / n * 1e6, 1),
        "user_us": round(pa["client_user_s"] / n * 1e6, 1), "sys_us": round(pa["client_sys_s"] / n * 1e6, 1)}
    return {"requests": n, "perf": pa, "procs": per, "pids": procs,
            "loadavg_1m": round(os.getloadavg()[0], 2)}


def classify(raw: Path) -> dict:
    buckets: Counter = Counter()
    in_syscall = 0
    total = idle = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        if any(IDLE.search(fr) for fr in frames[-4:]):
            idle += n
            continue
        total += n
        leaf = frames[-1] if frames else ""
        if SYSCALL_LEAF.match(leaf.strip()):
            in_syscall += n
        name = None
        for fr in reversed(frames):
            for label, rx in BUCKETS:
                if rx.search(fr):
                    name = label
                    break
            if name:
                break
        buckets[name or "other (interpreter, native, unattributed)"] += n
    return {"samples": total, "idle_samples": idle, "in_syscall_leaf": in_syscall, "buckets": dict(buckets.most_common())}


def pyspy_run(srv, side, protocol, args, logs) -> dict:
    pyspy = shutil.which("py-spy") or str(ROOT / ".venv" / "bin" / "py-spy")
    procs = server_procs(srv, side)
    spies = {}
    for k, pid in procs.items():
        out = logs / f"pyspy_{side.lower()}_{protocol}_{k}.txt"
        cmd = [pyspy, "record", "--native", "--full-filenames", "-r", str(args.rate), "-f", "raw", "-o", str(out),
               "-p", str(pid), "-d", str(int(args.seconds + 3))]
        spies[k] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), out)
    time.sleep(1.0)
    pa = perf(srv, protocol, args.seconds, logs, f"{side.lower()}_{protocol}_pyspy")
    res = {"perf_under_pyspy": pa}
    for k, (p, out) in spies.items():
        _, err = p.communicate(timeout=60)
        res[k] = classify(out) if out.exists() else {"error": err[-400:]}
    return res


def strace_run(srv, side, protocol, args, logs) -> dict:
    procs = server_procs(srv, side)
    tr = {}
    for k, pid in procs.items():
        out = logs / f"strace_{side.lower()}_{protocol}_{k}.txt"
        tr[k] = (subprocess.Popen(["strace", "-f", "-c", "-o", str(out), "-p", str(pid)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out)
    time.sleep(1.0)
    n0 = request_count(srv)
    perf(srv, protocol, max(2.0, args.seconds / 2), logs, f"{side.lower()}_{protocol}_strace")
    n = request_count(srv) - n0
    res = {"requests": n}
    for k, (p, out) in tr.items():
        p.send_signal(2)
        p.wait(timeout=30)
        calls = {}
        for ln in out.read_text().splitlines():
            parts = ln.split()
            # % time, seconds, usecs/call, calls, [errors], syscall
            if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                try:
                    calls[parts[-1]] = int(parts[3])
                except ValueError:
                    pass
        res[k] = {name: round(c / max(n, 1), 2) for name, c in sorted(calls.items(), key=lambda x: -x[1]) if c / max(n, 1) >= 0.05}
        res[k]["_total_per_request"] = round(sum(calls.values()) / max(n, 1), 1)
    return res


def worker_roundtrip(n: int) -> str:
    p = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), str(HERE / "worker_roundtrip.py"), str(n)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    return (p.stdout.strip() or p.stderr.strip()[-300:])


def tables(result: dict) -> str:
    md = []
    for key, r in result["runs"].items():
        side, proto = key.split("/")
        c = r["clean"]
        md.append(f"### {side} {proto.upper()} c=1: {c['perf']['infer_per_s']:,.0f} infer/s, p50 {c['perf']['p50_us']:,.0f} µs, "
                  f"p99 {c['perf']['p99_us']:,.0f} µs ({c['requests']:,} requests, load {c['loadavg_1m']})\n")
        md.append("| process | CPU µs/request | user | sys | voluntary cs/req | involuntary cs/req | syscalls/req (strace) |")
        md.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        total = 0.0
        for k, v in c["procs"].items():
            total += v["cpu_us"]
            sc = r.get("strace", {}).get(k, {}).get("_total_per_request", "-")
            md.append(f"| {k} | {v['cpu_us']:.0f} | {v['user_us']:.0f} | {v['sys_us']:.0f} | {v.get('voluntary_cs', '-')} | "
                      f"{v.get('involuntary_cs', '-')} | {sc} |")
        md.append(f"| **sum of CPU** | **{total:.0f}** | | | | | |")
        md.append(f"| latency not covered by CPU (p50 − sum: wake-ups, scheduling, waiting for a core) | "
                  f"{c['perf']['p50_us'] - total:.0f} | | | | | |\n")
        for k, prof in r.get("pyspy", {}).items():
            if k == "perf_under_pyspy" or "buckets" not in prof:
                continue
            cpu = c["procs"].get(k, {}).get("cpu_us", 0)
            md.append(f"py-spy, {side} {proto.upper()} {k}: {prof['samples']} busy samples ({prof.get('idle_samples', 0)} idle "
                      f"left out); µs/request = share × {cpu:.0f} µs CPU "
                      f"(leaf in a syscall wrapper: {prof['in_syscall_leaf'] / max(prof['samples'], 1):.0%})\n")
            md.append("| where | share | µs/request |")
            md.append("| --- | ---: | ---: |")
            for b, n in prof["buckets"].items():
                share = n / max(prof["samples"], 1)
                md.append(f"| {b} | {share:.0%} | {share * cpu:.0f} |")
            md.append("")
        for k, calls in r.get("strace", {}).items():
            if k == "requests":
                continue
            items = ", ".join(f"{name} {v}" for name, v in calls.items() if not name.startswith("_"))
            md.append(f"- strace {side} {proto.upper()} {k}: {calls.get('_total_per_request')} syscalls/request: {items}")
        md.append("")
    if result.get("worker_roundtrip"):
        md.append(f"worker alone (benchmarks/worker_roundtrip.py): {result['worker_roundtrip']}\n")
    return "\n".join(md)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/latency_budget.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", nargs="+", choices=["kernel", "triton"], default=["kernel", "triton"])
    ap.add_argument("--protocols", nargs="+", choices=["http", "grpc"], default=["http", "grpc"])
    ap.add_argument("--seconds", type=float, default=8.0, help="perf_analyzer window per run (default 8)")
    ap.add_argument("--rate", type=int, default=500, help="py-spy samples per second (default 500)")
    ap.add_argument("--no-pyspy", action="store_true")
    ap.add_argument("--no-strace", action="store_true")
    ap.add_argument("--ports", type=int, nargs=3, default=[28300, 28301, 28302])
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    logs = out / "latency_budget"
    logs.mkdir(parents=True, exist_ok=True)
    peers.ensure()
    result = {"started": time.strftime("%Y-%m-%d %H:%M %Z"), "command": shlex.join(["python", *sys.argv]),
              "settings": vars(args), "runs": {}}
    for side in ("Kernel", "Triton"):
        if side.lower() not in args.servers:
            continue
        for proto in args.protocols:
            if side == "Triton":
                srv = harness.start_triton(REPO, args.ports, logs)
            else:
                srv = harness.start_kernel(SimpleNamespace(kernel_cmd=None, kernel_label="Kernel", kernel_start_timeout=90),
                                           REPO, args.ports, logs)[0]
            try:
                perf(srv, proto, 1.0, logs, "warmup")
                r = {"clean": clean_run(srv, side, proto, args, logs)}
                print(f"{side} {proto}: {json.dumps(r['clean']['procs'])} p50 {r['clean']['perf']['p50_us']:.0f}",
                      file=sys.stderr, flush=True)
                if not args.no_pyspy and side == "Kernel":
                    r["pyspy"] = pyspy_run(srv, side, proto, args, logs)
                if not args.no_strace:
                    r["strace"] = strace_run(srv, side, proto, args, logs)
                result["runs"][f"{side}/{proto}"] = r
            finally:
                srv.stop()
    if "kernel" in args.servers:
        result["worker_roundtrip"] = worker_roundtrip(3000)
    (out / "latency_budget.json").write_text(json.dumps(result, indent=1) + "\n")
    md = f"# Latency budget tables ({result['started']}; generated by `{result['command']}`)\n\n" + tables(result)
    (out / "latency_budget_tables.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

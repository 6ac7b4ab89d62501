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

# Hops of a request, by the code a py-spy sample's innermost frames are in (first match walking the
# stack from its innermost frame outwards). A write's syscall, the wake-up of the reader and any wait
# for a core right after it show up in the Python function that called write.
FRONT_HOPS = [
    ("write to worker: frame + send (incl. syscall, waking the worker)", re.compile(r"^(MessageChannel|InlineChannel)\.send ")),
    ("read + decode the worker's response", re.compile(r"framing\.py|backends/python/(wire|responses|inline_channel)")),
    ("backend: submit, match response to request", re.compile(r"backends/python/")),
    ("HTTP fast path: parse, route, decode, answer (transports/http/fast.py, incl. the socket write)",
     re.compile(r"transports/http/fast\.py")),
    ("HTTP response write: uvicorn send (headers + body, syscall, waking the client)", re.compile(r"ResponseCycle\.send ")),
    ("HTTP receive + parse (uvicorn protocol, httptools, limits)", re.compile(r"httptools_impl|http_limits|httptools")),
    ("ASGI glue (run_asgi, proxy-headers middleware)", re.compile(r"uvicorn/")),
    ("gRPC HTTP/2: frames in/out, HPACK, flow control, socket write", re.compile(r"transports/grpc/http2/")),
    ("gRPC service: protobuf decode, request build, response encode", re.compile(r"transports/grpc/|google/protobuf")),
    ("HTTP app: route, header JSON + binary decode, response encode, disconnect watch", re.compile(r"transports/")),
    ("core: request object, validate, schedule, stats", re.compile(r"kernel/core/|kernel/observe/")),
    ("msgspec", re.compile(r"msgspec")),
    ("other Kernel code", re.compile(r"/kernel/")),
    ("event loop / asyncio", re.compile(r"uvloop|asyncio/")),
    ("threading", re.compile(r"threading\.py|concurrent/")),
]
WORKER_HOPS = [
    ("write the response to the front: encode + send (incl. syscall, waking the front)", re.compile(r"^(MessageChannel|InlineChannel)\.send ")),
    ("model execute (add_sub model.py + numpy)", re.compile(r"model_repo/add_sub/1/model\.py|/numpy/")),
    ("pb_utils shim (Tensor, InferenceResponse, get_input)", re.compile(r"triton_python_backend_utils")),
    ("read + decode Execute (framing, msgspec)", re.compile(r"framing\.py|inline_channel|msgspec")),
    ("build requests + input tensors", re.compile(r"^Worker\.(execute|_input_tensor) |wire\.py")),
    ("pack responses, execution record (stats)", re.compile(r"responses\.py|execution_record")),
    ("worker dispatch (on_message, inline execute, finish, flush)", re.compile(r"backends/python/")),
    ("event loop / asyncio", re.compile(r"uvloop|asyncio/")),
    ("threading", re.compile(r"threading\.py|concurrent/")),
]
# A sample whose innermost frames are a blocking wait is a thread with nothing to do (py-spy's idle
# detection does not catch these with --native): not counted.
IDLE = re.compile(r"PyThread_acquire_lock|epoll_wait|epoll_pwait|sem_clockwait|sem_timedwait|pthread_cond_(timed)?wait|"
                  r"futex_wait|__select|\bselect \(|\bpoll \(|accept4? \(|time_sleep|pysleep|clock_nanosleep")
LOOP_LEAF = re.compile(r"^(Runner\.run|run|run_until_complete|run_forever|_run_once) \(.*(asyncio/runners|asyncio/base_events|uvloop/__init__)")
# Linux perf: kernel symbols grouped by what they are for.
KERNEL_GROUPS = [
    ("context switch / wake-up", re.compile(r"finish_task_switch|__schedule|schedule|_raw_spin_unlock_irqrestore|try_to_wake_up|"
                                            r"ttwu|enqueue|dequeue|pick_next|update_curr|switch_|__switch_to|psi_|futex")),
    ("TCP/IP + unix socket", re.compile(r"tcp|ip_|inet|sock|skb|unix_|__dev_|net_|loopback|nf_|__sys_send|__sys_recv|copy_(to|from)_iter|_copy_")),
    ("epoll", re.compile(r"ep_|epoll")),
    ("syscall entry/exit", re.compile(r"syscall|entry_|irqentry|exit_to_user|do_syscall")),
]
DSO_NAMES = [
    ("Python interpreter (libpython)", re.compile(r"libpython|^python")),
    ("Linux kernel", re.compile(r"kernel")),
    ("uvloop", re.compile(r"^loop\.cpython")),
    ("msgspec", re.compile(r"^_core\.cpython")),
    ("httptools (llhttp)", re.compile(r"^(parser|url_parser)\.cpython")),
    ("protobuf (upb)", re.compile(r"_message\.|upb|protobuf")),
    ("numpy", re.compile(r"numpy|_multiarray|libopenblas")),
    ("libc", re.compile(r"^libc\.")),
    ("asyncio C accelerator", re.compile(r"^_asyncio")),
]
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
    """kind -> a process of that kind: front (Kernel's `kernel serve`) and worker, or tritonserver
    and stub (benchmarks/procs.py tells them apart; `side` is kept for the callers)."""
    from procs import OTHER, classify

    return {kind: pid for pid, kind in classify(srv.main_pid).items() if kind != OTHER}


CLIENT_PREFIX: list[str] = []  # ["taskset", "-c", CPUS] with --pin


def pin_server(root_pid: int, cpus: set[int]) -> int:
    """Every thread of the server and its descendants onto CPUS; returns how many threads."""
    from procs import descendants

    n = 0
    for pid in descendants(root_pid):
        for t in Path(f"/proc/{pid}/task").iterdir():
            try:
                os.sched_setaffinity(int(t.name), cpus)
                n += 1
            except OSError:
                pass
    return n


def perf(srv, protocol: str, seconds: float, logs: Path, tag: str) -> dict:
    with tempfile.TemporaryDirectory() as td:
        csv = Path(td) / "pa.csv"
        cmd = [*CLIENT_PREFIX, *peers.perf_cmd(), "-m", "add_sub", "-u", f"localhost:{srv.port(protocol)}", "-i", protocol,
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


def classify(raw: Path, role: str = "front") -> dict:
    hops = WORKER_HOPS if role in ("worker", "stub") else FRONT_HOPS
    buckets: Counter = Counter()
    in_syscall = 0
    total = idle = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        # Without --native, a thread blocked in epoll (or busy inside the C event loop with no
        # Python callback running) shows only the loop's entry frame: not attributable, left out.
        if any(IDLE.search(fr) for fr in frames[-4:]) or LOOP_LEAF.search(frames[-1]):
            idle += n
            continue
        total += n
        leaf = frames[-1] if frames else ""
        if SYSCALL_LEAF.match(leaf.strip()):
            in_syscall += n
        name = None
        for fr in reversed(frames):
            for label, rx in hops:
                if rx.search(fr):
                    name = label
                    break
            if name:
                break
        buckets[name or "other (interpreter, native, unattributed)"] += n
    return {"samples": total, "idle_samples": idle, "in_syscall_leaf": in_syscall, "buckets": dict(buckets.most_common())}


def perf_report(data: Path) -> dict:
    """Linux perf samples (on-CPU only) of one process, by shared object and, in the kernel, by purpose."""
    rep = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,sym", "--stdio", "-g", "none",
                          "--percent-limit", "0"], capture_output=True, text=True)
    dso: Counter = Counter()
    kern: Counter = Counter()
    syms: Counter = Counter()
    for ln in rep.stdout.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)$", ln)
        if not m:
            continue
        pct, lib, kind, sym = float(m.group(1)), m.group(2), m.group(3), m.group(4).strip()
        name = next((label for label, rx in DSO_NAMES if rx.search(lib)), lib if lib != "[unknown]" else "unknown (JIT/stripped)")
        dso[name] += pct
        syms[f"{sym} [{lib}]"] += pct
        if kind == "k":
            kern[next((label for label, rx in KERNEL_GROUPS if rx.search(sym)), "other kernel")] += pct
    return {"by_dso": {k: round(v, 1) for k, v in dso.most_common()},
            "kernel": {k: round(v, 1) for k, v in kern.most_common()},
            "top_symbols": {k: round(v, 1) for k, v in syms.most_common(12)}}


def pyspy_run(srv, side, protocol, args, logs) -> dict:
    pyspy = shutil.which("py-spy") or str(ROOT / ".venv" / "bin" / "py-spy")
    procs = server_procs(srv, side)
    spies = {}
    for k, pid in procs.items():
        out = logs / f"pyspy_{side.lower()}_{protocol}_{k}.txt"
        # --nonblocking: sampling without pausing the process. --native pauses it for every sample and,
        # measured here, slows Kernel's HTTP path from ~1,100 to ~66 infer/s, which distorts the profile.
        mode = ["--native"] if args.native else ["--nonblocking"]
        cmd = [pyspy, "record", *mode, "--full-filenames", "-r", str(args.rate), "-f", "raw", "-o", str(out),
               "-p", str(pid), "-d", str(int(args.seconds + 3))]
        spies[k] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), out)
    perfs = {}
    if shutil.which("perf") and not args.no_perf:
        for k, pid in procs.items():
            data = logs / f"perf_{side.lower()}_{protocol}_{k}.data"
            perfs[k] = (subprocess.Popen(["perf", "record", "-F", "999", "-o", str(data), "-p", str(pid), "--",
                                          "sleep", str(int(args.seconds))], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL), data)
    time.sleep(1.0)
    pa = perf(srv, protocol, args.seconds, logs, f"{side.lower()}_{protocol}_pyspy")
    res = {"perf_under_pyspy": pa, "linux_perf": {}}
    for k, (p, data) in perfs.items():
        p.wait(timeout=60)
        res["linux_perf"][k] = perf_report(data) if data.exists() else {"error": "no perf data"}
    for k, (p, out) in spies.items():
        _, err = p.communicate(timeout=60)
        res[k] = classify(out, k) if out.exists() else {"error": err[-400:]}
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
        proto, _, pin = proto.partition("+")
        if pin:
            side += f" (pinned: server CPUs {pin.split(':')[0]}, client CPUs {pin.split(':')[1]})"
        c = r["clean"]
        md.append(f"### {side} {proto.upper()} c=1 ({r.get('started', '')}): {c['perf']['infer_per_s']:,.0f} infer/s, p50 {c['perf']['p50_us']:,.0f} µs, "
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
        for k, lp in r.get("pyspy", {}).get("linux_perf", {}).items():
            if "by_dso" not in lp:
                continue
            cpu = c["procs"].get(k, {}).get("cpu_us", 0)
            md.append(f"Linux perf (on-CPU samples), {side} {proto.upper()} {k}: µs/request = share × {cpu:.0f} µs CPU\n")
            md.append("| where (shared object) | share | µs/request |")
            md.append("| --- | ---: | ---: |")
            for name, pct in lp["by_dso"].items():
                if pct >= 0.5:
                    md.append(f"| {name} | {pct:.0f}% | {pct / 100 * cpu:.0f} |")
            for name, pct in lp["kernel"].items():
                if pct >= 0.5:
                    md.append(f"| &nbsp;&nbsp;kernel: {name} | {pct:.0f}% | {pct / 100 * cpu:.0f} |")
            md.append("\ntop symbols: " + ", ".join(f"{s_} {v:.0f}%" for s_, v in list(lp["top_symbols"].items())[:8]) + "\n")
        for k, prof in r.get("pyspy", {}).items():
            if k in ("perf_under_pyspy", "linux_perf") or "buckets" not in prof:
                continue
            cpu = c["procs"].get(k, {}).get("cpu_us", 0)
            under = r["pyspy"]["perf_under_pyspy"]
            md.append(f"py-spy ({under.get('infer_per_s') or 0:,.0f} infer/s while sampled), {side} {proto.upper()} {k}: {prof['samples']} busy samples ({prof.get('idle_samples', 0)} idle "
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
    ap.add_argument("--native", action="store_true", help="py-spy --native (pauses the process per sample: distorts)")
    ap.add_argument("--no-strace", action="store_true")
    ap.add_argument("--no-perf", action="store_true", help="skip Linux perf record (on-CPU samples by shared object)")
    ap.add_argument("--ports", type=int, nargs=3, default=[28300, 28301, 28302])
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--pin", metavar="SERVER:CLIENT",
                    help="CPU lists, e.g. 0:1: every server thread (front and workers) on SERVER, perf_analyzer on CLIENT")
    ap.add_argument("--retable", action="store_true",
                    help="measure nothing: re-classify the saved py-spy profiles and rewrite the tables")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.retable:
        result = json.loads((out / "latency_budget.json").read_text())
        for key, r in result["runs"].items():
            side, proto = key.split("/")
            proto = proto.partition("+")[0]
            for k, prof in r.get("pyspy", {}).items():
                raw = out / "latency_budget" / f"pyspy_{side.lower()}_{proto}_{k}.txt"
                if k not in ("perf_under_pyspy", "linux_perf") and raw.exists():
                    r["pyspy"][k] = classify(raw, k)
        (out / "latency_budget.json").write_text(json.dumps(result, indent=1) + "\n")
        md = f"# Latency budget tables ({result['started']}; generated by `{result['command']}`)\n\n" + tables(result)
        (out / "latency_budget_tables.md").write_text(md)
        print(md)
        return 0
    logs = out / "latency_budget"
    logs.mkdir(parents=True, exist_ok=True)
    peers.ensure()
    server_cpus: set[int] = set()
    client_cpus = ""
    if args.pin:
        srv_list, _, client_cpus = args.pin.partition(":")
        server_cpus = {int(x) for x in srv_list.split(",")}
        CLIENT_PREFIX[:] = ["taskset", "-c", client_cpus]
    result = {"started": time.strftime("%Y-%m-%d %H:%M %Z"), "command": shlex.join(["python", *sys.argv]),
              "settings": vars(args), "runs": {}}
    try:  # runs of other (server, protocol) pairs from an earlier invocation are kept; each run has its date
        result["runs"].update(json.loads((out / "latency_budget.json").read_text()).get("runs", {}))
    except (OSError, ValueError):
        pass
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
                if args.pin:
                    n = pin_server(srv.main_pid, server_cpus)
                    print(f"  pinned {n} server threads to CPUs {sorted(server_cpus)}; client on {client_cpus}", file=sys.stderr)
                perf(srv, proto, 1.0, logs, "warmup")
                r = {"started": time.strftime("%Y-%m-%d %H:%M %Z"), "clean": clean_run(srv, side, proto, args, logs)}
                print(f"{side} {proto}: {json.dumps(r['clean']['procs'])} p50 {r['clean']['perf']['p50_us']:.0f}",
                      file=sys.stderr, flush=True)
                if not args.no_pyspy:
                    r["pyspy"] = pyspy_run(srv, side, proto, args, logs)
                if not args.no_strace:
                    r["strace"] = strace_run(srv, side, proto, args, logs)
                result["runs"][f"{side}/{proto}" + (f"+{args.pin}" if args.pin else "")] = r
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

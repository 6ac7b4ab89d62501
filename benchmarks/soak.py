"""Soak: mixed load, worker kills and a stream of malformed requests against one `kernel serve`.

For `--seconds` (default 600) it runs, all on 127.0.0.1:

- HTTP infer (KServe v2 JSON) on add_sub and add_sub_x2 (two instances), `--http-clients` loops;
- gRPC infer on both, `--grpc-clients` loops;
- gRPC streaming on a decoupled model (several responses per request), one loop;
- a malformed-request loop cycling through the attacks of tests/hostile (bad parameters and
  data, deep JSON, bad framing and gzip, oversized and slow headers, half-sent bodies,
  bad shared-memory registrations and a shrunk region, hostile load requests);
- a SIGKILL of one model worker every `--kill-every` seconds;
- with --ownership (on by default), the loops of benchmarks/soak_ownership.py (issue 23):
  buffer-reusing models whose every answer is checked byte for byte, slow readers and stalled
  uploads that the server must cut once --client-stall-timeout-secs / --http-body-timeout-secs pass;
- with --attacks (all by default), the attacks of issue 31 from benchmarks/soak_attacks.py (many-member
  gzip bodies on HTTP and gRPC, OpenAI n fan-out with a big prompt, OpenAI clients that never read,
  runaway chat templates, large embeddings, large and forged Redis cache entries; the server then
  also serves the OpenAI API and a Redis response cache from a redis-server started here), and a
  probe of /v2/health/live from its own process throughout.

Every request is accounted for: answered (by status / error kind) or lost (no answer at all
within 60 s: a timeout or a connection dropped without a response). Every 10 s it samples the
front process's RSS, its open memfd segments and /dev/shm, and each process's (front and workers)
RSS and shared memory. At the end each model must still
answer (no wedged model), the server must stop within its exit timeout, /dev/shm must hold
nothing new, and with --attacks the health checks' p99 must stay under --health-p99-ms and the
front's RSS under the bound soak_attacks.rss_bound_mb states. Writes benchmarks/results/soak.md and
soak.json.

    .venv/bin/python benchmarks/soak.py --seconds 600

Not part of `make test`: it takes minutes and most of the box.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gzip
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ADD_SUB = HERE / "model_repo" / "add_sub"
SOAK_MODELS = HERE / "model_repo_soak"  # the buffer-reusing and large-answer models of soak_ownership.py
STREAM_MODEL = ROOT / "tests" / "models" / "good" / "repeat_int32"
LOST_AFTER_S = 60.0

ADD_SUB_BODY = {"inputs": [{"name": n, "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}
                           for n in ("INPUT0", "INPUT1")]}


# --------------------------------------------------------------------------- accounting


class Ledger:
    """Requests sent, and what became of each: answered (by kind) or lost."""

    def __init__(self) -> None:
        self.sent = collections.Counter()  # stream -> count
        self.answered = collections.Counter()
        self.lost = collections.Counter()
        self.kinds = collections.Counter()  # (stream, kind) -> count
        self.examples: dict[tuple[str, str], str] = {}

    def send(self, stream: str) -> None:
        self.sent[stream] += 1

    def answer(self, stream: str, kind: str, example: str = "") -> None:
        self.answered[stream] += 1
        self.kinds[(stream, kind)] += 1
        if example and (stream, kind) not in self.examples:
            self.examples[(stream, kind)] = example[:160]

    def lose(self, stream: str, why: str) -> None:
        self.lost[stream] += 1
        self.kinds[(stream, f"LOST: {why}")] += 1


def kind_of(status: int, message: str) -> str:
    if status == 200:
        return "200 ok"
    if "not healthy" in message or "Stub process" in message or "stopped" in message:
        return f"{status} worker killed"
    return f"{status}"


# --------------------------------------------------------------------------- the server


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def make_repo(root: Path, attacks: list[str], scale: float) -> tuple[Path, list[str]]:
    repo = root / "repo"
    repo.mkdir()
    shutil.copytree(ADD_SUB, repo / "add_sub")
    x2 = repo / "add_sub_x2"
    shutil.copytree(ADD_SUB, x2)
    text = (x2 / "config.pbtxt").read_text().replace('name: "add_sub"', 'name: "add_sub_x2"')
    (x2 / "config.pbtxt").write_text(text.replace("count: 1", "count: 2"))
    shutil.copytree(STREAM_MODEL, repo / "repeat_int32")
    for model in SOAK_MODELS.iterdir():
        shutil.copytree(model, repo / model.name)
    from soak_attacks import add_models

    return repo, add_models(repo, attacks, scale)


def worker_pids(server_pid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != server_pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"kernel.backends.python.worker" in f.read():
                    pids.append(int(entry))
        except (OSError, ValueError, IndexError):
            pass
    return pids


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def peak_rss_mb(pid: int) -> float:
    """The process's peak RSS so far (VmHWM): what 10 s samples miss between them."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def memfds(pid: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:")
        except OSError:
            pass
    return n


def memory_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, RssShmem) of a process in KiB: its resident memory, and how much of that is shared memory."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssShmem"):
                fields[key] = int(rest.split()[0])
    return fields.get("VmRSS", 0), fields.get("RssShmem", 0)


def dev_shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


# Made by real tritonserver's Python backend, which other work on a shared box runs: never Kernel's
# (Kernel's worker arenas are memfds and leave nothing in /dev/shm).
FOREIGN_SHM_PREFIXES = ("triton_python_backend_shm_region_",)


def split_residue(names: list[str]) -> tuple[list[str], list[str]]:
    """(entries that could be this server's, entries other programs made) among new /dev/shm names."""
    foreign = [n for n in names if n.startswith(FOREIGN_SHM_PREFIXES)]
    return [n for n in names if n not in foreign], foreign


# --------------------------------------------------------------------------- load loops


class Soak:
    def __init__(self, args, http_port: int, grpc_port: int, server: subprocess.Popen, openai_port: int = 0,
                 redis_port: int = 0):
        self.args = args
        self.http = f"http://127.0.0.1:{http_port}"
        self.grpc = f"127.0.0.1:{grpc_port}"
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.server = server
        self.ledger = Ledger()
        self.deadline = 0.0
        self.kills = 0
        self.samples: list[dict] = []
        self.openai_port = openai_port
        self.redis_port = redis_port

    def running(self) -> bool:
        return time.monotonic() < self.deadline and self.server.poll() is None

    async def http_loop(self, i: int) -> None:
        async with httpx.AsyncClient(timeout=LOST_AFTER_S) as client:
            while self.running():
                model = ("add_sub", "add_sub_x2")[i % 2]
                self.ledger.send("http")
                try:
                    r = await client.post(f"{self.http}/v2/models/{model}/infer", json=ADD_SUB_BODY)
                except httpx.TimeoutException:
                    self.ledger.lose("http", "no answer in 60 s")
                    continue
                except httpx.HTTPError as exc:
                    self.ledger.lose("http", type(exc).__name__)
                    await asyncio.sleep(0.05)
                    continue
                message = r.json().get("error", "") if r.status_code != 200 else ""
                if r.status_code == 200 and r.json()["outputs"][0]["data"] != [2, 4, 6, 8]:
                    self.ledger.answer("http", "200 WRONG ANSWER")
                else:
                    self.ledger.answer("http", kind_of(r.status_code, message), message)

    async def grpc_loop(self, i: int) -> None:
        import tritonclient.grpc.aio as grpcclient
        from tritonclient.utils import InferenceServerException

        client = grpcclient.InferenceServerClient(self.grpc)
        a = np.array([1, 2, 3, 4], np.float32)
        try:
            while self.running():
                model = ("add_sub", "add_sub_x2")[i % 2]
                inputs = [grpcclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
                for t in inputs:
                    t.set_data_from_numpy(a)
                self.ledger.send("grpc")
                try:
                    result = await client.infer(model, inputs, client_timeout=LOST_AFTER_S)
                    ok = result.as_numpy("OUTPUT0").tolist() == [2, 4, 6, 8]
                    self.ledger.answer("grpc", "OK" if ok else "OK WRONG ANSWER")
                except InferenceServerException as exc:
                    status, message = str(exc.status()), exc.message() or ""
                    if "DEADLINE_EXCEEDED" in status:
                        self.ledger.lose("grpc", "no answer in 60 s")
                    elif "UNAVAILABLE" in status and ("connect" in message or "Socket closed" in message):
                        self.ledger.lose("grpc", f"{status}: {message[:60]}")  # the transport failed, not the server
                    else:
                        kind = "worker killed" if "not healthy" in message else ""
                        self.ledger.answer("grpc", f"{status} {kind}".strip(), message)
        finally:
            await client.close()

    async def stream_loop(self) -> None:
        # The sync client in a thread: only it can ask for the empty final response
        # (enable_empty_final_response) that tells a decoupled request is complete.
        await asyncio.get_running_loop().run_in_executor(None, self._stream_thread)

    def _stream_thread(self) -> None:
        import queue

        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(self.grpc)
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            k = 0
            while self.running():
                k += 1
                n = random.randint(1, 5)
                t = grpcclient.InferInput("IN", [n], "INT32")
                t.set_data_from_numpy(np.arange(n, dtype=np.int32))
                self.ledger.send("stream")
                client.async_stream_infer("repeat_int32", [t], request_id=str(k), enable_empty_final_response=True)
                got, outcome, deadline = 0, None, time.monotonic() + LOST_AFTER_S
                while outcome is None:
                    try:
                        result, error = answers.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        self.ledger.lose("stream", "no final response in 60 s")
                        outcome = "lost"
                        break
                    if error is not None:
                        message = str(error)
                        self.ledger.answer("stream", "worker killed" if "not healthy" in message else "error", message)
                        outcome = "error"
                    elif result.get_response().parameters["triton_final_response"].bool_param:
                        self.ledger.answer("stream", "OK" if got == n else f"INCOMPLETE {got}/{n}")
                        outcome = "ok"
                    else:
                        got += 1
                if outcome != "ok":  # start afresh: whatever is still in flight on this stream is dropped
                    client.stop_stream(cancel_requests=True)
                    answers = queue.Queue()
                    client.start_stream(callback=lambda result, error, q=answers: q.put((result, error)))
        finally:
            client.stop_stream(cancel_requests=True)
            client.close()

    # ---- malformed requests ----------------------------------------------------

    def attacks(self) -> list[tuple[str, object]]:
        def infer(body, headers=None, model="add_sub"):
            return ("POST", f"/v2/models/{model}/infer", body, headers or {})

        seq = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                          {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
        bad_params = [2**64, None, True, 1.5, [1], {}]
        out = [(f"sequence_id={v!r}", infer({**seq, "parameters": {"sequence_id": v}}, model="add_sub_x2"))
               for v in bad_params]
        out += [
            ("priority=high", infer({**seq, "parameters": {"priority": "high"}})),
            ("timeout=soon", infer({**seq, "parameters": {"timeout": "soon"}})),
            ("FP32 data '1'", infer({"inputs": [{**seq["inputs"][0], "data": ["1", 2, 3, 4]}, seq["inputs"][1]]})),
            ("100-dim shape", infer({"inputs": [{**seq["inputs"][0], "shape": [1] * 98 + [2, 2]}, seq["inputs"][1]]})),
            ("deep JSON", infer(b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":'
                                + b"[" * 50000 + b"]" * 50000 + b"}]}")),
            ("IHCL +5", infer(b'{"inputs":[]}', {"Inference-Header-Content-Length": "+5"})),
            ("gzip junk", infer(gzip.compress(json.dumps(seq).encode()) + b"junk", {"Content-Encoding": "gzip"})),
            ("shm bad key", ("POST", "/v2/systemsharedmemory/region/x/register",
                             {"key": "../../etc/passwd", "offset": 0, "byte_size": 8}, {})),
            ("load deep file:", ("POST", "/v2/repository/models/deep/load",
                                 {"parameters": {"config": "{}", "file:" + "a/" * 2000 + "x": "eA=="}}, {})),
            ("unknown model", infer(seq, model="no_such_model")),
        ]
        return out

    async def malformed_loop(self) -> None:
        attacks = self.attacks()
        async with httpx.AsyncClient(timeout=LOST_AFTER_S) as client:
            i = 0
            while self.running():
                name, (method, path, body, headers) = attacks[i % len(attacks)]
                i += 1
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.ledger.send("malformed")
                try:
                    r = await client.request(method, self.http + path, content=content, headers=headers)
                except httpx.TimeoutException:
                    self.ledger.lose("malformed", f"{name}: no answer")
                    continue
                except httpx.HTTPError as exc:
                    self.ledger.lose("malformed", f"{name}: {type(exc).__name__}")
                    continue
                expected = 400 <= r.status_code < 500
                self.ledger.answer("malformed", f"{r.status_code} {'(expected 4xx)' if expected else 'UNEXPECTED'}",
                                   f"{name}: {r.text}")
                if i % len(attacks) == 0:
                    await self.socket_attacks()
                await asyncio.sleep(0.02)

    async def socket_attacks(self) -> None:
        """Raw-socket attacks: an oversized header, and a half-sent body the client then drops."""
        loop = asyncio.get_running_loop()

        def big_header() -> str:
            with socket.create_connection(("127.0.0.1", self.http_port), timeout=30) as s:
                s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: ")
                try:
                    for _ in range(64):  # up to 4 MiB; the server stops it at its limit
                        s.sendall(b"a" * 65536)
                except OSError:
                    pass
                try:
                    return s.recv(64).split(b"\r\n")[0].decode()
                except OSError as exc:
                    return type(exc).__name__

        def half_body() -> str:
            with socket.create_connection(("127.0.0.1", self.http_port), timeout=30) as s:
                s.sendall(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{")
                return "dropped"

        for name, fn in (("oversized header", big_header), ("half-sent body, dropped", half_body)):
            self.ledger.send("malformed")
            status = await loop.run_in_executor(None, fn)
            self.ledger.answer("malformed", f"{name}: {status}")

    async def shrink_attack(self) -> None:
        """Register a shared-memory region, shrink its object, and use it: must be a 400."""
        key = f"/kernel-soak-{uuid.uuid4().hex[:8]}"
        fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, 65536)
            async with httpx.AsyncClient(timeout=LOST_AFTER_S) as c:
                await c.post(f"{self.http}/v2/systemsharedmemory/region/soak/register",
                             json={"key": key, "offset": 0, "byte_size": 65536})
                os.ftruncate(fd, 0)
                body = {"inputs": [{"name": n, "shape": [4], "datatype": "FP32", "parameters": {
                    "shared_memory_region": "soak", "shared_memory_offset": 1024, "shared_memory_byte_size": 16}}
                    for n in ("INPUT0", "INPUT1")]}
                self.ledger.send("malformed")
                r = await c.post(f"{self.http}/v2/models/add_sub/infer", json=body)
                self.ledger.answer("malformed", f"shrunk shm region: {r.status_code}", r.text)
                await c.post(f"{self.http}/v2/systemsharedmemory/region/soak/unregister")
        except httpx.HTTPError as exc:
            self.ledger.lose("malformed", f"shrunk shm region: {type(exc).__name__}")
        finally:
            os.close(fd)
            os.unlink(f"/dev/shm{key}")

    # ---- faults and samples ----------------------------------------------------

    async def kill_loop(self) -> None:
        while self.running():
            await asyncio.sleep(self.args.kill_every)
            if not self.running():
                return
            pids = worker_pids(self.server.pid)
            if pids:
                try:
                    os.kill(random.choice(pids), signal.SIGKILL)
                    self.kills += 1
                except ProcessLookupError:
                    pass
            await self.shrink_attack()

    async def sample_loop(self, start: float) -> None:
        while self.running():
            try:
                workers = worker_pids(self.server.pid)
                per_process = {}
                for pid in [self.server.pid, *workers]:
                    try:
                        per_process[str(pid)] = memory_kb(pid)
                    except OSError:
                        pass
                self.samples.append({
                    "t_s": round(time.monotonic() - start, 1), "rss_mb": round(rss_mb(self.server.pid), 1),
                    "memfds": memfds(self.server.pid), "workers": len(workers),
                    "dev_shm": len(dev_shm()), "sent": sum(self.ledger.sent.values()),
                    "processes": per_process,
                })
            except (OSError, StopIteration):
                pass
            await asyncio.sleep(10)

    async def run(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        # The blocking clients (gRPC streams, raw sockets) each take a thread for their whole run.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(64))
        start = time.monotonic()
        self.deadline = start + self.args.seconds
        tasks = [self.http_loop(i) for i in range(self.args.http_clients)]
        tasks += [self.grpc_loop(i) for i in range(self.args.grpc_clients)]
        tasks += [self.stream_loop(), self.malformed_loop(), self.kill_loop(), self.sample_loop(start)]
        if self.args.ownership:
            from soak_ownership import Ownership

            tasks += Ownership(self, self.args.stall_timeout, self.args.body_timeout).tasks()
        if self.args.attack_names:
            from soak_attacks import Attacks

            tasks += Attacks(self, self.args.attack_names, self.args.attack_scale, self.args.stall_timeout,
                             self.openai_port, self.redis_port).tasks()
        await asyncio.gather(*tasks)

    async def still_serving(self) -> dict[str, str]:
        """Each model answers a normal request within 30 s (nothing wedged)."""
        out = {}
        async with httpx.AsyncClient(timeout=30) as c:
            for model in ("add_sub", "add_sub_x2"):
                try:
                    r = await c.post(f"{self.http}/v2/models/{model}/infer", json=ADD_SUB_BODY)
                    out[model] = str(r.status_code)
                except httpx.HTTPError as exc:
                    out[model] = type(exc).__name__
            try:
                r = await c.post(f"{self.http}/v2/models/repeat_int32/generate_stream", json={"IN": [1, 2]})
                events = r.text.count("data:")
                out["repeat_int32"] = str(r.status_code) if events == 2 else f"{r.status_code} ({events} events)"
            except httpx.HTTPError as exc:
                out["repeat_int32"] = type(exc).__name__
        return out


# --------------------------------------------------------------------------- report


def write_report(out: Path, doc: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(doc, indent=2) + "\n")
    L = [f"# Soak: {doc['seconds']} s of mixed load, worker kills and malformed requests", "",
         f"`{doc['command']}` on {doc['when']} ({doc['cpus']} CPUs, shared with other work).", "",
         "| stream | sent | answered | lost |", "|---|---:|---:|---:|"]
    for stream in doc["sent"]:
        L.append(f"| {stream} | {doc['sent'][stream]} | {doc['answered'].get(stream, 0)} | {doc['lost'].get(stream, 0)} |")
    L.append(f"| **all** | {sum(doc['sent'].values())} | {sum(doc['answered'].values())} | "
             f"{sum(doc['lost'].values())} |")
    L += ["", "Answers by kind:", "", "| stream | kind | count | example |", "|---|---|---:|---|"]
    for row in doc["kinds"]:
        L.append(f"| {row['stream']} | {row['kind']} | {row['count']} | {row['example'].replace('|', '/')} |")
    s = doc["samples"]
    L += ["", f"Worker kills: {doc['kills']}. Server deaths: {doc['server_deaths']}. "
              f"Models answering at the end: {doc['still_serving']}.",
          f"Stop: exit code {doc['exit_code']} after {doc['stop_s']} s (--exit-timeout-secs {doc['exit_timeout']}).",
          f"/dev/shm: {len(doc['dev_shm_new_after_exit'])} new entries after exit"
          + (f" ({', '.join(doc['dev_shm_new_after_exit'])})" if doc["dev_shm_new_after_exit"] else "")
          + (f"; not counted, made by other programs on the box: {', '.join(doc['dev_shm_foreign'])}"
             if doc.get("dev_shm_foreign") else "") + ".", "",
          *_attack_lines(doc),
          "Front process over time:", "", "| t (s) | RSS (MB) | memfd segments | workers | /dev/shm entries | sent |",
          "|---:|---:|---:|---:|---:|---:|"]
    step = max(1, len(s) // 20)
    for x in s[::step] + ([s[-1]] if s and (len(s) - 1) % step else []):
        L.append(f"| {x['t_s']} | {x['rss_mb']} | {x['memfds']} | {x['workers']} | {x['dev_shm']} | {x['sent']} |")
    if s:
        L += ["", f"RSS: first {s[0]['rss_mb']} MB, max {max(x['rss_mb'] for x in s)} MB, last {s[-1]['rss_mb']} MB."]
        if doc.get("rss_bound_mb"):
            L += ["", f"Front RSS bound {doc['rss_bound_mb']:.0f} MB (the first sample + --max-held-output-bytes + "
                      "--max-held-input-bytes + what the Redis cache may hold, 260 MiB, + 512 MiB slack); "
                      f"peak (VmHWM) {doc.get('front_peak_rss_mb', 0)} MB."]
        L += ["", "Per process (the front, then each worker process seen; a killed worker's successor is a new row): "
                  "peak RSS and peak shared memory resident (RssShmem), MB:", "",
              "| pid | role | samples | peak RSS | peak shared | last RSS | last shared |", "|---:|---|---:|---:|---:|---:|---:|"]
        front = str(doc.get("server_pid", ""))
        seen: dict[str, list] = {}
        for x in s:
            for pid, (rss, shm) in x.get("processes", {}).items():
                seen.setdefault(pid, []).append((rss, shm))
        for pid, values in seen.items():
            L.append(f"| {pid} | {'front' if pid == front else 'worker'} | {len(values)} | "
                     f"{max(v[0] for v in values) / 1024:.0f} | {max(v[1] for v in values) / 1024:.0f} | "
                     f"{values[-1][0] / 1024:.0f} | {values[-1][1] / 1024:.0f} |")
    (out / "soak.md").write_text("\n".join(L) + "\n")


def _attack_lines(doc: dict) -> list[str]:
    if not doc.get("attacks"):
        return []
    h = doc.get("health", {})
    out = [f"Attacks (issue 31, benchmarks/soak_attacks.py, scale {doc['attack_scale']}): "
           f"{', '.join(doc['attacks'])}" + (f"; {doc['attack_note']}" if doc.get("attack_note") else "") + "."]
    if h.get("checks"):
        out.append(f"/v2/health/live from its own process, {h['checks']} checks: p50 {h['p50_ms']} ms, "
                   f"p99 {h['p99_ms']} ms (bound {doc['health_p99_bound_ms']} ms), max {h['max_ms']} ms, "
                   f"{h['over_100ms']} over 100 ms; worst 10 s from t={h['worst_window_s']} s "
                   f"(max {h['worst_window_max_ms']} ms).")
    return out + [""]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--http-clients", type=int, default=3)
    p.add_argument("--grpc-clients", type=int, default=2)
    p.add_argument("--kill-every", type=float, default=30.0, help="seconds between worker kills")
    p.add_argument("--exit-timeout", type=int, default=10)
    p.add_argument("--ownership", action=argparse.BooleanOptionalAction, default=True,
                   help="run the issue-23 loops of soak_ownership.py (buffer-reusing models, slow clients)")
    p.add_argument("--stall-timeout", type=float, default=10.0, help="the server's --client-stall-timeout-secs")
    p.add_argument("--body-timeout", type=float, default=10.0, help="the server's --http-body-timeout-secs")
    p.add_argument("--max-held-output", type=int, default=512 << 20, help="the server's --max-held-output-bytes")
    p.add_argument("--max-held-input", type=int, default=512 << 20, help="the server's --max-held-input-bytes")
    p.add_argument("--attacks", default="all",
                   help="issue 31's attacks (benchmarks/soak_attacks.py): all, none, or a comma-separated list")
    p.add_argument("--attack-scale", type=float, default=1.0, help="the attacks' sizes, times the issue's")
    p.add_argument("--health-p99-ms", type=float, default=100.0, help="with attacks: the bound on health-check p99")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--render", type=Path, metavar="SOAK_JSON", help="only rewrite soak.md from an earlier soak.json")
    args = p.parse_args()
    if args.render:
        doc = json.loads(args.render.read_text())
        if "dev_shm_foreign" not in doc:
            doc["dev_shm_new_after_exit"], doc["dev_shm_foreign"] = split_residue(doc["dev_shm_new_after_exit"])
        write_report(args.out, doc)
        print((args.out / "soak.md").read_text())
        return 0

    from soak_attacks import HealthProbe, rss_bound_mb, selected

    args.attack_names, attack_note = selected(args.attacks, shutil.which("redis-server") is not None)
    tmp = Path(tempfile.mkdtemp(prefix="kernel-soak-"))
    repo, attack_models = make_repo(tmp, args.attack_names, args.attack_scale)
    http_port, grpc_port, metrics_port, openai_port, redis_port = free_ports(5)
    shm_before = dev_shm()
    log = open(tmp / "server.log", "wb")
    cmd = [sys.executable, "-m", "kernel", "serve", "--model-repository", str(repo), "--http-port", str(http_port),
           "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
           "--exit-timeout-secs", str(args.exit_timeout), "--model-control-mode", "explicit",
           "--load-model", "add_sub", "--load-model", "add_sub_x2", "--load-model", "repeat_int32",
           "--client-stall-timeout-secs", str(args.stall_timeout), "--http-body-timeout-secs", str(args.body_timeout),
           "--max-held-output-bytes", str(args.max_held_output), "--max-held-input-bytes", str(args.max_held_input)]
    redis = probe = None
    if args.attack_names:
        cmd += ["--openai-port", str(openai_port)]
        for model in attack_models:
            cmd += ["--load-model", model]
    if "cached_big" in attack_models:
        redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--dir", str(tmp)], stdout=subprocess.DEVNULL)
        time.sleep(0.5)
        cmd += ["--cache-config", "redis,host=127.0.0.1", "--cache-config", f"redis,port={redis_port}"]
    if args.ownership:
        for model in sorted(SOAK_MODELS.iterdir()):
            cmd += ["--load-model", model.name]
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None:
                raise SystemExit(f"server exited: {(tmp / 'server.log').read_text()[-2000:]}")
            time.sleep(0.2)
        soak = Soak(args, http_port, grpc_port, server, openai_port, redis_port)
        if args.attack_names:
            probe = HealthProbe(http_port, tmp / "health.txt")
        asyncio.run(soak.run())
        health = probe.stop() if probe is not None else {}
        peak_mb = peak_rss_mb(server.pid) if server.poll() is None else 0.0
        deaths = 0 if server.poll() is None else 1
        serving = asyncio.run(soak.still_serving()) if not deaths else {}
        start = time.monotonic()
        server.send_signal(signal.SIGINT)
        try:
            code = server.wait(args.exit_timeout + 30)
        except subprocess.TimeoutExpired:
            server.kill()
            code = server.wait()
        stop_s = round(time.monotonic() - start, 1)
        time.sleep(0.5)
        new_shm, foreign_shm = split_residue(sorted(dev_shm() - shm_before))
        L = soak.ledger
        doc = {
            "seconds": args.seconds, "command": " ".join(["benchmarks/soak.py", *sys.argv[1:]]),
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
            "sent": dict(L.sent), "answered": dict(L.answered), "lost": dict(L.lost),
            "kinds": [{"stream": s, "kind": k, "count": n, "example": L.examples.get((s, k), "")}
                      for (s, k), n in sorted(L.kinds.items()) if n],
            "kills": soak.kills, "server_deaths": deaths, "still_serving": serving, "exit_code": code,
            "stop_s": stop_s, "exit_timeout": args.exit_timeout, "dev_shm_new_after_exit": new_shm,
            "dev_shm_foreign": foreign_shm, "server_pid": server.pid,
            "samples": soak.samples,
            "attacks": args.attack_names, "attack_scale": args.attack_scale, "attack_note": attack_note,
            "health": health, "health_p99_bound_ms": args.health_p99_ms, "front_peak_rss_mb": round(peak_mb, 1),
            "rss_bound_mb": rss_bound_mb(soak.samples[0]["rss_mb"], args.max_held_output, args.max_held_input)
            if args.attack_names and soak.samples else 0,
        }
        write_report(args.out, doc)
        print((args.out / "soak.md").read_text())
        wrong = sum(n for (_, kind), n in L.kinds.items() if "WRONG" in kind or "HELD PAST" in kind)
        ok = (not sum(L.lost.values()) and not deaths and all(v == "200" for v in serving.values())
              and not new_shm and not wrong)
        if args.attack_names:
            ok = ok and health.get("p99_ms", float("inf")) <= args.health_p99_ms and (
                not doc["rss_bound_mb"] or max(peak_mb, *(x["rss_mb"] for x in soak.samples)) <= doc["rss_bound_mb"])
        return 0 if ok else 1
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        if probe is not None and probe.proc.poll() is None:
            probe.proc.kill()
        if redis is not None:
            redis.kill()
            redis.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

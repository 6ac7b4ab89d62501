"""The Python backend's request path alone: a change's cost at c=1 and c=16, and fronts merging batches.

Why: issue 32 puts links to other front processes into the worker and the front's request path;
a single front must not pay for them. Through HTTP or gRPC the front's transport work dominates
and moves with the box's load; this drives WorkerInstance itself (and LinkedInstances over links
1 and 2), in one process, against benchmarks/model_repo/add_sub: submit -> worker -> response,
nothing else. Figures: c=1 latency (p50) and c=16 throughput, with the CPU per request of this
process (the front's backend side) and of the worker, from /proc.

    .venv/bin/python benchmarks/worker_links.py ab --a /tmp/before-tree --b . --rounds 5
    .venv/bin/python benchmarks/worker_links.py ab --what hotpath --a /tmp/before-tree --b . --rounds 2
    .venv/bin/python benchmarks/worker_links.py merge     # batch sizes: one front vs fronts over links

`ab` runs each side in its own process with that tree's code (the editable finder pointed at it,
as benchmarks/backend_ab.py does; the worker processes inherit it), alternating A, B, A, B.
`--what hotpath` runs each side's per-request Python work without processes or sockets (a worker
and a WorkerInstance over fake channels that still encode), timed and counted in bytecodes: on a
box others load, only the count is exact.
`merge` feeds the dynamically batched add_sub (benchmarks/model_repo_batching) from fronts that
batch as the core's DynamicBatcher does (one batch in flight per front and instance, whatever
queued meanwhile, up to max_batch_size) and reports the batch sizes the worker ran.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from backend_ab import SITECUSTOMIZE  # noqa: E402

def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of the process so far, in nanosecond resolution (schedstat: ticks
    would be too coarse for a few seconds' run)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def source(repo: Path, max_batch_size: int, batching: bool):
    from kernel.core.backend import ModelSource

    io = [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("INPUT0", "INPUT1")]
    config = {"name": "add_sub", "backend": "python", "max_batch_size": max_batch_size, "input": io,
              "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("OUTPUT0", "OUTPUT1")]}
    if batching:
        config["dynamic_batching"] = {}
    return ModelSource("add_sub", 1, repo / "add_sub", repo / "add_sub" / "1", repo,
                       SimpleNamespace(default_model_filename=""), json.dumps(config))


def make_request(batch: int = 0):
    import numpy as np

    from kernel.core.request import InferRequest, InferTensor

    shape = [batch, 4] if batch else [4]
    data = np.arange(4 * max(1, batch), dtype=np.float32).tobytes()
    r = InferRequest("add_sub", "", "", [InferTensor("INPUT0", "FP32", shape, raw=data),
                                         InferTensor("INPUT1", "FP32", shape, raw=data)])
    r.arrival_ns = time.monotonic_ns()
    return r


async def one(inst, batch: int = 0):
    r = make_request(batch)
    done = asyncio.get_running_loop().create_future()
    r.on_response = lambda response: done.done() or done.set_result(response)
    inst.submit([r])
    response = await done
    assert response.error is None, response.error
    return response


# ---- ab: one side, one round --------------------------------------------------------------------


async def round_(n: int) -> dict:
    from kernel.backends.python.instance import WorkerInstance, WorkerSettings

    inst = WorkerInstance(source(HERE / "model_repo", 0, False), "add_sub_0_0", "KIND_CPU", 0, WorkerSettings())
    await inst.start()
    try:
        pid = inst.process.pid
        for _ in range(500):
            await one(inst)
        out = {}
        latencies = []
        f0, w0 = cpu_seconds(os.getpid()), cpu_seconds(pid)
        for _ in range(n):
            t = time.perf_counter()
            await one(inst)
            latencies.append(time.perf_counter() - t)
        out["c1_p50_us"] = statistics.median(latencies) * 1e6
        out["c1_front_us"] = (cpu_seconds(os.getpid()) - f0) / n * 1e6
        out["c1_worker_us"] = (cpu_seconds(pid) - w0) / n * 1e6

        async def client(k):
            for _ in range(k):
                await one(inst)

        f0, w0, t0 = cpu_seconds(os.getpid()), cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(client(n // 16) for _ in range(16)))
        elapsed = time.perf_counter() - t0
        total = n // 16 * 16
        out["c16_rps"] = total / elapsed
        out["c16_front_us"] = (cpu_seconds(os.getpid()) - f0) / total * 1e6
        out["c16_worker_us"] = (cpu_seconds(pid) - w0) / total * 1e6
        return out
    finally:
        await inst.stop(5)


# ---- hotpath: the per-request Python work of each side, without processes or sockets ---------------


class _Channel:
    """Encodes what is sent, as the real channel does, and keeps the last message; never blocks."""

    closed = False
    direct = direct_writes = False
    transport = None

    def __init__(self):
        import threading

        import msgspec

        self.lock = threading.RLock()
        self._encoder = msgspec.msgpack.Encoder()
        self.last = None

    def send(self, message) -> None:
        self._encoder.encode(message)
        self.last = message

    def can_go_direct(self) -> bool:
        return True

    def set_direct(self, direct: bool, writes: bool = True) -> None:
        self.direct = direct


def _best(fn, n: int, repeats: int) -> float:
    """The fastest of `repeats` runs of fn() n times, per call, in ns (the least disturbed by others)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - t) / n)
    return best


async def hotpath(n: int) -> dict:
    import socket
    import threading

    import numpy as np

    from kernel.backends.python import messages
    from kernel.backends.python.instance import WorkerInstance, WorkerSettings
    from kernel.backends.python.model_thread import ModelThread
    from kernel.backends.python.worker import Worker

    loop = asyncio.get_running_loop()
    repo = HERE / "model_repo"
    src = source(repo, 0, False)
    ends = [*socket.socketpair(), *socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)]
    worker = Worker(ends[0], ends[2], str(repo / "add_sub" / "1" / "model.py"), "add_sub_0_0", 1 << 20, 1 << 20)
    worker.loop, worker._loop_thread = loop, threading.get_ident()
    worker.model_thread, worker.done = ModelThread(loop), loop.create_future()
    worker.arenas.start(loop)
    worker.channel = _Channel()
    await worker.initialize(messages.Initialize({
        "model_config": src.config_json, "model_instance_kind": "CPU", "model_instance_name": "add_sub_0_0",
        "model_instance_device_id": "0", "model_repository": str(repo / "add_sub"), "model_version": "1",
        "model_name": "add_sub"}))
    data = np.arange(4, dtype=np.float32).tobytes()
    keys = iter(range(256, 1 << 60, 256))

    def worker_request():
        key = next(keys)
        worker.on_message(messages.Execute([messages.Request(
            key, "", [messages.Tensor("INPUT0", "FP32", [4], data), messages.Tensor("INPUT1", "FP32", [4], data)],
            [], 0, 0, "{}", 1)]))
        worker._flush()  # (what the loop runs next: one message for the response and the execution)

    inst = WorkerInstance(src, "add_sub_0_0", "KIND_CPU", 0, WorkerSettings())
    inst.healthy, inst.channel = True, _Channel()
    out = [messages.Tensor("OUTPUT0", "FP32", [4], data), messages.Tensor("OUTPUT1", "FP32", [4], data)]
    now = time.monotonic_ns()

    def front_request():
        r = make_request()
        r.on_response = lambda response: None
        inst.submit([r])
        key = inst.channel.last.requests[0].key
        inst._on_message(messages.Responses([messages.Response(key, out)],
                                            [messages.Execution(1, now, now, now, now, 1, [1], [1], [], 0)]))

    for _ in range(2000):
        worker_request()
        front_request()
    return {"worker_ns": _best(worker_request, n, 7), "front_ns": _best(front_request, n, 7),
            "worker_ops": _opcodes(worker_request, 200), "front_ops": _opcodes(front_request, 200)}


def _opcodes(fn, n: int) -> float:
    """Python bytecode instructions per call of fn (sys.settrace's opcode events): what a change adds
    to the Python-level work, counted exactly where timings on a loaded box are not to be trusted.
    (C-level work, as msgspec's encoding or numpy's, is not counted.)"""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        frame.f_trace_opcodes = True
        if event == "opcode":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        for _ in range(n):
            fn()
    finally:
        sys.settrace(None)
    return count / n


def ab(args) -> None:
    with tempfile.TemporaryDirectory(prefix="worker_links_site_") as site:
        Path(site, "sitecustomize.py").write_text(SITECUSTOMIZE)
        _ab(args, site)


def _ab(args, site: str) -> None:
    if args.what == "round":
        keys = ("c1_p50_us", "c1_front_us", "c1_worker_us", "c16_rps", "c16_front_us", "c16_worker_us")
    else:
        keys = ("worker_ns", "front_ns", "worker_ops", "front_ops")
    results: dict[str, list] = {"A": [], "B": []}
    for rnd in range(args.rounds):
        for side, tree in (("A", args.a), ("B", args.b)):
            env = dict(os.environ, KERNEL_AB_TREE=str(Path(tree).resolve()), PYTHONPATH=site, KERNEL_STANDBY_WORKERS="0")
            out = subprocess.run([sys.executable, __file__, args.what, "--n", str(args.n)], env=env, check=True,
                                 capture_output=True, text=True, timeout=600).stdout
            r = json.loads(out.strip().splitlines()[-1])
            assert r["tree"] == str(Path(tree).resolve()), (r["tree"], tree)  # that side's code ran
            results[side].append(r)
            print(f"round {rnd + 1} {side}: " + ", ".join(f"{k} {r[k]:.1f}" for k in keys)
                  + f" (load {os.getloadavg()[0]:.1f})", flush=True)
    for side in ("A", "B"):
        med = {k: statistics.median(r[k] for r in results[side]) for k in keys}
        print(f"median {side}: " + ", ".join(f"{k} {med[k]:.1f}" for k in keys))
    # Each round's B against the A run just before it: the box's load drifts less within a pair.
    ratios = {k: statistics.median(b[k] / a[k] for a, b in zip(results["A"], results["B"])) for k in keys}
    print("median B/A per round: " + ", ".join(f"{k} {ratios[k]:.3f}" for k in keys))


# ---- merge: fronts feeding one dynamically batched worker ------------------------------------------


class FrontBatcher:
    """What the core's DynamicBatcher does for one front, with no delay: one batch in flight per
    instance; whatever queued meanwhile goes as the next batch, up to max_batch_size."""

    def __init__(self, inst, max_batch_size: int):
        self.inst = inst
        self.max = max_batch_size
        self.queue: list = []
        inst.on_available = lambda _: self.pump()

    def submit(self, request) -> None:
        self.queue.append(request)
        self.pump()

    def pump(self) -> None:
        if self.queue and self.inst.executing == 0:
            batch, self.queue = self.queue[:self.max], self.queue[self.max:]
            self.inst.submit(batch)


async def merge(args) -> None:
    from kernel.backends.python.backend import PythonBackend
    from kernel.backends.python.instance import WorkerInstance, WorkerSettings
    from kernel.core.stats import ModelStats

    class Stats(ModelStats):
        __slots__ = ("merged",)

        def record_execution(self, e) -> None:
            super().record_execution(e)
            self.merged = getattr(self, "merged", 0) + (1 if e.merged_batch_size and e.lead else 0)

    src = source(HERE / "model_repo_batching", 64, True)
    for fronts, links, c in ((1, 0, 48), (3, 2, 16), (2, 2, 24)):
        worker = WorkerInstance(src, "add_sub_0_0", "KIND_CPU", 0, WorkerSettings())
        await worker.start()
        linked = []
        try:
            if links:
                linked = await PythonBackend().linked_instances(
                    src, [(n, *worker.open_link(n), worker.facts()) for n in range(1, links + 1)])
            insts = ([worker] + linked)[-fronts:] if fronts <= links else [worker] + linked
            for inst in insts:
                inst.stats = Stats("add_sub", "1")
            batchers = [FrontBatcher(inst, 64) for inst in insts]

            async def client(b, k):
                for _ in range(k):
                    r = make_request(1)
                    done = asyncio.get_running_loop().create_future()
                    r.on_response = lambda response, done=done: done.done() or done.set_result(response)
                    b.submit(r)
                    assert (await done).error is None

            await asyncio.gather(*(client(b, 50) for b in batchers for _ in range(c)))  # warm-up
            for inst in insts:
                inst.stats = Stats("add_sub", "1")
            t0 = time.perf_counter()
            await asyncio.gather(*(client(b, args.n // (c * len(batchers))) for b in batchers for _ in range(c)))
            elapsed = time.perf_counter() - t0
            inferences = sum(i.stats.inference_count for i in insts)
            executions = sum(i.stats.execution_count for i in insts)
            merged = sum(getattr(i.stats, "merged", 0) for i in insts)
            sizes: dict[int, int] = {}
            for i in insts:
                for bs, v in i.stats.batch_stats.items():
                    sizes[bs] = sizes.get(bs, 0) + v[0]
            top = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
            print(f"{len(insts)} front(s) ({'primary' if worker in insts else 'no primary'}"
                  f"{f' + {len(insts) - (worker in insts)} link(s)' if links else ''}), c={c} each: "
                  f"{inferences / elapsed:.0f} infer/s, {executions} executions ({merged} merged), mean batch "
                  f"{inferences / max(1, executions):.2f}, most common sizes {top}", flush=True)
        finally:
            for inst in linked:
                await inst.stop(1)
            await worker.stop(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("ab")
    p.add_argument("--a", required=True)
    p.add_argument("--b", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n", type=int, default=4000)
    p.add_argument("--what", choices=("round", "hotpath"), default="round")
    for name in ("round", "hotpath"):
        p = sub.add_parser(name)
        p.add_argument("--n", type=int, default=4000)
    p = sub.add_parser("merge")
    p.add_argument("--n", type=int, default=20000)
    args = ap.parse_args()
    if args.cmd == "ab":
        ab(args)
        return
    import uvloop

    if args.cmd in ("round", "hotpath"):
        result = uvloop.run((round_ if args.cmd == "round" else hotpath)(args.n))
        from kernel.backends.python import instance

        result["tree"] = str(Path(instance.__file__).parents[2])
        print(json.dumps(result))
    else:
        uvloop.run(merge(args))


if __name__ == "__main__":
    main()

"""First token after the server has idled: Kernel and real Triton, the same client, c=1.

Why this exists (issue 33, item 6): in `generative.py`'s interleaved TTFT, Kernel's gRPC stream
trails Triton's `generate_stream` although Kernel's gRPC stream beats Triton's own. The two rows
differ in how long the server sits idle before the next request: Triton's Python stub sends
tiny_lm's 128 tokens ~0.4 ms apart, so its server is still busy when the client sends again; Kernel
sends them in ~4 ms and `tritonclient.grpc.aio` then takes ~11 ms to read them, so Kernel's processes
idle ~7 ms and the next first token pays for waking them (on this VM: vCPUs halted, caches cold).

This measures that directly, with one-token answers (no stream tail to read) and a client pause
before each request (`gen_load.py --think-ms`): 0 (back to back) and the pauses given. Routes are
interleaved pass by pass, as in generative.py, so load drift hits every row alike. Then, the
servers stopped, the box alone: the same piece of Python timed right after each pause, slept or
spun, which separates what the box charges for a pause from what the servers do.

    .venv/bin/python benchmarks/ttft_idle.py                 # 4 passes, 2 s per route and pause
    .venv/bin/python benchmarks/ttft_idle.py --think-ms 0 1 7 20

Writes results/ttft_idle.md and results/ttft_idle.json (logs in results/generative/).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import generative  # noqa: E402  (start, c1_window, percentile, the tiny_lm repository)

ROUTES = [("kernel", "grpc"), ("triton", "grpc"), ("kernel", "generate_stream"), ("triton", "generate_stream")]


def _python_work() -> int:
    """~0.2-0.4 ms of the kind of Python a first token runs: small dicts, lists, JSON both ways."""
    d = {}
    for i in range(300):
        d[str(i)] = [i, i * 2, {"a": i}]
    return len(json.loads(json.dumps(d)))


def box_penalty(pauses_ms: list[float], repeats: int = 300) -> dict:
    """The box's own price of a pause, with no server and no socket: the same Python work timed right
    after a pause, the pause slept (the process idles, as a server between requests) or spun (the
    process never leaves the CPU). If the spun pause costs as much as the slept one, what a server
    pays after idling is not its sleep or wake-up but the caches the box lets cool meanwhile."""
    out = {}
    for pause_ms in pauses_ms:
        pause = pause_ms / 1000.0
        slept, spun = [], []
        for i in range(repeats):
            if pause:
                if i % 2:
                    time.sleep(pause)
                else:
                    until = time.perf_counter() + pause
                    while time.perf_counter() < until:
                        pass
            t0 = time.perf_counter()
            _python_work()
            (slept if i % 2 else spun).append((time.perf_counter() - t0) * 1000.0)
        out[f"{pause_ms:g}"] = {"slept_ms": generative.percentile(slept, 0.5),
                                "spun_ms": generative.percentile(spun, 0.5)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/ttft_idle.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--think-ms", type=float, nargs="+", default=[0.0, 7.0])
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=2.0, help="window of each route and pause in each pass")
    a = ap.parse_args(argv)
    logs = generative.RESULTS / "generative"
    logs.mkdir(parents=True, exist_ok=True)
    repo = Path(tempfile.mkdtemp(prefix="ttft-idle-repo-", dir=logs))
    shutil.copytree(generative.ROOT / "model_repo_examples" / generative.MODEL, repo / generative.MODEL)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    samples = {(s, r, t): [] for s, r in ROUTES for t in a.think_ms}
    running = {}
    try:
        running = {name: generative.start(name, repo, logs) for name in ("kernel", "triton")}
        for i in range(a.passes):
            order = list(samples) if i % 2 == 0 else list(samples)[::-1]
            for key in order:
                server, route, think_ms = key
                samples[key].extend(generative.c1_window(server, route, a.seconds, 1, think_ms)["ttft_samples_ms"])
            generative.say(f"  pass {i + 1}: " + "  ".join(
                f"{s}/{r}@{t:g}ms {generative.percentile(samples[(s, r, t)], 0.5):.2f}" for s, r, t in samples))
    finally:
        for srv in running.values():
            srv.stop()
        shutil.rmtree(repo, ignore_errors=True)
    box = box_penalty(a.think_ms)  # after the servers stopped: nothing else runs
    rows = []
    for s, r in ROUTES:
        rows.append({"server": s, "route": r,
                     "p50_ms": {f"{t:g}": generative.percentile(samples[(s, r, t)], 0.5) for t in a.think_ms},
                     "samples": {f"{t:g}": len(samples[(s, r, t)]) for t in a.think_ms}})
    head = "| server | route | " + " | ".join(f"TTFT p50 ms, pause {t:g} ms" for t in a.think_ms) + " |"
    lines = [head, "| --- | --- | " + " | ".join("---:" for _ in a.think_ms) + " |"]
    for row in rows:
        name = "Kernel" if row["server"] == "kernel" else "Triton 2.51"
        lines.append(f"| {name} | {row['route']} | " + " | ".join(
            f"{row['p50_ms'][f'{t:g}']:.2f} (n={row['samples'][f'{t:g}']})" for t in a.think_ms) + " |")
    command = "python benchmarks/ttft_idle.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = [
        "# First token after the server idled (c=1, one-token answers)", "",
        f"Measured {started} on this box ({os.cpu_count()} CPUs, loopback) by `{command.strip()}`: Kernel and "
        f"real Triton 2.51 both running tiny_lm (the same files), {a.passes} passes, every route and pause "
        f"{a.seconds:g} s per pass, the order reversed every other pass. The client (`benchmarks/gen_load.py`: "
        "`tritonclient.grpc.aio` for grpc, raw HTTP/1.1 SSE for generate_stream) pauses before each request "
        "for the time given; the pause is not in the TTFT.", "",
        *lines, "",
        "The box alone, no server: the median time of the same piece of Python (~0.3 ms of dicts and "
        "JSON) run right after the pause, the pause slept or spun (the process never leaves the CPU):", "",
        "| pause ms | " + " | ".join(f"{t:g}" for t in a.think_ms) + " |",
        "| --- | " + " | ".join("---:" for _ in a.think_ms) + " |",
        "| after a slept pause, ms | " + " | ".join(f"{box[f'{t:g}']['slept_ms']:.3f}" for t in a.think_ms) + " |",
        "| after a spun pause, ms | " + " | ".join(f"{box[f'{t:g}']['spun_ms']:.3f}" for t in a.think_ms) + " |", "",
        "The pause column that matters for `generative.py`'s gRPC row is the idle the slow client leaves "
        "Kernel after a 128-token answer (~7 ms); Triton's server is not idle there (its tokens come "
        "~0.4 ms apart, so the client's next request meets a busy server).", "",
    ]
    out = generative.RESULTS
    (out / "ttft_idle.md").write_text("\n".join(md))
    (out / "ttft_idle.json").write_text(json.dumps({"started": started, "command": command.strip(),
                                                    "passes": a.passes, "seconds": a.seconds, "rows": rows,
                                                    "box": box},
                                                   indent=1))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The generative suite (issue 24): one toy generator, three servers, streamed tokens per second and
time to first token.

The generator is `model_repo_examples/tiny_lm` (a word-level sampler with no weights; one token is
one word), the same `model.py` under every server:

* Kernel: its OpenAI-compatible route (`/v1/chat/completions`, `stream: true`), Triton's
  `generate_stream` (HTTP, server-sent events) and the gRPC stream (`ModelStreamInfer`), one
  `kernel serve` for all three; and the OpenAI route asked for a tool call (`tools`) and for JSON
  (`response_format: json_object`), whose answers are short by nature (one call; a small JSON
  object): their rows compare time to first token and requests/s with the plain chat's;
* real Triton 2.51 (benchmarks/peers.py): `generate_stream` and the gRPC stream;
* LitServe with `OpenAISpec` (benchmarks/litserve_tiny_lm.py runs the same model.py in an async
  `LitAPI`; litserve lives in its own venv, benchmarks/.genbench/litserve, installed on first use).

Every request asks for a 128-token answer (`max_tokens` 128, `ignore_eos`, temperature 1.0); the
load client (gen_load.py, one process per point) keeps 1, 16 or 64 requests in flight and reports
streamed tokens/s, TTFT p50/p99 and the median time between tokens. Each round starts each server
once, in an order that rotates from round to round, and measures all its routes at every
concurrency; the tables give the MEDIAN over rounds and the min-max spread, and the targets are
judged on the per-round ratios. Each point also records the server's CPU time (all its processes)
per 1,000 tokens: on this shared 2-core box throughput follows the CPU share a server gets, CPU per
token does not.

`--aiperf` then runs NVIDIA's aiperf (PyPI, its own venv benchmarks/.genbench/aiperf) against
Kernel's OpenAI endpoint, with a word-level tokenizer made from tiny_lm's vocabulary in a local
folder (the HF hub is not reachable here, and one word is one tiny_lm token, so its token counts
are exact), and quotes its table.

    python benchmarks/generative.py                       # 3 rounds, 5 s windows, then aiperf
    python benchmarks/generative.py --rounds 5 --duration 8
    python benchmarks/generative.py --quick --rounds 1    # harness check (2 s windows)

Writes results/generative.md, generative.json (every point of every round), generative.png;
server logs in results/generative/ (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import peers  # noqa: E402
import run as harness  # noqa: E402  (start_triton, kill_group, pids_in_group, log_tail, BenchError)

RESULTS = HERE / "results"
TOOLS = HERE / ".genbench"  # git-ignored: the LitServe and aiperf venvs
LITSERVE_PY = TOOLS / "litserve" / "bin" / "python"
AIPERF = TOOLS / "aiperf" / "bin" / "aiperf"
LITSERVE_PACKAGES = ["litserve==0.2.19", "numpy", "uvloop"]
AIPERF_PACKAGES = ["aiperf==0.13.0"]
MODEL = "tiny_lm"
CONCURRENCY = (1, 16, 64)
MAX_TOKENS = 128

# (server, route, label): the rows of the table, in order.
ROWS = [
    ("kernel", "openai", "Kernel OpenAI route"),
    ("kernel", "openai_tools", "Kernel OpenAI, tool calling"),
    ("kernel", "openai_json", "Kernel OpenAI, JSON mode"),
    ("kernel", "generate_stream", "Kernel generate_stream"),
    ("kernel", "grpc", "Kernel gRPC stream"),
    ("triton", "generate_stream", "Triton 2.51 generate_stream"),
    ("triton", "grpc", "Triton 2.51 gRPC stream"),
    ("litserve", "openai", "LitServe OpenAISpec"),
]
PORTS = {"kernel": (19400, 19401, 19402, 19403), "triton": (19410, 19411, 19412), "litserve": (19420,)}


def say(msg: str) -> None:
    print(f"[generative] {msg}", file=sys.stderr, flush=True)


# ---- tools -------------------------------------------------------------------------------------


def _venv(path: Path, packages: list[str]) -> None:
    if (path / "bin" / "python").exists() and (path / ".installed").exists():
        return
    say(f"installing {' '.join(packages)} into {path} (once)")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    subprocess.run([str(path / "bin" / "pip"), "install", "-q", *packages], check=True)
    (path / ".installed").write_text(" ".join(packages) + "\n")


def ensure_tools(aiperf: bool) -> None:
    peers.ensure()
    _venv(TOOLS / "litserve", LITSERVE_PACKAGES)
    if aiperf:
        _venv(TOOLS / "aiperf", AIPERF_PACKAGES)


# ---- servers -------------------------------------------------------------------------------------


class Running:
    """A server started in its own session (so the whole tree stops together)."""

    def __init__(self, name: str, popen: subprocess.Popen, log: Path, ready_url: str):
        self.name = name
        self.popen = popen
        self.log = log
        self.ready_url = ready_url

    def wait_ready(self, timeout: float = 120.0) -> float:
        t0 = time.monotonic()
        while harness.http_get(self.ready_url)[0] != 200:
            if self.popen.poll() is not None:
                raise harness.BenchError(f"{self.name} exited with {self.popen.returncode}\n{harness.log_tail(self.log)}")
            if time.monotonic() - t0 > timeout:
                self.stop()
                raise harness.BenchError(f"{self.name} not ready in {timeout:.0f} s\n{harness.log_tail(self.log)}")
            time.sleep(0.05)
        return time.monotonic() - t0

    def cpu_seconds(self) -> float:
        """CPU time of every live process of the server (front, workers, stubs, LitServe's processes)."""
        total = 0
        for pid in harness.pids_in_group(self.popen.pid):
            try:
                fields = harness.proc_stat(pid)
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
        return total / harness.TICK

    def stop(self) -> None:
        harness.kill_group(self.popen.pid, self.popen.pid)
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass


def _spawn(cmd: list[str], log: Path, cwd: Path, env=None) -> subprocess.Popen:
    with open(log, "wb") as f:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def start(server: str, repo: Path, logs: Path) -> Running:
    ports = PORTS[server]
    harness.check_ports_free(*ports)
    log = logs / f"{server}.log"
    if server == "kernel":
        cmd = [harness.default_python(), "-m", "kernel", "serve", "--model-repository", str(repo),
               "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
               "--openai-port", str(ports[3])]
        srv = Running("Kernel", _spawn(cmd, log, ROOT), log, f"http://127.0.0.1:{ports[0]}/v2/health/ready")
    elif server == "triton":
        # Not from the project root: its triton_python_backend_utils/ would shadow the stub's own.
        srv = Running("Triton", _spawn(peers.tritonserver_cmd(repo, *ports), log, logs, peers.env()), log,
                      f"http://127.0.0.1:{ports[0]}/v2/health/ready")
    else:
        cmd = [str(LITSERVE_PY), str(HERE / "litserve_tiny_lm.py"), "--port", str(ports[0])]
        srv = Running("LitServe", _spawn(cmd, log, logs), log, f"http://127.0.0.1:{ports[0]}/health")
    srv.wait_ready()
    if server == "litserve":  # /health answers before the inference worker has run setup()
        _first_answer(ports[0])
    return srv


def _first_answer(port: int, timeout: float = 60.0) -> None:
    body = json.dumps({"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}).encode()
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            import urllib.request
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                         {"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise harness.BenchError("LitServe did not answer a first request")


def route_port(server: str, route: str) -> int:
    p = PORTS[server]
    if server == "kernel":
        return {"openai": p[3], "openai_tools": p[3], "openai_json": p[3], "generate_stream": p[0], "grpc": p[1]}[route]
    if server == "triton":
        return {"generate_stream": p[0], "grpc": p[1]}[route]
    return p[0]


# ---- one point -------------------------------------------------------------------------------------


def measure(srv: Running, server: str, route: str, c: int, duration: float, warmup: float) -> dict:
    cmd = [harness.default_python(), str(HERE / "gen_load.py"), "--kind", route, "--port", str(route_port(server, route)),
           "--model", MODEL, "--concurrency", str(c), "--duration", str(duration), "--warmup", str(warmup),
           "--max-tokens", str(MAX_TOKENS)]
    load = os.getloadavg()[0]
    cpu0, t0 = srv.cpu_seconds(), time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + warmup + 300)
    cpu1, t1 = srv.cpu_seconds(), time.monotonic()
    point = {"server": server, "route": route, "concurrency": c, "loadavg_1m": round(load, 2)}
    if out.returncode != 0:
        point["error"] = out.stderr.strip()[-500:]
        return point
    r = json.loads(out.stdout)
    # Tokens over the client's whole run (warm-up and the tail included), for CPU per token.
    point.update(r)
    point.pop("extra", None)
    if r.get("duration_s"):
        point["requests_per_s"] = round(r["requests"] / r["duration_s"], 1)
    tokens_all = r.get("tokens_all") or 0
    if tokens_all:
        point["server_cpu_ms_per_1k_tokens"] = round((cpu1 - cpu0) * 1e6 / tokens_all, 1)
    point["server_cpu_share"] = round((cpu1 - cpu0) / (t1 - t0), 2)  # cores used on average while loaded
    return point


# ---- summary -----------------------------------------------------------------------------------------


def _ms(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def _med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(points: list[dict], rounds: int) -> dict:
    cells = {}
    for server, route, label in ROWS:
        for c in CONCURRENCY:
            ps = [p for p in points if p["server"] == server and p["route"] == route and p["concurrency"] == c
                  and "error" not in p]
            if not ps:
                continue
            cell = {"label": label, "rounds": len(ps)}
            for key in ("tokens_per_s", "requests_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
                        "server_cpu_ms_per_1k_tokens"):
                vals = [p.get(key) for p in ps if p.get(key) is not None]
                if vals:
                    cell[key] = {"median": _med(vals), "min": min(vals), "max": max(vals)}
            cell["errors"] = sum(p.get("errors", 0) for p in ps)
            cells[f"{server}/{route}/{c}"] = cell

    def per_round(a, b, key, c):
        out = []
        for rnd in range(1, rounds + 1):
            pa = [p for p in points if p["round"] == rnd and f"{p['server']}/{p['route']}" == a and p["concurrency"] == c]
            pb = [p for p in points if p["round"] == rnd and f"{p['server']}/{p['route']}" == b and p["concurrency"] == c]
            if pa and pb and pa[0].get(key) and pb[0].get(key):
                out.append(pa[0][key] / pb[0][key])
        return out

    targets = []
    for c in (16, 64):
        ratios = per_round("kernel/openai", "litserve/openai", "tokens_per_s", c)
        targets.append({"target": f"Kernel OpenAI tokens/s >= 2x LitServe at c={c}", "ratios": ratios,
                        "median": _med(ratios), "met": bool(ratios) and _med(ratios) >= 2.0})
    for route in ("openai", "generate_stream", "grpc"):
        ratios = per_round(f"kernel/{route}", "triton/generate_stream", "ttft_p50_ms", 1)
        targets.append({"target": f"Kernel {route} TTFT p50 at c=1 <= Triton generate_stream's",
                        "ratios": ratios, "median": _med(ratios), "met": bool(ratios) and _med(ratios) <= 1.0})
    return {"cells": cells, "targets": targets}


def _fmt(cell, key, digits=0):
    v = cell.get(key)
    if not v:
        return "-"
    f = f"{{:.{digits}f}}"
    return f"{f.format(v['median'])} ({f.format(v['min'])}–{f.format(v['max'])})"


def write_markdown(summary: dict, meta: dict, path: Path) -> None:
    loads = meta["loadavg"]
    lines = [
        "# Generative suite: tiny_lm streamed by Kernel, real Triton 2.51 and LitServe",
        "",
        f"{meta['date']}, `{meta['command']}` on {meta['host']}: {meta['rounds']} rounds, each server started once per "
        f"round in rotating order; {meta['duration']:g} s windows after {meta['warmup']:g} s of warm-up; "
        f"{MAX_TOKENS}-token answers. Load average (1 min) during the points: median {loads['median']}, "
        f"{loads['min']}–{loads['max']} on 2 cores shared with other work: absolute numbers are this box's, "
        "compare ratios. Cells: median over rounds (min–max).",
        "",
        "| server / route | c | tokens/s | requests/s | TTFT p50 ms | TTFT p99 ms | between tokens p50 ms | server CPU ms / 1k tokens |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for server, route, label in ROWS:
        for c in CONCURRENCY:
            cell = summary["cells"].get(f"{server}/{route}/{c}")
            if cell is None:
                continue
            err = f" ({cell['errors']} errors)" if cell["errors"] else ""
            lines.append(f"| {label}{err} | {c} | {_fmt(cell, 'tokens_per_s')} | {_fmt(cell, 'requests_per_s', 1)} | "
                         f"{_fmt(cell, 'ttft_p50_ms', 1)} | "
                         f"{_fmt(cell, 'ttft_p99_ms', 1)} | {_fmt(cell, 'itl_p50_ms', 2)} | "
                         f"{_fmt(cell, 'server_cpu_ms_per_1k_tokens')} |")
    lines += ["", "## Targets (per-round ratios)", "", "| target | median ratio | per round | met |", "| --- | ---: | --- | --- |"]
    for t in summary["targets"]:
        rs = ", ".join(f"{r:.2f}" for r in t["ratios"]) or "-"
        med = f"{t['median']:.2f}" if t["median"] is not None else "-"
        lines.append(f"| {t['target']} | {med} | {rs} | {'yes' if t['met'] else 'NO'} |")
    inter = meta.get("ttft_interleaved")
    if inter:
        lines += ["", "## Time to first token at concurrency 1, interleaved", "",
                  f"Kernel and Triton both running; {inter['pairs']} passes over the routes, {inter['seconds']:g} s of "
                  "c=1 load per route per pass, the order reversed every other pass" +
                  (f" (`{meta['ttft_command']}`)" if meta.get("ttft_command") else "") +
                  ". Load average during the passes: " +
                  ", ".join(str(p["loadavg_1m"]) for p in inter["passes"]) + ".", "",
                  "| route | samples | TTFT p50 ms | p90 ms | p99 ms | per-pass p50 / Triton generate_stream's p50: median (min–max) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        labels = {f"{s}/{r}": label for s, r, label in ROWS}
        for key, v in inter["routes"].items():
            ratio = v.get("ratio_to_triton_generate_stream")
            rtext = f"{ratio['median']:.2f} ({ratio['min']:.2f}–{ratio['max']:.2f})" if ratio else "-"
            lines.append(f"| {labels[key]} | {v['samples']} | {v['p50']:.2f} | {v['p90']:.2f} | {v['p99']:.2f} | {rtext} |")
        triton = inter["routes"].get("triton/generate_stream")
        lines.append("")
        for key in ("kernel/openai", "kernel/generate_stream", "kernel/grpc"):
            v = inter["routes"].get(key)
            if v and triton:
                met = v["p50"] <= triton["p50"]
                lines.append(f"- Target {labels[key]} TTFT p50 at c=1 <= Triton generate_stream's, interleaved: "
                             f"{v['p50']:.2f} vs {triton['p50']:.2f} ms over all samples: **{'met' if met else 'NOT met'}**")
    if meta.get("aiperf"):
        lines += ["", "## aiperf against Kernel's OpenAI endpoint", "", f"`{meta['aiperf']['command']}`", "",
                  "```", meta["aiperf"]["output"].rstrip(), "```"]
    lines.append("")
    path.write_text("\n".join(lines))


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / len(ROWS)
    for ax, key, title in ((axes[0], "tokens_per_s", "streamed tokens/s (higher is better)"),
                           (axes[1], "ttft_p50_ms", "time to first token p50, ms (lower is better, log)")):
        for i, (server, route, label) in enumerate(ROWS):
            xs, ys, lo, hi = [], [], [], []
            for j, c in enumerate(CONCURRENCY):
                v = summary["cells"].get(f"{server}/{route}/{c}", {}).get(key)
                if v:
                    xs.append(j + (i - len(ROWS) / 2 + 0.5) * width)
                    ys.append(v["median"])
                    lo.append(v["median"] - v["min"])
                    hi.append(v["max"] - v["median"])
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=label)
        ax.set_xticks(range(len(CONCURRENCY)), [f"c={c}" for c in CONCURRENCY])
        ax.set_title(title, fontsize=10)
        if key == "ttft_p50_ms":
            ax.set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"tiny_lm, {MAX_TOKENS}-token answers: median over rounds, bars = min–max (2 shared cores)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---- time to first token at concurrency 1, interleaved -----------------------------------------------

TTFT_ROUTES = [("kernel", "openai"), ("kernel", "generate_stream"), ("kernel", "grpc"),
               ("triton", "generate_stream"), ("triton", "grpc")]


def interleaved_ttft(repo: Path, logs: Path, pairs: int, seconds: float) -> dict:
    """Kernel and real Triton both started (an idle server uses no CPU), then `pairs` passes over
    TTFT_ROUTES, each a `seconds`-long window at concurrency 1: every route is measured within
    seconds of the others, so a change of load on the shared box hits all of them alike, which the
    round-by-round table cannot promise for a number as small as a c=1 time to first token."""
    running = {name: start(name, repo, logs) for name in ("kernel", "triton")}
    samples: dict = {f"{s}/{r}": [] for s, r in TTFT_ROUTES}
    passes = []
    try:
        for i in range(pairs):
            order = TTFT_ROUTES if i % 2 == 0 else TTFT_ROUTES[::-1]
            row = {}
            for server, route in order:
                r = c1_window(server, route, seconds)
                samples[f"{server}/{route}"].extend(r["ttft_samples_ms"])
                row[f"{server}/{route}"] = r["ttft_p50_ms"]
            row["loadavg_1m"] = round(os.getloadavg()[0], 2)
            passes.append(row)
            say(f"  TTFT pass {i + 1}: " + "  ".join(f"{k} {_ms(v)}" for k, v in row.items() if k != "loadavg_1m")
                + f"  load {row['loadavg_1m']}")
    finally:
        for srv in running.values():
            srv.stop()
    result = {"pairs": pairs, "seconds": seconds, "passes": passes, "routes": {}}
    for key, vals in samples.items():
        if vals:
            result["routes"][key] = {"samples": len(vals), "p50": percentile(vals, 0.5),
                                     "p90": percentile(vals, 0.9), "p99": percentile(vals, 0.99)}
    for key in list(result["routes"]):
        ratios = [p[key] / p["triton/generate_stream"] for p in passes if p.get(key) and p.get("triton/generate_stream")]
        result["routes"][key]["ratio_to_triton_generate_stream"] = {
            "median": _med(ratios), "min": min(ratios), "max": max(ratios)} if ratios else None
    return result


def c1_window(server: str, route: str, seconds: float, max_tokens: int = MAX_TOKENS, think_ms: float = 0.0) -> dict:
    """gen_load.py's result for one c=1 window on a running server's route, with every TTFT sample
    (think_ms: the client's pause before each request)."""
    cmd = [harness.default_python(), str(HERE / "gen_load.py"), "--kind", route, "--port",
           str(route_port(server, route)), "--concurrency", "1", "--duration", str(seconds),
           "--warmup", "0.3", "--max-tokens", str(max_tokens), "--think-ms", str(think_ms), "--samples"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise harness.BenchError(out.stderr[-500:])
    return json.loads(out.stdout)


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


# ---- aiperf ------------------------------------------------------------------------------------------


def word_tokenizer(folder: Path) -> Path:
    """A Hugging Face tokenizer folder whose tokens are tiny_lm's: one word (or "," / ".") each.

    Made with aiperf's own `tokenizers` (its venv), since aiperf loads a tokenizer to count tokens and
    to make synthetic prompts, and would otherwise fetch one from the HF hub."""
    code = f"""
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders
words = {json.dumps(_tiny_lm_words())}
vocab = {{"[UNK]": 0, **{{w: i + 1 for i, w in enumerate(dict.fromkeys(words))}}}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")
tok.save(sys.argv[1] + "/tokenizer.json")
json.dump({{"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 4096}},
          open(sys.argv[1] + "/tokenizer_config.json", "w"))
"""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(TOOLS / "aiperf" / "bin" / "python"), "-c", code, str(folder)], check=True)
    return folder


def _tiny_lm_words() -> list[str]:
    text = (ROOT / "model_repo_examples" / MODEL / "1" / "model.py").read_text()
    start = text.index("WORDS = (") + len("WORDS = (")
    body = text[start:text.index(").split()", start)]
    return "".join(part.strip().strip('"') for part in body.splitlines()).split() + [".", "<end>"]


def run_aiperf(repo: Path, logs: Path, concurrency: int, requests: int) -> dict:
    tok = word_tokenizer(Path(tempfile.mkdtemp(prefix="tiny-lm-tokenizer-", dir=logs)))
    artifacts = logs / "aiperf"
    shutil.rmtree(artifacts, ignore_errors=True)
    srv = start("kernel", repo, logs)
    try:
        cmd = [str(AIPERF), "profile", "--model", MODEL, "--url", f"http://127.0.0.1:{PORTS['kernel'][3]}",
               "--endpoint-type", "chat", "--streaming", "--tokenizer", str(tok),
               "--concurrency", str(concurrency), "--request-count", str(requests),
               "--synthetic-input-tokens-mean", "16", "--synthetic-input-tokens-stddev", "0",
               "--output-tokens-mean", str(MAX_TOKENS), "--output-tokens-stddev", "0",
               "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:1.0",
               "--artifact-dir", str(artifacts), "--ui", "none"]
        say("aiperf: " + " ".join(cmd))
        # Not HF_HUB_OFFLINE: aiperf 0.13's offline mode looks names up in the hub cache only and
        # refuses a local folder (HFValidationError); a folder is read without the network anyway.
        env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        env.update(HF_HUB_DISABLE_TELEMETRY="1", COLUMNS="160")
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=logs)
    finally:
        srv.stop()
    text = out.stdout + ("\n" + out.stderr if out.returncode else "")
    (logs / "aiperf.txt").write_text(text)
    printable = " ".join(Path(c).name if c == str(AIPERF) else c for c in cmd).replace(str(tok), "<word tokenizer>")
    return {"command": printable, "returncode": out.returncode, "output": _aiperf_table(text)}


def _aiperf_table(text: str) -> str:
    """The metrics table aiperf prints (the box-drawn part), or the tail of its output."""
    lines = text.splitlines()
    keep = [ln for ln in lines if ln.strip().startswith(("┃", "│", "┏", "┡", "└", "┗", "━", "┌", "╇", "NVIDIA AIPerf"))
            or "Metric" in ln]
    return "\n".join(keep) if keep else "\n".join(lines[-60:])


# ---- main ----------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=10.0, help="measured window per point, seconds")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of load before each window")
    ap.add_argument("--quick", action="store_true", help="3 s windows, 1 s warm-up: checks the harness")
    ap.add_argument("--servers", default="kernel,triton,litserve")
    ap.add_argument("--no-aiperf", dest="aiperf", action="store_false")
    ap.add_argument("--aiperf-only", action="store_true", help="only the aiperf run, added to the last results")
    ap.add_argument("--ttft-passes", type=int, default=10, help="interleaved c=1 TTFT passes (0: none)")
    ap.add_argument("--ttft-seconds", type=float, default=2.0, help="window of each route in each TTFT pass")
    ap.add_argument("--ttft-only", action="store_true", help="only the interleaved TTFT step, added to the last results")
    ap.add_argument("--aiperf-concurrency", type=int, default=16)
    ap.add_argument("--aiperf-requests", type=int, default=400)
    a = ap.parse_args(argv)
    if a.quick:
        a.duration, a.warmup = 3.0, 1.0
    servers = a.servers.split(",")
    ensure_tools(a.aiperf)
    logs = RESULTS / "generative"
    logs.mkdir(parents=True, exist_ok=True)
    repo = Path(tempfile.mkdtemp(prefix="generative-repo-", dir=logs))
    shutil.copytree(ROOT / "model_repo_examples" / MODEL, repo / MODEL)
    command = "python benchmarks/generative.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if a.aiperf_only or a.ttft_only:  # added to the last run's files
        saved = json.loads((RESULTS / "generative.json").read_text())
        if a.ttft_only:
            saved["meta"]["ttft_interleaved"] = interleaved_ttft(repo, logs, a.ttft_passes, a.ttft_seconds)
            saved["meta"]["ttft_command"] = command
        if a.aiperf_only:
            saved["meta"]["aiperf"] = run_aiperf(repo, logs, a.aiperf_concurrency, a.aiperf_requests)
        (RESULTS / "generative.json").write_text(json.dumps(saved, indent=1))
        write_markdown(saved["summary"], saved["meta"], RESULTS / "generative.md")
        print((RESULTS / "generative.md").read_text())
        return 0 if saved["meta"].get("aiperf", {}).get("returncode", 0) == 0 else 1
    points: list[dict] = []
    for rnd in range(1, a.rounds + 1):
        order = servers[(rnd - 1) % len(servers):] + servers[:(rnd - 1) % len(servers)]
        if rnd % 2 == 0:
            order.reverse()
        for server in order:
            say(f"round {rnd}: {server}")
            srv = start(server, repo, logs)
            try:
                for s, route, _ in ROWS:
                    if s != server:
                        continue
                    for c in CONCURRENCY:
                        p = measure(srv, server, route, c, a.duration, a.warmup)
                        p["round"] = rnd
                        points.append(p)
                        say(f"  {route:15s} c={c:<3d} " + (f"ERROR {p['error']}" if "error" in p else
                            f"{p['tokens_per_s']:7.0f} tok/s  TTFT p50 {_ms(p['ttft_p50_ms'])} p99 {_ms(p['ttft_p99_ms'])} ms"
                            f"  errors {p['errors']}  load {p['loadavg_1m']}"))
            finally:
                srv.stop()
    summary = summarize(points, a.rounds)
    loads = [p["loadavg_1m"] for p in points]
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "command": command, "host": f"{platform.node()} ({os.cpu_count()} CPUs)",
            "rounds": a.rounds, "duration": a.duration, "warmup": a.warmup,
            "loadavg": {"median": round(_med(loads), 2), "min": min(loads), "max": max(loads)}}
    if a.ttft_passes and "triton" in servers and "kernel" in servers:
        meta["ttft_interleaved"] = interleaved_ttft(repo, logs, a.ttft_passes, a.ttft_seconds)
    if a.aiperf:
        try:
            meta["aiperf"] = run_aiperf(repo, logs, a.aiperf_concurrency, a.aiperf_requests)
        except (OSError, subprocess.SubprocessError, harness.BenchError) as exc:  # the table is kept
            meta["aiperf"] = {"command": "aiperf", "returncode": -1, "output": f"aiperf did not run: {exc}"}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "generative.json").write_text(json.dumps({"meta": meta, "summary": summary, "points": points}, indent=1))
    write_markdown(summary, meta, RESULTS / "generative.md")
    plot(summary, RESULTS / "generative.png")
    print((RESULTS / "generative.md").read_text())
    return 1 if any("error" in p for p in points) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Kernel beside real Triton 2.51 on one GPU, same models, same run (issue 34).

Each server in turn (Triton first, then Kernel) serves the repository below, and is measured with
perf_analyzer (its infer/s and p50/p99 over 3 windows; the server's own completed count beside it):

| scenario | model | load |
| --- | --- | --- |
| CUDA-shm identity 1 / 16 / 64 MiB, HTTP and gRPC, c=1 | identity_gpu (KIND_GPU, DLPack in place, GPU inputs) | --shared-memory cuda |
| KIND_GPU add_sub, HTTP and gRPC, c=1; CUDA shm gRPC c=4 | add_sub_gpu (CuPy, GPU inputs) | plain; --shared-memory cuda |
| CPU add_sub with 16-byte inputs: system vs CUDA shm, HTTP and gRPC, c=1 | add_sub (the bundled example) | --shared-memory system / cuda |
| BLS with a 4 MiB GPU tensor, HTTP c=1 and gRPC c=4 | bls_gpu -> identity_gpu | plain |
| the bundled torch example, HTTP c=1 and gRPC c=8 (where torch is installed) | torch_mlp (model_repo_examples_gpu) | plain |

Before the load, on each server: one request through CUDA shared memory checked for its bytes
(registered with the JSON body a client sends), the torch example's answer checked against the same
network on the CPU, and the first and second BLS call timed right after the load (a first BLS call
with a GPU tensor took 411 ms in Kernel before it set CUDA up at load).

Targets (issue 34): every GPU scenario at least 1.5x Triton's infer/s at equal or better p99; CUDA-shm
small inputs within 2x of system-shm small inputs (same server). The tables say which are met.

    python benchmarks/gpu_vs_triton.py --out DIR [--perf-dir D] [--triton-root R] [--servers triton,kernel]
    python benchmarks/gpu_vs_triton.py --out DIR --dry-run   # no GPU: Kernel on the CuPy stand-in,
                                                            # system shm for cuda, short windows
scripts/gpu-vs-triton.sh runs it on a lent GPU machine with what it carries. Writes DIR/gpu.json,
DIR/gpu.md (the form of benchmarks/results/gpu.md); server logs and perf_analyzer logs in DIR/logs/.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import platform
import shutil
import sys
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "tests" / "gpu")]
import run as harness  # noqa: E402
import scale_run as sr  # noqa: E402
from gpu_models import DLPACK_IDENTITY, GPU_ADD_SUB  # noqa: E402  (plain Python-backend models: Triton runs them too)

MIB = 1 << 20
BLS_FLOATS = 1 << 20  # 4 MiB
SIZES = {"1 MiB": MIB, "16 MiB": 16 * MIB, "64 MiB": 64 * MIB}
PORTS = {"triton": sr.Ports(28610, 28611, 28612, 0), "kernel": sr.Ports(28600, 28601, 28602, 28603)}
GPU_MODELS = ("identity_gpu", "add_sub_gpu", "add_sub", "bls_gpu")

# bls_gpu: a 4 MiB GPU tensor to identity_gpu by BLS, the answer checked where it is (OK).
BLS_GPU = textwrap.dedent(f'''
    import numpy as np
    import cupy as cp
    import triton_python_backend_utils as pb_utils

    N = {BLS_FLOATS}

    class TritonPythonModel:
        def initialize(self, args):
            self.x = cp.arange(N, dtype=cp.float32)

        def execute(self, requests):
            responses = []
            for request in requests:
                reply = pb_utils.InferenceRequest(
                    model_name="identity_gpu", requested_output_names=["OUTPUT0"],
                    inputs=[pb_utils.Tensor.from_dlpack("INPUT0", self.x)]).exec()
                if reply.has_error():
                    raise pb_utils.TritonModelException(reply.error().message())
                out = pb_utils.get_output_tensor_by_name(reply, "OUTPUT0")
                y = cp.from_dlpack(out) if not out.is_cpu() else cp.asarray(out.as_numpy())
                ok = bool(y[N - 1] == N - 1)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OK", np.array([ok], np.bool_))]))
            return responses
''')

GPU_INPUTS = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "no" } }'
FP32_4 = 'data_type: TYPE_FP32, dims: [ 4 ]'
CONFIGS = {
    "identity_gpu": f"""name: "identity_gpu"
backend: "python"
max_batch_size: 0
input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }}]
output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }}]
instance_group [{{ kind: KIND_GPU, count: 1, gpus: [0] }}]
{GPU_INPUTS}
""",
    "add_sub_gpu": f"""name: "add_sub_gpu"
backend: "python"
max_batch_size: 0
input [{{ name: "INPUT0", {FP32_4} }}, {{ name: "INPUT1", {FP32_4} }}]
output [{{ name: "OUTPUT0", {FP32_4} }}, {{ name: "OUTPUT1", {FP32_4} }}]
instance_group [{{ kind: KIND_GPU, count: 1, gpus: [0] }}]
{GPU_INPUTS}
""",
    "bls_gpu": """name: "bls_gpu"
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }]
output [{ name: "OK", data_type: TYPE_BOOL, dims: [ 1 ] }]
instance_group [{ kind: KIND_GPU, count: 1, gpus: [0] }]
""",
}
CODE = {"identity_gpu": DLPACK_IDENTITY, "add_sub_gpu": GPU_ADD_SUB, "bls_gpu": BLS_GPU}


TORCH_MLP = ROOT / "model_repo_examples_gpu" / "torch_mlp"


def build_repo(dest: Path, torch: bool) -> Path:
    """The repository both servers load: the models above, the bundled add_sub (KIND_CPU) and, with
    TORCH, the bundled GPU example."""
    if dest.exists():
        shutil.rmtree(dest)
    if torch:
        shutil.copytree(TORCH_MLP, dest / "torch_mlp", ignore=shutil.ignore_patterns("__pycache__"))
    for name, code in CODE.items():
        (dest / name / "1").mkdir(parents=True)
        (dest / name / "1" / "model.py").write_text(code)
        (dest / name / "config.pbtxt").write_text(CONFIGS[name])
    shutil.copytree(ROOT / "model_repo_examples" / "add_sub", dest / "add_sub",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dest


# ---- scenarios -------------------------------------------------------------------------------------


def scenarios(shm: str, sizes: dict[str, int], torch: bool) -> list[sr.Scenario]:
    """SHM: cuda, or system for a dry run without a GPU (the harness is the same)."""
    out = []
    for label, nbytes in sizes.items():
        extra = ("--shared-memory", shm, "--shape", f"INPUT0:{nbytes // 4}", "--output-shared-memory-size", str(nbytes))
        for proto in ("http", "grpc"):
            out.append(sr.Scenario(f"identity_{label.replace(' ', '')}_{proto}", f"CUDA-shm identity {label} {proto}, c=1",
                                   "identity_gpu", proto, 1, extra))
    for proto in ("http", "grpc"):
        out.append(sr.Scenario(f"add_sub_gpu_{proto}", f"KIND_GPU add_sub {proto}, c=1", "add_sub_gpu", proto, 1))
    out.append(sr.Scenario("add_sub_gpu_cudashm_grpc_c4", "KIND_GPU add_sub, CUDA shm, grpc, c=4", "add_sub_gpu", "grpc",
                           4, ("--shared-memory", shm, "--output-shared-memory-size", "16")))
    for proto in ("http", "grpc"):  # (a dry run has system shm under both names)
        for name, kind, what in (("sysshm", "system", "system"), ("cudashm", shm, "CUDA")):
            out.append(sr.Scenario(f"add_sub_{name}_{proto}", f"CPU add_sub 16-byte inputs, {what} shm, {proto}, c=1",
                                   "add_sub", proto, 1, ("--shared-memory", kind, "--output-shared-memory-size", "16")))
    out.append(sr.Scenario("bls_http", "BLS, 4 MiB GPU tensor, http, c=1", "bls_gpu", "http", 1))
    out.append(sr.Scenario("bls_grpc_c4", "BLS, 4 MiB GPU tensor, grpc, c=4", "bls_gpu", "grpc", 4))
    if torch:
        out.append(sr.Scenario("torch_mlp_http", "torch example (torch_mlp) http, c=1", "torch_mlp", "http", 1))
        out.append(sr.Scenario("torch_mlp_grpc_c8", "torch example (torch_mlp) grpc, c=8", "torch_mlp", "grpc", 8))
    return out


GPU_SCENARIOS = ("identity_", "add_sub_gpu", "bls_", "torch_mlp")  # held to 1.5x Triton at equal or better p99


# ---- checks before the load: one CUDA-shm request, first BLS calls -------------------------------------


def _post(port: int, path: str, body: dict, timeout: float = 60.0) -> tuple[int, dict | None]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, (json.loads(data) if data else None)
    finally:
        conn.close()


def shm_identity_check(srv: harness.Server, cp) -> str:
    """1 MiB through identity_gpu with input and output in CUDA shared memory, registered and asked
    for with plain JSON over HTTP; '' when the output region holds the input, else what went wrong."""
    import numpy as np

    n = MIB // 4
    x = np.arange(n, dtype=np.float32)
    mem_in, mem_out = cp.cuda.Memory(MIB), cp.cuda.Memory(MIB)
    cp.cuda.runtime.memcpy(mem_in.ptr, x.ctypes.data, MIB, 1)
    try:
        for name, mem in (("check_in", mem_in), ("check_out", mem_out)):
            handle = base64.b64encode(bytes(cp.cuda.runtime.ipcGetMemHandle(mem.ptr))).decode()
            status, reply = _post(srv.http_port, f"/v2/cudasharedmemory/region/{name}/register",
                                  {"raw_handle": {"b64": handle}, "device_id": 0, "byte_size": MIB})
            if status != 200:
                return f"register {name}: HTTP {status} {reply}"
        region = lambda r: {"shared_memory_region": r, "shared_memory_byte_size": MIB}  # noqa: E731
        status, reply = _post(srv.http_port, "/v2/models/identity_gpu/infer", {
            "inputs": [{"name": "INPUT0", "shape": [n], "datatype": "FP32", "parameters": region("check_in")}],
            "outputs": [{"name": "OUTPUT0", "parameters": region("check_out")}]})
        if status != 200:
            return f"infer: HTTP {status} {reply}"
        got = np.empty(n, np.float32)
        cp.cuda.runtime.memcpy(got.ctypes.data, mem_out.ptr, MIB, 2)
        return "" if np.array_equal(got, x) else "the output region does not hold the input"
    finally:
        _post(srv.http_port, "/v2/cudasharedmemory/unregister", {})


def torch_mlp_check(srv: harness.Server) -> str:
    """The torch example's answer for a batch of 8 against the same network on the CPU; '' when it matches."""
    import importlib.util

    import numpy as np
    import torch

    spec = importlib.util.spec_from_file_location("torch_mlp_model", TORCH_MLP / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = np.random.default_rng(0).standard_normal((8, 16), dtype=np.float32)
    with torch.inference_mode():
        want = module.build_network().eval()(torch.from_numpy(x)).numpy()
    status, reply = _post(srv.http_port, "/v2/models/torch_mlp/infer",
                          {"inputs": [{"name": "INPUT0", "shape": [8, 16], "datatype": "FP32", "data": x.ravel().tolist()}]})
    if status != 200:
        return f"HTTP {status} {str(reply)[:300]}"
    got = np.array(reply["outputs"][0]["data"], np.float32).reshape(8, 4)
    return "" if np.allclose(got, want, rtol=1e-3, atol=1e-4) else f"differs from the CPU network by {abs(got - want).max():.3g}"


def first_bls_calls(srv: harness.Server) -> dict:
    """The first and the second BLS call with a 4 MiB GPU tensor after load (ms), and whether each was right."""
    out = {}
    for which in ("first", "second"):
        start = time.perf_counter()
        status, reply = _post(srv.http_port, "/v2/models/bls_gpu/infer",
                              {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [0.0]}]})
        out[f"{which}_ms"] = round((time.perf_counter() - start) * 1e3, 2)
        ok = status == 200 and reply and reply["outputs"][0]["data"] == [True]
        out[f"{which}_ok"] = bool(ok)
        if not ok:
            out[f"{which}_error"] = f"HTTP {status} {str(reply)[:300]}"
    return out


# ---- the run -------------------------------------------------------------------------------------------


def say(msg: str) -> None:
    print(f"[gpu-vs-triton] {msg}", file=sys.stderr, flush=True)


def measure(kind: str, args, tools: sr.Tools, repo: Path, logs: Path, deadline: float, cp) -> dict:
    label = "Triton" if kind == "triton" else "Kernel"
    entry: dict = {"server": label, "points": []}
    ports = PORTS[kind]
    say(f"{label}: starting")
    triton_extra = ["--cuda-memory-pool-byte-size=0:268435456"]  # 64 MiB tensors with room (default 64 MiB)
    try:
        srv = sr.start_server(kind, None, repo, ports, logs, tools, list(GPU_MODELS) + (["torch_mlp"] if args.torch else []),
                              timeout=180, label=label,
                              extra=triton_extra if kind == "triton" else [])
    except harness.BenchError as e:
        entry["error"] = str(e)[:3000]
        say(f"{label}: did not start: {str(e).splitlines()[0]}")
        return entry
    try:
        entry.update(startup_s=round(srv.startup_s, 2), command=srv.command, version=srv.metadata.get("version"))
        say(f"{label}: ready in {srv.startup_s:.1f} s")
        entry["first_bls"] = first_bls_calls(srv)
        say(f"{label}: first BLS calls {entry['first_bls']}")
        entry["shm_check"] = shm_identity_check(srv, cp) or "ok"
        say(f"{label}: CUDA-shm identity check: {entry['shm_check']}")
        if args.torch:
            entry["torch_check"] = torch_mlp_check(srv) or "ok"
            say(f"{label}: torch example check: {entry['torch_check']}")
        for sc in args.selected:
            left = deadline - time.monotonic()
            if left < 3 * args.window_ms / 1000 + 4:
                entry["points"].append({"scenario": sc.name, "server": label, "skipped": f"out of time ({left:.0f} s left)"})
                continue
            pt = sr.perf_point(srv, sc, tools, args.window_ms, logs) if tools.perf else \
                {"scenario": sc.name, "server": label, "skipped": "no perf_analyzer"}
            pt.pop("series", None)
            say(f"  {sc.name}: {_line(pt)}")
            entry["points"].append(pt)
    finally:
        srv.stop()
    return entry


def _line(pt: dict) -> str:
    if pt.get("skipped"):
        return f"skipped ({pt['skipped']})"
    parts = [f"{pt['infer_per_s']:,.0f} infer/s" if pt.get("infer_per_s") else "no client figure"]
    if pt.get("p99_ms") is not None:
        parts.append(f"p50 {pt['p50_ms']:.2f} / p99 {pt['p99_ms']:.2f} ms")
    if pt.get("error"):
        parts.append(f"ERROR {pt['error'][:200]}")
    return ", ".join(parts)


# ---- the report ----------------------------------------------------------------------------------------


def _pt(entry: dict | None, name: str) -> dict | None:
    if not entry:
        return None
    return next((p for p in entry["points"] if p["scenario"] == name and p.get("infer_per_s")), None)


def _cell(pt: dict | None) -> str:
    if pt is None:
        return "-"
    return f"{pt['infer_per_s']:,.0f} (p99 {pt['p99_ms']:.2f} ms)" if pt.get("p99_ms") is not None else \
        f"{pt['infer_per_s']:,.0f}"


def verdict(k: dict | None, t: dict | None, gpu: bool) -> str:
    if k is None or t is None:
        return "-"
    ratio = k["infer_per_s"] / t["infer_per_s"]
    text = f"{ratio:.2f}x"
    if gpu:
        p99_ok = k.get("p99_ms") is not None and t.get("p99_ms") is not None and k["p99_ms"] <= t["p99_ms"]
        text += " met" if ratio >= 1.5 and p99_ok else " NOT met" + ("" if ratio >= 1.5 else " (< 1.5x)") + \
            ("" if p99_ok else " (p99)")
    return text


def markdown(result: dict) -> str:
    by = {e["server"]: e for e in result["servers"]}
    kernel, triton = by.get("Kernel"), by.get("Triton")
    meta = result["meta"]
    lines = [f"# Kernel beside Triton 2.51 on a GPU ({meta['date']}, {meta['device']}, {meta['cpus']} CPUs)", "",
             f"`{meta['command']}`{' (DRY RUN: no GPU, CuPy stand-in, system shm for CUDA)' if meta['dry_run'] else ''}",
             "", "perf_analyzer infer/s (p99); ratio Kernel / Triton. Target: GPU scenarios at least 1.5x Triton "
             "at equal or better p99.", "",
             "| scenario | Triton | Kernel | Kernel / Triton |", "| --- | ---: | ---: | --- |"]
    for sc in result["scenarios"]:
        k, t = _pt(kernel, sc["name"]), _pt(triton, sc["name"])
        lines.append(f"| {sc['title']} | {_cell(t)} | {_cell(k)} | "
                     f"{verdict(k, t, sc['name'].startswith(GPU_SCENARIOS))} |")
    lines += ["", "CUDA-shm small inputs against system-shm small inputs on the same server (target: within 2x, "
              "that is CUDA infer/s at least half of system's):", "", "| server | protocol | system shm | CUDA shm | CUDA / system |",
              "| --- | --- | ---: | ---: | --- |"]
    for e in (triton, kernel):
        for proto in ("http", "grpc"):
            s, c = _pt(e, f"add_sub_sysshm_{proto}"), _pt(e, f"add_sub_cudashm_{proto}")
            if e is None:
                continue
            ratio = f"{c['infer_per_s'] / s['infer_per_s']:.2f}" + (" met" if c['infer_per_s'] * 2 >= s['infer_per_s']
                                                                    else " NOT met") if s and c else "-"
            lines.append(f"| {e['server']} | {proto} | {_cell(s)} | {_cell(c)} | {ratio} |")
    lines += ["", "| server | started in | first BLS call (4 MiB GPU tensor) | second | CUDA-shm check | torch example |",
              "| --- | ---: | ---: | ---: | --- | --- |"]
    for e in result["servers"]:
        b = e.get("first_bls") or {}
        check = e.get("shm_check") or "did not start: " + e.get("error", "-").splitlines()[0][:160]
        lines.append(f"| {e['server']} | {e.get('startup_s', '-')} s | {b.get('first_ms', '-')} ms | "
                     f"{b.get('second_ms', '-')} ms | {check.replace('|', '/')} | {e.get('torch_check', '-')} |")
    errors = [(e["server"], p["scenario"], p["error"]) for e in result["servers"] for p in e["points"] if p.get("error")]
    if errors:
        lines += ["", "## Errors", ""] + [f"- {s} {n}: {m[:300]}" for s, n, m in errors]
    for e in result["servers"]:
        if e.get("error"):  # a server that did not start: its log's last lines say why
            lines += ["", f"## {e['server']} did not start", "", "```", e["error"][-1500:], "```"]
    lines += ["", "Commands: " + "; ".join(f"{e['server']}: `{e.get('command', '-')}`" for e in result["servers"]), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--perf-dir", help="folder with perf_analyzer and its libraries (default: benchmarks/.peers)")
    p.add_argument("--triton-root", help="unpacked ../shared/bench/pack-triton.sh (default: benchmarks/.peers)")
    p.add_argument("--servers", default="triton,kernel")
    p.add_argument("--window-ms", type=int, default=1500)
    p.add_argument("--budget-s", type=float, default=420.0, help="no new point after this many seconds")
    p.add_argument("--dry-run", action="store_true", help="no GPU: Kernel on the CuPy stand-in, system shm, 1 MiB")
    args = p.parse_args(argv)
    start = time.monotonic()
    deadline = start + args.budget_s
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    import importlib.util

    args.torch = importlib.util.find_spec("torch") is not None  # (the GPU image has it; here it is too big)
    if args.dry_run:
        args.torch = False
        sys.path.insert(0, str(ROOT / "tests"))
        from fake_gpu import FAKE, load_fake  # the stand-in: Kernel's workers import it as cupy

        cp = load_fake()
        os.environ.update(KERNEL_GPU_IDS="0", PYTHONPATH=os.pathsep.join(filter(None, [str(FAKE), os.environ.get("PYTHONPATH")])))
        args.window_ms = min(args.window_ms, 500)
        args.selected = scenarios("system", {"1 MiB": MIB}, False)
        device = "no GPU (dry run)"
    else:
        import cupy as cp

        args.selected = scenarios("cuda", SIZES, args.torch)
        device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    tools = sr.find_tools(args.perf_dir, args.triton_root)
    for note in tools.notes:
        say(note)
    repo = build_repo(args.out / "models", args.torch)
    if not args.torch:
        say("torch is not installed here: the torch example is left out")
    result = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": device,
                       "cpus": os.cpu_count(), "host": platform.node(), "dry_run": args.dry_run,
                       "command": "python benchmarks/gpu_vs_triton.py " + " ".join(argv if argv is not None else sys.argv[1:])},
              "scenarios": [{"name": s.name, "title": s.title, "command_extra": list(s.extra)} for s in args.selected],
              "servers": []}
    for kind in args.servers.split(","):
        if kind == "triton" and tools.triton_home is None:
            result["servers"].append({"server": "Triton", "points": [], "error": "no real Triton (see the notes)"})
            continue
        result["servers"].append(measure(kind, args, tools, repo, logs, deadline, cp))
        (args.out / "gpu.json").write_text(json.dumps(result, indent=1))  # after each server: a cut run keeps it
    (args.out / "gpu.md").write_text(markdown(result))
    say(f"done in {time.monotonic() - start:.0f} s: {args.out / 'gpu.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which Python HTTP server should carry Kernel's HTTP transport? Measure it.

Each candidate runs in its own subprocess on one core; the load generator
(``wrk``, Debian package) runs in a separate process on the other core. The
request is a tiny POST (a ~100-byte JSON body) that the app parses before
answering with a small JSON document, roughly the shape of a KServe v2 call
without the tensor math.

Candidates:

* ``uvicorn-raw``       raw ASGI callable on uvicorn (loop=uvloop, http=httptools)
* ``uvicorn-starlette`` the same endpoint as a Starlette route on uvicorn
* ``hypercorn-raw``     raw ASGI callable on hypercorn, served from a uvloop loop

Usage::

    python benchmarks/http_servers.py [--duration 5] [--connections 16] \
        [--servers uvicorn-raw,uvicorn-starlette,hypercorn-raw] [--out benchmarks/results]

Prints a markdown table and writes it to ``<out>/http_servers.md``.
(``--serve NAME --port P`` is the internal entry point for the server subprocess.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

REQUEST_BODY = json.dumps(
    {"id": "42", "inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1.5, 2.5, 3.5, 4.5]}], "outputs": []},
    separators=(",", ":"),
)
RESPONSE_BODY = json.dumps(
    {"id": "42", "model_name": "echo", "model_version": "1", "outputs": []}, separators=(",", ":")
).encode()

SERVERS = ("uvicorn-raw", "uvicorn-starlette", "hypercorn-raw")
DESCRIPTIONS = {
    "uvicorn-raw": "raw ASGI app, uvicorn (uvloop + httptools)",
    "uvicorn-starlette": "Starlette app, uvicorn (uvloop + httptools)",
    "hypercorn-raw": "raw ASGI app, hypercorn (h11, uvloop loop)",
}


# --------------------------------------------------------------------------- apps (server side)


async def raw_app(scope, receive, send):
    """Minimal ASGI app: read the whole body, parse it, answer with a small JSON document."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    json.loads(body)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(RESPONSE_BODY)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": RESPONSE_BODY})


def starlette_app():
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def infer(request: Request) -> Response:
        await request.json()
        return Response(RESPONSE_BODY, media_type="application/json")

    return Starlette(routes=[Route("/v2/models/echo/infer", infer, methods=["POST"])])


def serve(name: str, port: int) -> None:
    if name in ("uvicorn-raw", "uvicorn-starlette"):
        import uvicorn

        app = raw_app if name == "uvicorn-raw" else starlette_app()
        uvicorn.run(
            app,
            host="127.0.0.1",
            port=port,
            loop="uvloop",
            http="httptools",
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
    elif name == "hypercorn-raw":
        import asyncio

        from hypercorn.asyncio import serve as hypercorn_serve
        from hypercorn.config import Config

        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is a Kernel dependency
            uvloop = None
        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.accesslog = None
        config.errorlog = None
        config.loglevel = "WARNING"
        stop = None

        async def main():
            nonlocal stop
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGTERM, stop.set)
            loop.add_signal_handler(signal.SIGINT, stop.set)
            await hypercorn_serve(raw_app, config, shutdown_trigger=stop.wait, mode="asgi")

        if uvloop is not None:
            uvloop.run(main())
        else:
            asyncio.run(main())
    else:
        raise SystemExit(f"unknown server {name!r}")


# --------------------------------------------------------------------------- harness (client side)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early with code {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("server did not start listening in time")


def pin(cpu: int | None) -> list[str]:
    if cpu is None or not shutil.which("taskset"):
        return []
    return ["taskset", "-c", str(cpu)]


def parse_wrk(text: str) -> dict:
    out: dict = {}
    m = re.search(r"Requests/sec:\s*([\d.]+)", text)
    out["rps"] = float(m.group(1)) if m else None
    for pct in ("50", "99"):
        m = re.search(rf"^\s*{pct}(?:\.0+)?%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
        if m:
            value, unit = float(m.group(1)), m.group(2)
            out[f"p{pct}_ms"] = value * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    m = re.search(r"(\d+) requests in", text)
    out["requests"] = int(m.group(1)) if m else None
    m = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", text)
    out["errors"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors:.*", text)
    out["socket_errors"] = m.group(0) if m else ""
    return out


def run_one(name: str, args, lua_path: str) -> dict:
    port = free_port()
    server_cmd = pin(args.server_cpu) + [sys.executable, str(Path(__file__).resolve()), "--serve", name, "--port", str(port)]
    proc = subprocess.Popen(server_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_listening(port, proc)
        url = f"http://127.0.0.1:{port}/v2/models/echo/infer"
        wrk = pin(args.client_cpu) + ["wrk", "-t1", f"-c{args.connections}", "--latency", "-s", lua_path]
        # warm-up, then the measured run
        subprocess.run(wrk + ["-d1s", url], capture_output=True, text=True, timeout=30)
        res = subprocess.run(wrk + [f"-d{args.duration}s", url], capture_output=True, text=True, timeout=args.duration + 30)
        stats = parse_wrk(res.stdout)
        stats["raw"] = res.stdout
        if stats["rps"] is None:
            raise RuntimeError(f"could not parse wrk output:\n{res.stdout}\n{res.stderr}")
        return stats
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if err.strip() and args.verbose:
            print(f"[{name} stderr]\n{err[-2000:]}", file=sys.stderr)


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = [f"Python {platform.python_version()}"]
    for pkg in ("uvicorn", "httptools", "uvloop", "starlette", "hypercorn"):
        try:
            parts.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            pass
    wrk_v = subprocess.run(["wrk", "-v"], capture_output=True, text=True)
    first = (wrk_v.stdout or wrk_v.stderr).splitlines()
    if first:
        parts.append(first[0].split(" [")[0].strip())
    return ", ".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=5, help="seconds of measured load per server (default 5)")
    ap.add_argument("--connections", type=int, default=16, help="wrk connections (default 16)")
    ap.add_argument("--servers", default=",".join(SERVERS), help="comma-separated subset of " + ", ".join(SERVERS))
    ap.add_argument("--out", default=str(HERE / "results"), help="folder for http_servers.md")
    ap.add_argument("--server-cpu", type=int, default=0, help="CPU the server is pinned to (taskset); -1 for none")
    ap.add_argument("--client-cpu", type=int, default=1, help="CPU wrk is pinned to (taskset); -1 for none")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.serve:
        serve(args.serve, args.port)
        return 0

    if not shutil.which("wrk"):
        print("wrk not found: apt-get update && apt-get install -y wrk", file=sys.stderr)
        return 2
    if os.cpu_count() and os.cpu_count() < 2:
        args.server_cpu = args.client_cpu = -1
    args.server_cpu = None if args.server_cpu < 0 else args.server_cpu
    args.client_cpu = None if args.client_cpu < 0 else args.client_cpu

    names = [n.strip() for n in args.servers.split(",") if n.strip()]
    for n in names:
        if n not in SERVERS:
            ap.error(f"unknown server {n!r}")

    lua = (
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(REQUEST_BODY)}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    results = {}
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(lua)
        lua_path = f.name
    try:
        for n in names:
            print(f"measuring {n} ...", file=sys.stderr, flush=True)
            load = os.getloadavg()[0]
            results[n] = run_one(n, args, lua_path)
            results[n]["loadavg_1m"] = load
    finally:
        os.unlink(lua_path)

    base = results.get("uvicorn-raw", {}).get("rps")
    lines = [
        "| server | req/s | vs uvicorn raw | p50 ms | p99 ms | non-2xx |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n, r in results.items():
        rel = f"{r['rps'] / base:.2f}x" if base else "-"
        lines.append(
            f"| {DESCRIPTIONS[n]} | {r['rps']:,.0f} | {rel} | {r.get('p50_ms', float('nan')):.2f} | "
            f"{r.get('p99_ms', float('nan')):.2f} | {r['errors']} |"
        )
    pinning = (
        f"server pinned to CPU {args.server_cpu}, wrk to CPU {args.client_cpu}"
        if args.server_cpu is not None
        else "no CPU pinning"
    )
    header = (
        f"POST of a {len(REQUEST_BODY)}-byte JSON body, {len(RESPONSE_BODY)}-byte JSON response; "
        f"`wrk -t1 -c{args.connections} -d{args.duration}s` (after a 1 s warm-up), loopback, one server "
        f"process, {pinning}; {os.cpu_count()} CPUs; 1-min load average before each run: "
        + ", ".join(f"{r['loadavg_1m']:.2f}" for r in results.values())
        + " (the box is shared; higher means other work competed).  \n"
        f"{versions()}."
    )
    table = "\n".join(lines)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    (out / "http_servers.md").write_text(
        f"# HTTP server candidates ({stamp})\n\n{header}\n\n{table}\n\n"
        f"Command: `python benchmarks/http_servers.py --duration {args.duration} --connections {args.connections}`\n"
    )
    print(f"\nwritten {out / 'http_servers.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

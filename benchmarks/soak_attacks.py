"""The soak's attacks of issue 31, beside its normal traffic: what a hostile or unlucky client did to
the surfaces of the round before (OpenAI API, Redis cache, gRPC compression), each repeated for the
whole soak, and a probe of /v2/health/live that shows whether the front's event loop kept up.

benchmarks/soak.py runs them with --attacks (all by default; a comma-separated subset, or none).
Sizes are those of the issue's reproductions times --attack-scale (1.0). What each expects:

- gzip_http, gzip_grpc (N1): an infer body, and a gRPC message flagged gzip, made of many empty
  gzip members (20 bytes each; 4 MiB and 3 MiB): a 4xx / a gRPC error status, at once;
- openai_fanout (N2): /v1/completions and /v1/chat/completions with an 8 MiB prompt and n=128, and
  a body with an extra field of 2M integers and n=2: 200 with every choice, or a 4xx;
- openai_non_reader (N4): six clients ask for large non-streamed answers (2048 x 4096-float
  embeddings; 16 echoes of a 1 MiB prompt) and never read: each cut once the stall timeout passes;
- template (N5): chat to a model whose chat template loops (nearly) forever, and to one whose
  template renders a 1 GiB prompt: an error answer, the server live meanwhile;
- embeddings (N7): 2048 inputs of 4096 floats, and one vector of 10M floats: 200, every checked
  element right;
- redis_large (N8): 40 concurrent requests for a 60 MiB answer in the Redis cache: all right (hits
  once stored); redis_forged (N11): an entry forged in Redis (cut short, wrong datatype, broken
  digest) for a request: the answer is computed, byte for byte the model's.

A kind with WRONG or HELD PAST in it fails the soak, as does a lost request, a health-check p99
over --health-p99-ms, or a front RSS over the bound `rss_bound_mb` states.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import http.client
import json
import random
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from soak_ownership import (DATA, GOAWAY, HEADERS, PREFACE, RST_STREAM, SETTINGS, h2_frame, http_request,
                            never_read, read_http_response)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ATTACK_MODELS = HERE / "model_repo_soak_attacks"
TINY_LM = ROOT / "model_repo_examples" / "tiny_lm"
CACHED_BIG = ROOT / "tests" / "models" / "cache" / "cached_big"  # SIZE bytes of a pattern; response_cache on
ALL = ("gzip_http", "gzip_grpc", "openai_fanout", "openai_non_reader", "template", "embeddings", "redis_large",
       "redis_forged")
REDIS_ATTACKS = ("redis_large", "redis_forged")
MIB = 1 << 20
PATTERN = np.arange(251, dtype=np.uint8)
RUNAWAY_TEMPLATE = ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
                    "{{ messages[0]['content'] }}")
# What the Redis cache may hold itself (kernel.core.cache_redis: pool_size x 4 MiB of lookups, two
# 64 MiB large reads, 128 MiB of inserts), with pool_size 1.
REDIS_CACHE_BOUND_MB = 4 + 2 * 64 + 128
SLACK_MB = 512  # answers passing through, the models' arenas, allocator slack

# Polls /v2/health/live from its own process until SIGTERM: a line "s <t>" as a check starts and
# "d <t> <latency>" when it ends (CLOCK_MONOTONIC, seconds), flushed at once, so a check the server
# never answered is still seen when the soak ends.
PROBE = """
import http.client, signal, sys, time
host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
with open(path, "w", buffering=1) as out:
    while not stop:
        t0 = time.monotonic()
        out.write(f"s {t0}\\n")
        try:
            c = http.client.HTTPConnection(host, port, timeout=600)
            c.request("GET", "/v2/health/live")
            c.getresponse().read()
            c.close()
        except OSError:
            pass
        out.write(f"d {t0} {time.monotonic() - t0}\\n")
        time.sleep(0.05)
"""


def selected(spec: str, redis_available: bool) -> tuple[list[str], str]:
    """(the attacks to run, a note on any left out) for --attacks."""
    names = list(ALL) if spec == "all" else [] if spec == "none" else [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL]
    if unknown:
        raise SystemExit(f"unknown attack(s) {', '.join(unknown)}; known: {', '.join(ALL)}")
    if not redis_available and any(n in REDIS_ATTACKS for n in names):
        names = [n for n in names if n not in REDIS_ATTACKS]
        return names, "redis attacks left out: no redis-server on PATH"
    return names, ""


def add_models(repo: Path, names: list[str], scale: float) -> list[str]:
    """Copy the models the attacks need into `repo`; returns their names (to load)."""
    out = []

    def copy(src: Path, name: str, edit=None) -> None:
        shutil.copytree(src, repo / name)
        config = repo / name / "config.pbtxt"
        text = config.read_text().replace(f'name: "{src.name}"', f'name: "{name}"')
        config.write_text(edit(text) if edit else text)
        out.append(name)

    if {"openai_fanout", "openai_non_reader", "template"} & set(names):
        copy(TINY_LM, "tiny_lm")
    if "template" in names:
        copy(TINY_LM, "runaway_lm")
        (repo / "runaway_lm" / "tokenizer_config.json").write_text(json.dumps({"chat_template": RUNAWAY_TEMPLATE}))
        copy(TINY_LM, "huge_template_lm")
        (repo / "huge_template_lm" / "tokenizer_config.json").write_text(
            json.dumps({"chat_template": "{{ 'x' * %d }}" % int((1 << 30) * scale)}))
    if {"embeddings", "openai_non_reader"} & set(names):
        copy(ATTACK_MODELS / "embed_wide", "embed_wide")
        copy(ATTACK_MODELS / "embed_wide", "embed_huge",
             lambda t: t.replace('string_value: "4096"', f'string_value: "{max(1, int(10_000_000 * scale))}"'))
    if set(REDIS_ATTACKS) & set(names):
        copy(CACHED_BIG, "cached_big")
    return out


def rss_bound_mb(first_rss_mb: float, max_held_output: int, max_held_input: int) -> float:
    """The front's RSS bound: where it started, plus every byte the held-output and held-input
    accounts allow, plus what the Redis cache may hold, plus slack."""
    return first_rss_mb + max_held_output / MIB + max_held_input / MIB + REDIS_CACHE_BOUND_MB + SLACK_MB


class HealthProbe:
    def __init__(self, http_port: int, path: Path):
        self.path = path
        self.proc = subprocess.Popen([sys.executable, "-c", PROBE, "127.0.0.1", str(http_port), str(path)])

    def stop(self) -> dict:
        """p50, p99 and max latency (ms) of the checks, the worst 10 s, and how many took over 100 ms."""
        end = time.monotonic()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        started, done = {}, []
        for line in self.path.read_text().splitlines():
            parts = line.split()
            if parts[0] == "s":
                started[parts[1]] = float(parts[1])
            elif len(parts) == 3:
                started.pop(parts[1], None)
                done.append((float(parts[1]), float(parts[2])))
        done += [(t, end - t) for t in started.values()]  # never answered: as long as the soak lasted since
        if not done:
            return {"checks": 0}
        lat = sorted(x for _, x in done)
        windows: dict[int, float] = {}
        t0 = done[0][0]
        for t, x in done:
            w = int((t - t0) // 10)
            windows[w] = max(windows.get(w, 0.0), x)
        worst = max(windows, key=windows.get)
        return {"checks": len(lat), "p50_ms": round(lat[len(lat) // 2] * 1e3, 1),
                "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3, 1),
                "max_ms": round(lat[-1] * 1e3, 1), "over_100ms": sum(x > 0.1 for x in lat),
                "worst_window_s": worst * 10, "worst_window_max_ms": round(windows[worst] * 1e3, 1)}


def _took(seconds: float) -> str:
    return "in <1 s" if seconds < 1 else "in 1-5 s" if seconds < 5 else "SLOW >5 s"


def _pattern(size: int) -> bytes:
    return np.resize(PATTERN, size).tobytes()


class Attacks:
    """The loops; `soak` is the Soak (its ledger, running(), ports)."""

    def __init__(self, soak, names: list[str], scale: float, stall_s: float, openai_port: int, redis_port: int):
        self.soak = soak
        self.names = names
        self.scale = scale
        self.stall_s = stall_s
        self.openai_port = openai_port
        self.redis_port = redis_port

    def size(self, n: int) -> int:
        return max(1, int(n * self.scale))

    def tasks(self) -> list:
        loops = {"gzip_http": (self._gzip_http, 15), "gzip_grpc": (self._gzip_grpc, 15),
                 "openai_fanout": (self._fanout, 30), "openai_non_reader": (self._non_readers, 30),
                 "template": (self._templates, 60), "embeddings": (self._embeddings, 30),
                 "redis_large": (self._redis_large, 20), "redis_forged": (self._redis_forged, 10)}
        return [self._every(name, *loops[name]) for name in self.names]

    async def _every(self, stream: str, fn, period: float) -> None:
        """Run `fn` (blocking: on a thread) every `period` seconds; it returns [(kind, example)], one
        per request it made, or raises TimeoutError (a lost request)."""
        loop = asyncio.get_running_loop()
        k = 0
        while self.soak.running():
            k += 1
            try:
                outcomes = await loop.run_in_executor(None, fn, k)
            except (TimeoutError, socket.timeout) as exc:
                self.soak.ledger.send(stream)
                self.soak.ledger.lose(stream, f"no answer: {exc}"[:80])
            except OSError as exc:
                self.soak.ledger.send(stream)
                self.soak.ledger.lose(stream, f"{type(exc).__name__}: {exc}"[:80])
            except Exception as exc:  # noqa: BLE001 - an answer the attack could not read: lost, and named
                self.soak.ledger.send(stream)
                self.soak.ledger.lose(stream, f"unreadable answer: {type(exc).__name__}: {exc}"[:80])
            else:
                for kind, example in outcomes:
                    self.soak.ledger.send(stream)
                    self.soak.ledger.answer(stream, kind, example)
            deadline = time.monotonic() + period
            while self.soak.running() and time.monotonic() < deadline:
                await asyncio.sleep(0.5)

    # ---- HTTP helpers ------------------------------------------------------------------------

    def _post(self, port: int, path: str, body: bytes, headers: dict, timeout: float = 300.0):
        """(status, headers, body, seconds) of one POST on a fresh connection."""
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            try:
                s.sendall(http_request(path, body, headers))
            except (BrokenPipeError, ConnectionResetError):
                pass  # answered (and closed) before the whole body went: read what it said
            status, hdrs, data = read_http_response(s, time.monotonic() + timeout)
        return status, hdrs, data, time.monotonic() - t0

    def _openai(self, path: str, doc: dict, timeout: float = 300.0):
        return self._post(self.openai_port, path, json.dumps(doc).encode(), {"Content-Type": "application/json"},
                          timeout)

    @staticmethod
    def _expect_4xx(status: int, seconds: float, data: bytes) -> tuple[str, str]:
        kind = "(expected 4xx)" if 400 <= status < 500 else "UNEXPECTED"
        return f"{status} {kind} {_took(seconds)}", data[:160].decode("latin-1")

    # ---- N1: many gzip members -----------------------------------------------------------------

    def _gzip_http(self, _k: int) -> list:
        member = gzip.compress(b"", mtime=0)
        body = member * (self.size(4 * MIB) // len(member))
        status, _, data, took = self._post(self.soak.http_port, "/v2/models/add_sub/infer", body,
                                           {"Content-Encoding": "gzip", "Content-Type": "application/json"})
        return [self._expect_4xx(status, took, data)]

    def _gzip_grpc(self, _k: int) -> list:
        import hpack

        member = gzip.compress(b"", mtime=0)
        payload = member * (self.size(3 * MIB) // len(member))
        message = b"\x01" + struct.pack(">I", len(payload)) + payload
        port = self.soak.grpc_port
        block = hpack.Encoder().encode([
            (":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
            (":authority", f"127.0.0.1:{port}"), ("content-type", "application/grpc"), ("te", "trailers"),
            ("grpc-encoding", "gzip"), ("grpc-accept-encoding", "identity")])
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=300) as s:
            s.sendall(PREFACE + h2_frame(SETTINGS, 0, 0) + h2_frame(HEADERS, 0x4, 1, block))
            for i in range(0, len(message), 16384):
                s.sendall(h2_frame(DATA, 0x1 if i + 16384 >= len(message) else 0, 1, message[i:i + 16384]))
            status = _grpc_status(s, time.monotonic() + 300)
        took = time.monotonic() - t0
        kind = "(expected error)" if status not in ("0", None) else "UNEXPECTED"
        return [(f"grpc-status {status} {kind} {_took(took)}", "")]

    # ---- N2: fan-out -----------------------------------------------------------------------------

    def _fanout(self, k: int) -> list:
        big = "x" * self.size(8 * MIB)
        n = 128
        variants = [
            ("/v1/completions", {"model": "tiny_lm", "prompt": big, "n": n, "max_tokens": 1}, n),
            ("/v1/chat/completions", {"model": "tiny_lm", "messages": [{"role": "user", "content": big}], "n": n,
                                      "max_tokens": 1}, n),
            ("/v1/completions", {"model": "tiny_lm", "prompt": "hi", "n": 2, "max_tokens": 1,
                                 "extra_ints": list(range(self.size(2_000_000)))}, 2),
        ]
        path, doc, choices = variants[k % len(variants)]
        status, _, data, took = self._openai(path, doc)
        if status == 200:
            got = len(json.loads(data)["choices"])
            return [(f"200 ok {_took(took)}" if got == choices else f"200 WRONG ANSWER ({got} of {choices} choices)",
                     "")]
        return [self._expect_4xx(status, took, data)]

    # ---- N4: clients that never read a non-streamed answer ---------------------------------------

    def _non_readers(self, _k: int) -> list:
        from concurrent.futures import ThreadPoolExecutor

        docs = [("/v1/embeddings", {"model": "embed_wide", "input": ["t"] * self.size(2048)})] * 3
        docs += [("/v1/completions", {"model": "tiny_lm", "prompt": "y" * self.size(MIB), "n": 16, "max_tokens": 1,
                                      "echo": True})] * 3
        with ThreadPoolExecutor(len(docs)) as pool:
            return list(pool.map(lambda d: (self._never_read(*d), d[0]), docs))

    def _never_read(self, path: str, doc: dict) -> str:
        request = http_request(path, json.dumps(doc).encode(), {"Content-Type": "application/json"})
        return never_read(self.openai_port, request, self.stall_s)

    # ---- N5: chat templates ------------------------------------------------------------------------

    def _templates(self, k: int) -> list:
        model = ("runaway_lm", "huge_template_lm")[k % 2]
        status, _, data, took = self._openai("/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}, timeout=120)
        kind = "(expected error)" if status >= 400 else "UNEXPECTED"
        return [(f"{model}: {status} {kind} {_took(took)}", data[:160].decode("latin-1"))]

    # ---- N7: large embeddings ------------------------------------------------------------------------

    def _embeddings(self, k: int) -> list:
        if k % 2:
            n, model, doc = self.size(2048), "embed_wide", {}
            dims = 4096
        else:
            n, model, doc = 1, "embed_huge", {"encoding_format": "base64"}
            dims = max(1, int(10_000_000 * self.scale))
        texts = [f"text {i}" * (1 + i % 3) for i in range(n)]
        status, _, data, took = self._openai("/v1/embeddings", {"model": model, "input": texts, **doc})
        if status == 400 and b"--http-max-json-output-size" in data:
            # 2048 x 4096 floats pass 64 MiB of JSON: refused naming the limit (issue 31, N12), as it should be
            return [(f"{model}: 400 over the JSON answer limit (expected) {_took(took)}", data[:160].decode("latin-1"))]
        if status != 200:
            return [(f"{model}: {status} UNEXPECTED", data[:160].decode("latin-1"))]
        got = json.loads(data)["data"]
        del data
        ok = len(got) == n
        for i in random.sample(range(n), min(n, 8)) if ok else []:
            v = got[i]["embedding"]
            if isinstance(v, str):
                import base64

                v = np.frombuffer(base64.b64decode(v), dtype="<f4")
            j = random.randrange(dims)
            ok = ok and len(v) == dims and abs(float(v[j]) - (len(texts[i]) + j / dims)) < 1e-3 * (1 + len(texts[i]))
        return [(f"{model}: 200 ok {_took(took)}" if ok else f"{model}: 200 WRONG ANSWER", "")]

    # ---- N8, N11: the Redis cache --------------------------------------------------------------------

    def _big(self, size: int, data: bool) -> tuple[int, str, int]:
        """(COUNT, sha256 of DATA or "", status) of one cached_big request; DATA streamed, not kept."""
        outputs = [{"name": "COUNT", "parameters": {"binary_data": False}}]
        if data:
            outputs.append({"name": "DATA", "parameters": {"binary_data": True}})
        body = json.dumps({"inputs": [{"name": "SIZE", "shape": [1], "datatype": "INT64", "data": [size]}],
                           "outputs": outputs}).encode()
        c = http.client.HTTPConnection("127.0.0.1", self.soak.http_port, timeout=300)
        try:
            c.request("POST", "/v2/models/cached_big/infer", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                r.read()
                return 0, "", r.status
            head_len = r.getheader("Inference-Header-Content-Length")  # absent: the answer is all JSON
            head = json.loads(r.read(int(head_len)) if head_len else r.read())
            digest = hashlib.sha256()
            while chunk := r.read(MIB):
                digest.update(chunk)
            got = {o["name"]: o for o in head["outputs"]}
            return int(got["COUNT"]["data"][0]), digest.hexdigest() if data else "", 200
        finally:
            c.close()

    def _redis_large(self, _k: int) -> list:
        from concurrent.futures import ThreadPoolExecutor

        size = self.size(60 * MIB)
        expected = hashlib.sha256(_pattern(size)).hexdigest()
        first = self._big(size, True)  # stores it (or hits what an earlier round stored)
        time.sleep(0.5)
        with ThreadPoolExecutor(40) as pool:
            results = list(pool.map(lambda i: self._big(size, i == 0), range(40)))
        out = []
        for i, (count, digest, status) in enumerate([first, *results]):
            if status != 200:
                out.append((f"{status}", ""))
            elif (i <= 1 and digest != expected) or count <= 0:
                out.append(("200 WRONG ANSWER", f"COUNT {count}, DATA sha256 {digest[:16]}"))
            else:
                out.append(("200 hit" if count == first[0] and i else "200 ok", ""))
        return out

    def _redis_forged(self, k: int) -> list:
        import redis as redis_py

        from kernel.core.cache_key import redis_key
        from kernel.core.cache_redis_entry import encode, seal
        from kernel.core.request import InferRequest, InferTensor

        size = random.randint(1, 4096)
        request = InferRequest("cached_big", "", "", [InferTensor("SIZE", "INT64", (1,), raw=struct.pack("<q", size))])
        key = redis_key(_Model("cached_big", 1), request)
        count = _Tensor("COUNT", "INT64", [1], struct.pack("<q", 10**9))
        cases = [
            ("cut short", [_Tensor("DATA", "UINT8", [size], _pattern(size)[:-1]), count]),
            ("wrong datatype", [_Tensor("DATA", "FP32", [size], bytes(4 * size)), count]),
            ("broken digest", [_Tensor("DATA", "UINT8", [size], bytes(size)), count]),
        ]
        what, tensors = cases[k % len(cases)]
        value = seal(encode(tensors, None, True))
        if what == "broken digest":
            value[-1] ^= 0xFF
        client = redis_py.Redis(port=self.redis_port, socket_timeout=10)
        try:
            client.set(key, bytes(value))
        finally:
            client.close()
        count_got, digest, status = self._big(size, True)
        if status != 200:
            return [(f"{status}", what)]
        right = digest == hashlib.sha256(_pattern(size)).hexdigest() and count_got != 10**9
        return [("forged entry not served (expected)" if right else "WRONG ANSWER (a forged entry served)", what)]


class _Model:
    def __init__(self, name: str, version: int):
        self.name, self.version = name, version


class _Tensor:
    def __init__(self, name: str, datatype: str, shape: list, raw: bytes):
        self.name, self.datatype, self.shape, self.raw = name, datatype, shape, raw


def _grpc_status(sock: socket.socket, deadline: float):
    """The grpc-status of stream 1 (its trailers), "reset" or "closed"; reads until it comes."""
    import hpack

    decoder = hpack.Decoder()
    buf = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            return "closed"
        buf += chunk
        while len(buf) >= 9:
            n = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + n:
                break
            kind, flags, payload = buf[3], buf[4], buf[9:9 + n]
            buf = buf[9 + n:]
            if kind == HEADERS:
                if flags & 0x8:  # PADDED
                    payload = payload[1:len(payload) - payload[0]]
                if flags & 0x20:  # PRIORITY
                    payload = payload[5:]
                headers = dict(decoder.decode(payload))
                if flags & 0x1:
                    return headers.get("grpc-status", "none")
            elif kind == RST_STREAM:
                return "reset"
            elif kind == GOAWAY:
                return "goaway"
    raise TimeoutError("no gRPC status in time")

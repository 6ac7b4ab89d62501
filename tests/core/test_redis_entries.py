"""Entries of the redis response cache as they come back from a shared Redis (issue 31, N8 and N11):
a large entry is read once for every request waiting on it, in pieces, decoded off the loop, with
the front live and its memory bounded; an entry that cannot be the model's answer (forged, cut
short, of another format, of other outputs or datatypes) is never served: it is rejected, counted
in kernel_cache_num_rejected_entries, logged once, and the request is computed, its response then
replacing the entry. Against a real redis-server and `kernel serve`; cached_big answers SIZE bytes
of a fixed pattern and how many requests it has run (COUNT), so a hit is seen by the client."""

from __future__ import annotations

import hashlib
import http.client
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import msgspec
import numpy as np
import pytest
import redis as redis_py
import tritonclient.http as httpclient

from conftest import KernelProcess
from kernel.core.cache_key import redis_key
from kernel.core.cache_redis import MAX_ENTRY_BYTES
from kernel.core.cache_redis_entry import HEADER_BYTES, MAGIC, encode, seal
from kernel.core.request import InferRequest, InferTensor
from redis_server import RedisServer
from test_response_cache import REPO, SERVE, count, infer, metric, metrics, stats

MIB = 1 << 20
PATTERN = np.arange(251, dtype=np.uint8)
REJECTED = "kernel_cache_num_rejected_entries"
LOGGED = "was not used:"

# Polls /v2/health/live from its own process (the test's threads would add their GIL waits to the
# figures) until SIGTERM or `seconds` pass; prints [start, latency] pairs (CLOCK_MONOTONIC, the
# same in every process) as JSON.
PROBE = """
import http.client, json, signal, sys, time
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
out, end, stop = [], time.monotonic() + seconds, []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
while time.monotonic() < end and not stop:
    c = http.client.HTTPConnection(host, port, timeout=30)
    t0 = time.monotonic()
    c.request("GET", "/v2/health/live")
    c.getresponse().read()
    out.append((t0, time.monotonic() - t0))
    c.close()
    time.sleep(0.005)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    r = RedisServer(tmp_path_factory.mktemp("redis"))
    yield r
    r.kill()


@pytest.fixture(scope="module")
def kernel(redis):
    k = KernelProcess([REPO], *redis.flags(), *SERVE)
    try:
        yield k.wait_ready()
    finally:
        k.stop()


def big(k: KernelProcess, size: int, data: bool = True) -> tuple[int, str]:
    """(COUNT, sha256 of DATA or "") of one cached_big request over HTTP; DATA streamed, not kept."""
    outputs = [{"name": "COUNT", "parameters": {"binary_data": False}}]
    if data:
        outputs.append({"name": "DATA", "parameters": {"binary_data": True}})
    body = json.dumps({"inputs": [{"name": "SIZE", "shape": [1], "datatype": "INT64", "data": [size]}],
                       "outputs": outputs}).encode()
    host, port = k.url.split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        c.request("POST", "/v2/models/cached_big/infer", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200, r.read()[:500]
        head_len = int(r.getheader("Inference-Header-Content-Length") or r.getheader("Content-Length"))
        head = json.loads(r.read(head_len))
        digest = hashlib.sha256()
        while chunk := r.read(1 << 20):
            digest.update(chunk)
        got = {o["name"]: o for o in head["outputs"]}
        return int(got["COUNT"]["data"][0]), digest.hexdigest() if data else ""
    finally:
        c.close()


def pattern_digest(size: int) -> str:
    return hashlib.sha256(np.resize(PATTERN, size).tobytes()).hexdigest()


def rss_kb(k: KernelProcess, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{k.proc.pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def hits(k: KernelProcess, model: str) -> int:
    return stats(k, model)["inference_stats"]["cache_hit"]["count"]


def wait_stored(k: KernelProcess, entries: int, timeout: float = 30.0) -> None:
    """Until this server has written `entries` entries (inserts are not awaited by the request)."""
    deadline = time.monotonic() + timeout
    while metric(metrics(k), "nv_cache_num_entries") < entries:
        assert time.monotonic() < deadline, "the entry was never stored"
        time.sleep(0.1)


def probe(k: KernelProcess, seconds: float) -> subprocess.Popen:
    host, port = k.url.split(":")
    return subprocess.Popen([sys.executable, "-c", PROBE, host, port, str(seconds)], stdout=subprocess.PIPE, text=True)


def p99(latencies: list[float]) -> float:
    return sorted(latencies)[max(0, int(len(latencies) * 0.99) - 1)]


def test_forty_concurrent_hits_on_a_60_mib_entry_read_it_once_and_the_front_stays_live(kernel):
    size = 60 * MIB
    stored = metric(metrics(kernel), "nv_cache_num_entries")
    executed, digest = big(kernel, size)
    assert digest == pattern_digest(size)
    wait_stored(kernel, stored + 1)
    before_hits, rss0 = hits(kernel, "cached_big"), rss_kb(kernel)
    prober = probe(kernel, 30.0)
    time.sleep(0.5)
    peak = [rss0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_kb(kernel))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    # Three rounds of 40 at once. They ask for COUNT only, so that what is measured is the cache's
    # reading (each round reads the 60 MiB entry anew), not 40 copies of 60 MiB going to clients.
    results: list = []
    t0 = time.monotonic()
    for _ in range(3):
        answers: list = [None] * 40
        threads = [threading.Thread(target=lambda i=i: answers.__setitem__(i, big(kernel, size, data=False)))
                   for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        results += answers
    t1 = time.monotonic()
    done.set()
    sampler.join()
    prober.terminate()
    probes = [(start, took) for start, took in json.loads(prober.communicate(timeout=60)[0]) if t0 <= start <= t1]
    latencies = [took for _, took in probes]
    grown_mib = (peak[0] - rss0) / 1024
    print(f"3 x 40 hits on a 60 MiB entry: {t1 - t0:.2f} s, health p99 {p99(latencies) * 1000:.1f} ms, max "
          f"{max(latencies) * 1000:.1f} ms ({len(latencies)} probes), front RSS +{grown_mib:.0f} MiB, "
          f"hits {hits(kernel, 'cached_big') - before_hits}")
    # Every request is a hit: the model ran nothing more, the answer is the stored one, byte for byte.
    assert [r[0] for r in results] == [executed] * 120, results
    assert hits(kernel, "cached_big") - before_hits == 120
    assert big(kernel, size) == (executed, digest)
    # The loop kept answering while 120 requests read a 60 MiB entry (2.3 s frozen before).
    assert len(latencies) >= 10 and p99(latencies) < 0.1 and max(latencies) < 0.25, latencies
    # One read per round (40 copies in one MGET reply before): the front grew by at most the large
    # reads' bound, LARGE_READS x MAX_ENTRY_BYTES, and some slack.
    assert grown_mib < 2 * 64 + 64, f"front RSS grew {grown_mib:.0f} MiB"


def test_many_mid_sized_entries_looked_up_at_once_all_hit_over_several_batches(kernel):
    sizes = [200 * 1024 + i for i in range(40)]  # 8 MB in all: over one lookup batch's 4 MiB budget
    stored = metric(metrics(kernel), "nv_cache_num_entries")
    first = {}
    for s in sizes:
        first[s] = big(kernel, s)[0]
    wait_stored(kernel, stored + len(sizes))
    before = hits(kernel, "cached_big")
    results: dict = {}
    threads = [threading.Thread(target=lambda s=s: results.__setitem__(s, big(kernel, s))) for s in sizes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert {s: r[0] for s, r in results.items()} == first
    assert all(r[1] == pattern_digest(s) for s, r in results.items())
    assert hits(kernel, "cached_big") - before == len(sizes)


def _key(model: str, **inputs: np.ndarray) -> bytes:
    """The Redis key Kernel computes for a KServe request with these inputs and nothing else."""
    request = InferRequest(model, "", "", [
        InferTensor(name, "BYTES" if a.dtype == np.object_ else {"float32": "FP32", "int64": "INT64"}[str(a.dtype)],
                    a.shape, array=a) for name, a in inputs.items()])
    return redis_key(SimpleNamespace(name=model, version=1), request)


def _tensor(name: str, datatype: str, shape, raw: bytes):
    return SimpleNamespace(name=name, datatype=datatype, shape=shape, raw=raw)


def _entry(*tensors, all_outputs: bool = True) -> bytes:
    return bytes(seal(encode(list(tensors), None, all_outputs)))


def _forged_cases():
    four = np.zeros(4, dtype=np.float32).tobytes()
    good_count = _tensor("COUNT", "INT64", [1], np.array([999], dtype=np.int64).tobytes())
    flipped = bytearray(_entry(_tensor("OUTPUT0", "FP32", [4], four), _tensor("OUTPUT1", "FP32", [4], four),
                               good_count))
    flipped[-1] ^= 0xFF
    return [
        ("3 bytes for FP32[4]", _entry(_tensor("OUTPUT0", "FP32", [4], b"\x00\x00\x80"),
                                        _tensor("OUTPUT1", "FP32", [4], four), good_count)),
        ("an unknown datatype", _entry(_tensor("OUTPUT0", "FP128", [4], four * 4),
                                        _tensor("OUTPUT1", "FP32", [4], four), good_count)),
        ("another datatype than the config's", _entry(_tensor("OUTPUT0", "INT32", [4], four),
                                                       _tensor("OUTPUT1", "FP32", [4], four), good_count)),
        ("an output the model does not have", _entry(_tensor("EVIL", "FP32", [4], four),
                                                      _tensor("OUTPUT1", "FP32", [4], four), good_count)),
        ("a digest that does not match", bytes(flipped)),
        ("another format", msgspec.msgpack.encode([1, True, b"", [["OUTPUT0", "FP32", [4], four]]])),
        ("only a header", MAGIC + bytes(HEADER_BYTES - len(MAGIC))),
        ("a negative dimension", bytes(seal(bytearray(MAGIC + bytes(16) + msgspec.msgpack.encode(
            [True, b"", [["OUTPUT0", "FP32", [-4], four]]]))))),
    ]


def test_forged_entries_are_rejected_counted_logged_once_and_recomputed(redis, kernel):
    c = httpclient.InferenceServerClient(kernel.url)
    cases = _forged_cases()
    base = metric(metrics(kernel), REJECTED)
    for i, (what, value) in enumerate(cases):
        a = np.array([i, 1, 2, 3], dtype=np.float32)
        b = np.array([1, 1, 1, 1], dtype=np.float32)
        key = _key("cached_add_sub", INPUT0=a, INPUT1=b)
        client = redis_py.Redis(port=redis.port)
        client.set(key, value)
        executed_before = stats(kernel, "cached_add_sub")["execution_count"]
        r = infer(c, "cached_add_sub", a, b)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b, err_msg=what)  # computed, right
        np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b, err_msg=what)
        assert count(r) != 999, what
        assert stats(kernel, "cached_add_sub")["execution_count"] == executed_before + 1, what
        assert metric(metrics(kernel), REJECTED) == base + i + 1, what
        # The computed response replaced the forged entry: the same request is now a hit.
        deadline = time.monotonic() + 10
        while client.get(key) == value and time.monotonic() < deadline:
            time.sleep(0.05)
        again = infer(c, "cached_add_sub", a, b)
        assert count(again) == count(r), what
        client.close()
    assert kernel.log().count(LOGGED) == 1, kernel.log()[-3000:]
    c.close()


def test_a_malformed_bytes_output_or_a_non_string_key_is_rejected(redis, kernel):
    client = redis_py.Redis(port=redis.port)
    base = metric(metrics(kernel), REJECTED)
    prompt = np.array([b"malformed"], dtype=np.object_)
    key = _key("cached_lm", text_input=prompt)
    # Says one element of 100 bytes, holds 3.
    client.set(key, _entry(_tensor("text_output", "BYTES", [1], b"\x64\x00\x00\x00abc")))
    c = httpclient.InferenceServerClient(kernel.url)
    x = httpclient.InferInput("text_input", [1], "BYTES")
    x.set_data_from_numpy(prompt)
    assert c.infer("cached_lm", [x]).as_numpy("text_output")[0].startswith(b"malformed | {} | corr 0 | run ")
    prompt2 = np.array([b"a list"], dtype=np.object_)
    key2 = _key("cached_lm", text_input=prompt2)
    client.rpush(key2, b"not", b"a", b"string")
    x.set_data_from_numpy(prompt2)
    assert c.infer("cached_lm", [x]).as_numpy("text_output")[0].startswith(b"a list | ")
    assert metric(metrics(kernel), REJECTED) == base + 2
    client.close()
    c.close()


def test_an_entry_over_the_size_limit_is_not_stored_and_not_read(redis, kernel):
    size = MAX_ENTRY_BYTES + 1
    executed = big(kernel, size)[0]
    time.sleep(1.0)
    assert big(kernel, size)[0] == executed + 1  # not stored: computed again
    # One written there by someone else is rejected by its length alone, without being read.
    client = redis_py.Redis(port=redis.port)
    key = _key("cached_big", SIZE=np.array([7], dtype=np.int64))
    client.setrange(key, MAX_ENTRY_BYTES, b"x")
    base, rss0 = metric(metrics(kernel), REJECTED), rss_kb(kernel)
    before = stats(kernel, "cached_big")["execution_count"]
    assert big(kernel, 7) == (before + 1, pattern_digest(7))
    assert metric(metrics(kernel), REJECTED) == base + 1
    assert rss_kb(kernel) - rss0 < 32 * 1024
    client.close()


def test_without_lua_scripting_lookups_still_hit_read_large_entries_and_reject(tmp_path):
    """An ACL user without @scripting: lookups are pipelined STRLEN/GETRANGE, with the same bounds."""
    redis = RedisServer(tmp_path / "r", "--user", "cache", "on", ">pw", "~*", "+@all", "-@scripting")
    k = KernelProcess([REPO], *redis.flags("user=cache", "password=pw"), *SERVE)
    try:
        k.wait_ready()
        assert "refuses Lua scripts" in k.log()
        c = httpclient.InferenceServerClient(k.url)
        first = count(infer(c, "cached_add_sub", [1, 2, 3, 4], [1, 1, 1, 1]))
        executed, digest = big(k, 3 * MIB)
        wait_stored(k, 2)
        assert count(infer(c, "cached_add_sub", [1, 2, 3, 4], [1, 1, 1, 1])) == first
        assert big(k, 3 * MIB) == (executed, digest)
        assert hits(k, "cached_add_sub") == 1 and hits(k, "cached_big") == 1
        client = redis_py.Redis(port=redis.port, username="cache", password="pw")
        a, b = np.array([5, 5, 5, 5], dtype=np.float32), np.array([1, 1, 1, 1], dtype=np.float32)
        client.set(_key("cached_add_sub", INPUT0=a, INPUT1=b), _forged_cases()[0][1])
        np.testing.assert_array_equal(infer(c, "cached_add_sub", a, b).as_numpy("OUTPUT0"), a + b)
        assert metric(metrics(k), REJECTED) == 1
        client.close()
        c.close()
    finally:
        k.stop()
        redis.kill()

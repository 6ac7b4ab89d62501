"""The redis response cache (`--cache-config redis,host=...,port=...`) against a real redis-server
that the tests start: servers sharing one Redis share hits; a Redis that dies or stalls never
fails or holds up a request (the miss is counted, the log says why once); the settings and
start-up checks of Triton's redis cache. cached_add_sub returns how many requests it has
executed (COUNT), so where an answer was computed is seen by the client."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import ROOT, KernelProcess
from redis_server import RedisServer
from test_response_cache import REPO, SERVE, count, infer, metric, metrics, stats

UNAVAILABLE = "is unavailable"
BACK = "answers again; caching resumes"


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    r = RedisServer(tmp_path_factory.mktemp("redis"), "--requirepass", "s3cret")
    yield r
    r.kill()


@pytest.fixture(scope="module")
def pair(redis):
    """Two servers, one Redis."""
    flags = [*redis.flags("password=s3cret"), *SERVE]
    a, b = KernelProcess([REPO], *flags), KernelProcess([REPO], *flags)
    try:
        yield a.wait_ready(), b.wait_ready()
    finally:
        a.stop()
        b.stop()


def test_a_response_stored_by_one_server_is_a_hit_on_another(pair):
    a, b = pair
    ca, cb = httpclient.InferenceServerClient(a.url), httpclient.InferenceServerClient(b.url)
    first = infer(ca, "cached_add_sub", [1, 2, 3, 4], [4, 3, 2, 1])
    second = infer(ca, "cached_add_sub", [5, 5, 5, 5], [1, 1, 1, 1])
    assert (count(first), count(second)) == (1, 2)
    assert count(infer(ca, "cached_add_sub", [5, 5, 5, 5], [1, 1, 1, 1])) == 2  # a hit on the server that stored it
    # B never ran that request: it answers with A's response (COUNT 2; its own model would say 1).
    hit = infer(cb, "cached_add_sub", [5, 5, 5, 5], [1, 1, 1, 1])
    assert count(hit) == 2
    np.testing.assert_array_equal(hit.as_numpy("OUTPUT0"), [6, 6, 6, 6])
    np.testing.assert_array_equal(hit.as_numpy("OUTPUT1"), [4, 4, 4, 4])
    # Input order does not matter, the inputs' bytes do; gRPC shares the entries too.
    g = grpcclient.InferenceServerClient(b.grpc_url)
    x = grpcclient.InferInput("INPUT1", [4], "FP32")
    x.set_data_from_numpy(np.asarray([4, 3, 2, 1], dtype=np.float32))
    y = grpcclient.InferInput("INPUT0", [4], "FP32")
    y.set_data_from_numpy(np.asarray([1, 2, 3, 4], dtype=np.float32))
    assert int(g.infer("cached_add_sub", [x, y]).as_numpy("COUNT")[0]) == 1
    # A hit answers with the outputs asked for.
    only = infer(cb, "cached_add_sub", [5, 5, 5, 5], [1, 1, 1, 1], outputs=["OUTPUT1"])
    assert only.as_numpy("OUTPUT0") is None and only.as_numpy("OUTPUT1") is not None
    s = stats(b, "cached_add_sub")
    assert s["inference_stats"]["cache_hit"]["count"] == 3
    assert s["execution_count"] == 0  # B's model ran nothing
    text = metrics(b)
    assert metric(text, "nv_cache_num_hits_per_model", "cached_add_sub") == 3
    assert metric(text, "nv_cache_num_hits") == 3
    assert metric(text, "nv_cache_num_lookups") == 3
    sa = stats(a, "cached_add_sub")["inference_stats"]
    assert (sa["cache_hit"]["count"], sa["cache_miss"]["count"]) == (1, 2)
    assert sa["cache_miss"]["ns"] > 0
    assert metric(metrics(a), "nv_cache_num_entries") == 2  # the entries A stored


def test_redis_killed_mid_load_fails_no_request(tmp_path):
    redis = RedisServer(tmp_path / "r")
    k = KernelProcess([REPO], *redis.flags("socket_timeout=300", "connect_timeout=300"), *SERVE)
    try:
        k.wait_ready()
        errors: list = []
        done = {"n": 0}
        stop = threading.Event()

        def load(worker: int) -> None:
            client = httpclient.InferenceServerClient(k.url)
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    r = infer(client, "cached_add_sub", [worker, i % 7, 0, 0], [1, 1, 1, 1])
                    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), [worker + 1, i % 7 + 1, 1, 1])
                    done["n"] += 1
                except Exception as exc:  # noqa: BLE001 - what a client would see
                    errors.append(repr(exc))

        threads = [threading.Thread(target=load, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        before_kill = done["n"]
        redis.kill()
        time.sleep(3)
        stop.set()
        for t in threads:
            t.join(30)
        assert not errors, errors[:3]
        assert done["n"] > before_kill + 20  # requests kept being answered without Redis
        s = stats(k, "cached_add_sub")
        infer_stats = s["inference_stats"]
        assert infer_stats["success"]["count"] == done["n"]
        assert infer_stats["fail"]["count"] == 0
        assert infer_stats["cache_hit"]["count"] + infer_stats["cache_miss"]["count"] == done["n"]
        assert infer_stats["cache_hit"]["count"] > 0  # before the kill, repeats were hits
        assert metric(metrics(k), "nv_cache_num_misses") == infer_stats["cache_miss"]["count"]
        assert k.log().count(UNAVAILABLE) == 1, k.log()[-3000:]
        # Redis comes back: caching resumes, and the log says so once.
        redis.start()
        client = httpclient.InferenceServerClient(k.url)
        deadline = time.monotonic() + 20
        while BACK not in k.log() and time.monotonic() < deadline:
            infer(client, "cached_add_sub", [9, 9, 9, 9], [1, 1, 1, 1])
            time.sleep(0.2)
        assert BACK in k.log()
        infer(client, "cached_add_sub", [8, 8, 8, 8], [1, 1, 1, 1])
        time.sleep(0.3)  # the insert is not awaited by the request
        hits = stats(k, "cached_add_sub")["inference_stats"]["cache_hit"]["count"]
        infer(client, "cached_add_sub", [8, 8, 8, 8], [1, 1, 1, 1])
        assert stats(k, "cached_add_sub")["inference_stats"]["cache_hit"]["count"] == hits + 1
        assert k.log().count(UNAVAILABLE) == 1
    finally:
        k.stop()
        redis.kill()


def test_a_stalled_redis_does_not_hold_requests_up(tmp_path):
    redis = RedisServer(tmp_path / "r")
    k = KernelProcess([REPO], *redis.flags("socket_timeout=200"), *SERVE)
    try:
        k.wait_ready()
        client = httpclient.InferenceServerClient(k.url)
        infer(client, "cached_add_sub", [1, 1, 1, 1], [1, 1, 1, 1])
        sleeper = threading.Thread(target=redis.command, args=("DEBUG", "SLEEP", "4"))
        sleeper.start()
        time.sleep(0.3)
        took = []
        for i in range(8):
            t0 = time.monotonic()
            r = infer(client, "cached_add_sub", [1, 1, 1, 1], [1, 1, 1, i])
            took.append(time.monotonic() - t0)
            assert r.as_numpy("OUTPUT0")[3] == 1 + i
        sleeper.join()
        # Each waited at most the 200 ms socket timeout; after three the breaker skips Redis entirely.
        assert max(took) < 1.0, took
        assert sum(took) < 2.0, took
        assert k.log().count(UNAVAILABLE) == 1
    finally:
        k.stop()
        redis.kill()


def test_tls_settings_reach_a_tls_redis(tmp_path):
    certs = _make_certs(tmp_path / "certs")
    redis = RedisServer(tmp_path / "r", tls=certs)
    try:
        k = KernelProcess([REPO], *redis.flags(f"cacert={certs['ca']}"), *SERVE).wait_ready()
        try:
            client = httpclient.InferenceServerClient(k.url)
            assert count(infer(client, "cached_add_sub", [2, 2, 2, 2], [1, 1, 1, 1])) == 1
            time.sleep(0.3)
            assert count(infer(client, "cached_add_sub", [2, 2, 2, 2], [1, 1, 1, 1])) == 1  # a hit, over TLS
            assert stats(k, "cached_add_sub")["inference_stats"]["cache_hit"]["count"] == 1
        finally:
            k.stop()
        # Without the CA (plain TCP to a TLS port), Redis does not answer: the server does not start.
        out = subprocess.run([sys.executable, "-m", "kernel", "serve", "--model-repository", str(REPO),
                              *redis.flags("connect_timeout=500", "socket_timeout=500")],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and "Failed to initialize RedisCache" in out.stdout + out.stderr
    finally:
        redis.kill()


def _make_certs(d):
    d.mkdir()
    run = lambda *a: subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=kernel-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.crt", "-days", "2", "-extfile", "ext.cnf")
    return {"cert": str(d / "server.crt"), "key": str(d / "server.key"), "ca": str(d / "ca.crt")}


@pytest.mark.parametrize("settings, message", [
    (["redis,host=127.0.0.1"], "Failed to initialize RedisCache, didn't specify address. Must at a minimum specify "
                               "'host' and 'port' in the configuration"),
    (["redis,host=127.0.0.1", "redis,port=6379", "redis,pool_size=0"], "pool_size must be >= 1"),
    (["redis,host=127.0.0.1", "redis,port=six"], "port 'six' is not an integer"),
    (["redis,host=127.0.0.1", "redis,port=6379", "redis,colour=red"], "unknown setting(s) for the 'redis' cache: colour"),
])
def test_bad_redis_settings_stop_the_server(settings, message):
    flags = [f for s in settings for f in ("--cache-config", s)]
    out = subprocess.run([sys.executable, "-m", "kernel", "serve", "--model-repository", str(REPO), *flags],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert message in out.stdout + out.stderr


def test_unreachable_redis_or_wrong_password_at_start_up_stops_the_server(redis):
    for settings in (("port=1",), ()):  # nothing listens on port 1; the module's Redis wants a password
        flags = ["--cache-config", "redis,host=127.0.0.1"]
        flags += ["--cache-config", f"redis,{settings[0]}"] if settings else redis.flags()[2:]
        out = subprocess.run([sys.executable, "-m", "kernel", "serve", "--model-repository", str(REPO), *flags],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode != 0
        assert "Failed to initialize RedisCache" in out.stdout + out.stderr

"""What the response cache's key covers (issue 31, N3): two requests that differ only in something
that reaches the model never share an answer, in the local cache and in Redis, through the OpenAI
API (sampling fields handed to a model without a `sampling_parameters` input as request
parameters) and through KServe (request parameters, correlation id). cached_lm answers with what
reached it and how many requests it has run, so a wrong hit shows in the text, byte for byte;
identical requests still hit (the hit counters move, the model does not run)."""

from __future__ import annotations

import json
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import KernelProcess, free_port
from redis_server import RedisServer
from test_response_cache import REPO, SERVE, metric, metrics, stats

class Served:
    def __init__(self, kind: str, k: KernelProcess, openai_port: int):
        self.kind, self.k, self.openai_port = kind, k, openai_port

    def hits(self) -> int:
        return stats(self.k, "cached_lm")["inference_stats"]["cache_hit"]["count"]

    def settle(self) -> None:
        """Redis inserts are not awaited by the request: let them land before the next lookup."""
        if self.kind == "redis":
            time.sleep(0.3)

    def complete(self, prompt: str, **fields) -> dict:
        body = json.dumps({"model": "cached_lm", "prompt": prompt, **fields}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.openai_port}/v1/completions", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())


@pytest.fixture(scope="module", params=["local", "redis"])
def served(request, tmp_path_factory):
    redis = None
    if request.param == "redis":
        redis = RedisServer(tmp_path_factory.mktemp("redis"))
        flags = redis.flags()
    else:
        flags = ["--cache-config", "local,size=1048576"]
    port = free_port()
    k = KernelProcess([REPO], *flags, "--openai-port", str(port), *SERVE)
    try:
        yield Served(request.param, k.wait_ready(), port)
    finally:
        k.stop()
        if redis is not None:
            redis.kill()


def texts(answer: dict) -> list[str]:
    return [c["text"] for c in answer["choices"]]


@pytest.mark.parametrize("field, a, b", [("temperature", 0.2, 0.9), ("max_tokens", 5, 6), ("seed", 1, 2),
                                         ("top_p", 1, 1.0)])
def test_openai_calls_differing_in_one_sampling_field_get_their_own_answers(served, field, a, b):
    first = texts(served.complete(field, **{field: a}))[0]
    served.settle()
    hits = served.hits()
    second = texts(served.complete(field, **{field: b}))[0]
    assert second != first  # B is computed, not A's answer
    assert json.loads(second.split(" | ")[1])[field] == b and json.loads(first.split(" | ")[1])[field] == a
    assert type(json.loads(second.split(" | ")[1])[field]) is type(b)  # 1 and 1.0 are apart too
    assert served.hits() == hits
    served.settle()
    again = texts(served.complete(field, **{field: a}))[0]
    assert again.encode() == first.encode()  # an identical call is a hit, byte for byte
    assert served.hits() == hits + 1


def test_openai_n_choices_with_other_settings_are_not_copies_of_an_earlier_answer(served):
    one = texts(served.complete("n", temperature=0.5, seed=40))[0]
    served.settle()
    hits = served.hits()
    three = texts(served.complete("n", temperature=0.7, seed=40, n=3))
    assert one not in three
    assert len(set(three)) == 3  # each choice its own seed (40, 41, 42): three computed answers
    assert [json.loads(t.split(" | ")[1])["seed"] for t in three] == [40, 41, 42]
    assert served.hits() == hits
    served.settle()
    assert texts(served.complete("n", temperature=0.7, seed=40, n=3)) == three
    assert served.hits() == hits + 3


def _kserve(served, protocol: str, parameters=None, **kwargs) -> str:
    """cached_lm's answer to the prompt "kserve" over KServe HTTP or gRPC."""
    module, url = (httpclient, served.k.url) if protocol == "http" else (grpcclient, served.k.grpc_url)
    c = module.InferenceServerClient(url)
    x = module.InferInput("text_input", [1], "BYTES")
    x.set_data_from_numpy(np.array([b"kserve"], dtype=np.object_))
    try:
        return c.infer("cached_lm", [x], parameters=parameters, **kwargs).as_numpy("text_output")[0].decode()
    finally:
        c.close()


@pytest.mark.parametrize("a, b", [({"mode": "fast"}, {"mode": "slow"}), ({"k": 1}, {"k": True}),
                                  ({"k": 1}, {"k": "1"}), ({"k": 1}, {"k": 1, "extra": 0})])
def test_kserve_requests_differing_only_in_parameters_get_their_own_answers(served, a, b):
    tag = {"case": json.dumps([a, b])}
    first = _kserve(served, "http", {**a, **tag})
    served.settle()
    hits = served.hits()
    second = _kserve(served, "http", {**b, **tag})
    assert second != first and json.loads(second.split(" | ")[1]) == {**b, **tag}
    assert served.hits() == hits
    served.settle()
    # The same parameters hit, whichever protocol asks (gRPC's int64 and bool are HTTP's ints and bools).
    assert _kserve(served, "http", {**a, **tag}).encode() == first.encode()
    assert _kserve(served, "grpc", {**a, **tag}).encode() == first.encode()
    assert served.hits() == hits + 2


def test_kserve_correlation_id_is_part_of_the_key_and_the_request_id_priority_timeout_are_not(served):
    first = _kserve(served, "http", {"case": "corr"}, sequence_id=5)
    served.settle()
    hits = served.hits()
    other = _kserve(served, "http", {"case": "corr"}, sequence_id=6)
    assert " | corr 6 | " in other and other != first
    served.settle()
    same = _kserve(served, "http", {"case": "corr"}, sequence_id=5, request_id="another-id", priority=0, timeout=10**6)
    assert same.encode() == first.encode()
    assert served.hits() == hits + 1
    text = metrics(served.k)
    assert metric(text, "nv_cache_num_hits_per_model", "cached_lm") == served.hits()

"""Health answers carry the KServe v2 bodies, so KServe's own Python client works against Kernel as
tritonclient does (issue 35 item 4).

`/v2/health/live` answers `{"live": true}`, `/v2/health/ready` `{"ready": ...}` and
`/v2/models/<m>[/versions/<v>]/ready` `{"name": m, "ready": true}` (an unready model: Triton's 400
error), with tritonserver's status codes. tritonserver 2.51 sends empty bodies (a deliberate
difference, peer_checks/differences.py); `kserve` 0.21's InferenceRESTClient decodes the body and
raised JSONDecodeError on an empty one. Every client here is run against a real `kernel serve`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys

import httpx
import numpy as np
import pytest

from tests.conftest import EXAMPLES, TEST_MODELS, KernelProcess, running

ADD_SUB = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                      {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}


@pytest.fixture(scope="module")
def unready():
    """A live server that is not ready: one model fails to load and --exit-on-error=false keeps it up."""
    k = KernelProcess([EXAMPLES, TEST_MODELS / "bad"], "--exit-on-error=false", "--load-model=add_sub",
                      "--load-model=init_fails", "--model-control-mode=explicit")
    try:
        k.wait_until_ok(["/v2/health/live", "/v2/models/add_sub/ready"])
        assert k.wait_for_log("failed to load 'init_fails'", timeout=60), k.log()
        yield k
    finally:
        k.stop()


def test_bodies(server):
    with httpx.Client(base_url=f"http://{server.url}") as c:
        for path, body in [
            ("/v2/health/live", {"live": True}),
            ("/v2/health/ready", {"ready": True}),
            ("/v2/models/add_sub/ready", {"name": "add_sub", "ready": True}),
            ("/v2/models/add_sub/versions/1/ready", {"name": "add_sub", "ready": True}),
        ]:
            r = c.get(path)
            assert (r.status_code, r.headers["content-type"], r.json()) == (200, "application/json", body), path
        for path in ("/v2/models/no_such_model/ready", "/v2/models/add_sub/versions/7/ready"):
            r = c.get(path)  # as tritonserver: 400 and its words
            assert (r.status_code, r.json()) == (400, {"error": "Model version not ready"}), path
        assert c.post("/v2/health/live").status_code == 405


def test_unready_server_says_so_in_its_body(unready):
    with httpx.Client(base_url=f"http://{unready.url}") as c:
        r = c.get("/v2/health/ready")
        assert (r.status_code, r.json()) == (400, {"ready": False})
        assert c.get("/v2/health/live").json() == {"live": True}
        r = c.get("/v2/models/init_fails/ready")
        assert (r.status_code, r.json()) == (400, {"error": "Model version not ready"})


# KServe's clients, run in a process of their own: kserve registers the `inference.*` gRPC messages in
# protobuf's default pool, as tritonclient.grpc does, and the second to import them in one process fails.
KSERVE_CALLS = r"""
import asyncio, json, sys

import httpx
from kserve import InferenceGRPCClient, InferenceRESTClient, RESTConfig

ready_http, ready_grpc, unready_http, unready_grpc = sys.argv[1:]
ADD_SUB = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                      {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}


async def rest(base):
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=30))
    try:
        out = {"live": await client.is_server_live(base)}
        try:
            out["ready"] = await client.is_server_ready(base)
        except httpx.HTTPStatusError as e:  # kserve raises for a 4xx readiness
            out["ready"] = f"HTTPStatusError {e.response.status_code}"
        out["model_ready"] = await client.is_model_ready(base, "add_sub")
        out["unknown_ready"] = await client.is_model_ready(base, "no_such_model")
        answer = await client.infer(base, ADD_SUB, model_name="add_sub")
        out["outputs"] = {o.name: o.data for o in answer.outputs}
        return out
    finally:
        await client.close()


async def grpc(url):
    client = InferenceGRPCClient(url, timeout=30)
    try:
        return [await client.is_server_live(), await client.is_server_ready(), await client.is_model_ready("add_sub")]
    finally:
        await client.close()


async def main():
    return {"rest": await rest(ready_http), "rest_unready": await rest(unready_http),
            "grpc": await grpc(ready_grpc), "grpc_unready": await grpc(unready_grpc)}


print(json.dumps(asyncio.run(main())))
"""


def test_kserve_rest_and_grpc_clients(server, unready):
    if importlib.util.find_spec("kserve") is None:  # not imported here (see above)
        pytest.skip("KServe's client is not installed (pip install kserve; it is in the test extra)")
    run = subprocess.run([sys.executable, "-c", KSERVE_CALLS, f"http://{server.url}", server.grpc_url,
                          f"http://{unready.url}", unready.grpc_url], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout)
    outputs = {"OUTPUT0": [2, 3, 4, 5], "OUTPUT1": [0, 1, 2, 3]}
    assert seen["rest"] == {"live": True, "ready": True, "model_ready": True, "unknown_ready": False,
                            "outputs": outputs}
    assert seen["rest_unready"] == {"live": True, "ready": "HTTPStatusError 400", "model_ready": True,
                                    "unknown_ready": False, "outputs": outputs}
    assert seen["grpc"] == [True, True, True]
    assert seen["grpc_unready"] == [True, False, True]


def test_tritonclient_http_and_grpc_sync_and_aio(server, unready):
    """tritonclient reads only the status: unchanged answers, and several health calls over one
    connection (a body it never reads must not upset the next request)."""
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as grpcaio
    import tritonclient.http as httpclient
    import tritonclient.http.aio as httpaio

    def sync_calls(client):
        out = []
        for _ in range(3):
            out += [client.is_server_live(), client.is_server_ready(), client.is_model_ready("add_sub")]
        return out

    async def aio_calls(make):
        client = make()  # aiohttp's session wants the running loop
        try:
            out = []
            for _ in range(3):
                out += [await client.is_server_live(), await client.is_server_ready(),
                        await client.is_model_ready("add_sub")]
            return out
        finally:
            await client.close()

    for k, expected in ((server, [True, True, True] * 3), (unready, [True, False, True] * 3)):
        h = httpclient.InferenceServerClient(k.url)
        try:
            assert sync_calls(h) == expected
            inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
            inputs[0].set_data_from_numpy(np.arange(4, dtype=np.float32))
            inputs[1].set_data_from_numpy(np.ones(4, dtype=np.float32))
            assert h.infer("add_sub", inputs).as_numpy("OUTPUT0").tolist() == [1, 2, 3, 4]
            assert h.is_server_live()  # the same connection still answers after an infer
        finally:
            h.close()
        g = grpcclient.InferenceServerClient(k.grpc_url)
        try:
            assert sync_calls(g) == expected
        finally:
            g.close()
        assert asyncio.run(aio_calls(lambda: httpaio.InferenceServerClient(k.url))) == expected
        assert asyncio.run(aio_calls(lambda: grpcaio.InferenceServerClient(k.grpc_url))) == expected

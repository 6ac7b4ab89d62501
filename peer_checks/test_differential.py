"""The differential check: every request of cases.CASES, sent to real tritonserver 2.51 and to
`kernel serve` on the same model repository, the answers compared (see cases.py for what is
compared per row, normalise.py for what is taken out first, differences.py for what may differ).

Not part of `make test`: `make peer-check` installs real Triton (benchmarks/peers.py) and
runs this folder; its last line is the summary, e.g.
`differential: 155 cases, 115 same, 12 deliberate differences, 28 open differences (to fix), 0 unlisted, ...`
(peer_checks/differences.py lists the deliberate and the open ones, each with its reason).
"""

from __future__ import annotations

import base64
import json
import os
import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import CASES, Case  # noqa: E402
from conftest import free_ports  # noqa: E402
from differences import DIFFERENCES, OPEN  # noqa: E402
from normalise import error_text, normalise  # noqa: E402
import peers  # noqa: E402

RESULTS: dict[str, str] = {}  # case id -> "same" | "deliberate" | "open" | "unlisted" | "stale"
ANSWERS: dict[str, dict] = {}  # case id -> both normalised answers, written to answers.json for reading
ANSWERS_FILE: list[Path] = []


def _ports() -> peers.Ports:
    return peers.Ports(*free_ports(5))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("differential")
    paths = peers.build_repository(base)
    logs = base / "logs"
    logs.mkdir()
    triton = peers.start_triton(paths["repo"], _ports(), logs)
    try:
        kernel = peers.start_kernel(paths["repo"], _ports(), logs)
    except BaseException:
        triton.stop()
        raise
    model_py = base64.b64encode((paths["repo"] / "add_sub" / "1" / "model.py").read_bytes()).decode()
    # A POSIX shared-memory object both servers can register: INPUT0 then INPUT1 of add_sub.
    shm_key = f"/kernel_peer_check_{os.getpid()}"
    Path("/dev/shm" + shm_key).write_bytes(struct.pack("<8f", 1, 2, 3, 4, 10, 20, 30, 40))
    try:
        yield {"triton": triton, "kernel": kernel, "base": str(base), "mme": str(paths["mme"]),
               "model_py": model_py, "shm_key": shm_key}
    finally:
        kernel.stop()
        triton.stop()
        Path("/dev/shm" + shm_key).unlink(missing_ok=True)
        ANSWERS_FILE.append(base / "answers.json")
        ANSWERS_FILE[-1].write_text(json.dumps(ANSWERS, indent=1, default=repr))


def _fill(data, pair):
    """Put run-time values (the MME folder, add_sub's model.py) into a case's body."""
    if data is None:
        return None
    text = data.decode("utf-8", "surrogateescape")
    text = text.replace("{mme}", pair["mme"]).replace("{add_sub_model_py}", pair["model_py"])
    text = text.replace("{shm_key}", pair["shm_key"])
    return text.encode("utf-8", "surrogateescape")


def _send(peer: peers.Peer, case: Case, pair) -> peers.Answer:
    if case.kind == "http":
        body = _fill(case.body, pair)
        if body is not None:  # the peer's own metrics port, for a model that reads its metrics page
            body = body.replace(b"{metrics_port}", str(peer.ports.metrics).encode())
        return peers.send_http(peer, case.endpoint, case.method, case.path, body, case.headers)
    if case.kind == "grpc":
        request = json.loads(_fill(json.dumps(case.request).encode(), pair))
        return peers.send_grpc(peer, case.rpc, request, case.metadata)
    return peers.send_grpc_stream(peer, case.request, case.timeout)


def _view(answer: peers.Answer, case: Case, base: str):
    body = normalise(answer.body, base)
    if case.compare == "status":
        return {"status": answer.status}
    if case.compare == "error":
        return {"status": answer.status, "error": error_text(body) if answer.status not in (200, "OK") else None}
    return {"status": answer.status, "body": body}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_same_answer(pair, case):
    triton = _view(_send(pair["triton"], case, pair), case, pair["base"])
    kernel = _view(_send(pair["kernel"], case, pair), case, pair["base"])
    ANSWERS[case.id] = {"result": None, "triton": triton, "kernel": kernel}
    shown = (f"\n  triton: {json.dumps(triton, default=repr)[:20000]}\n"
             f"  kernel: {json.dumps(kernel, default=repr)[:20000]}")
    if triton == kernel:
        RESULTS[case.id] = "stale" if case.id in DIFFERENCES or case.id in OPEN else "same"
    elif case.id in DIFFERENCES:
        RESULTS[case.id] = "deliberate"
    elif case.id in OPEN:
        RESULTS[case.id] = "open"
        pytest.xfail(f"open difference ({OPEN[case.id]}):{shown}")
    else:
        RESULTS[case.id] = "unlisted"
        pytest.fail(f"unlisted difference in {case.id}:{shown}", pytrace=False)


def summary() -> str:
    counts = {k: sum(1 for v in RESULTS.values() if v == k) for k in ("same", "deliberate", "open", "unlisted", "stale")}
    line = (f"differential: {len(RESULTS)} cases, {counts['same']} same, {counts['deliberate']} deliberate "
            f"differences, {counts['open']} open differences (to fix), {counts['unlisted']} unlisted, "
            f"{counts['stale']} listed but now the same")
    stale = sorted(k for k, v in RESULTS.items() if v == "stale")
    for case_id, result in RESULTS.items():
        if case_id in ANSWERS:
            ANSWERS[case_id]["result"] = result
    if ANSWERS_FILE:
        ANSWERS_FILE[-1].write_text(json.dumps(ANSWERS, indent=1, default=repr))
        line += f"\n  every answer, side by side: {ANSWERS_FILE[-1]}"
    return line + (f"\n  listed but now the same: {', '.join(stale)}" if stale else "")

"""Several front processes: model control on the whole server, and faults (a front or a worker
killed, a stop) that leave the rest serving (issue 32)."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from conftest import EXAMPLES, TEST_MODELS, KernelProcess, children
from fronts_helpers import http_connection_to, wait_for_fronts
from test_front_processes import A, B, add_sub, call


def started(*extra: str) -> KernelProcess:
    return KernelProcess([EXAMPLES, TEST_MODELS / "good"], "--front-processes", "2", *extra).wait_ready()


def test_model_control_acts_on_every_front():
    k = KernelProcess([EXAMPLES], "--front-processes", "2", "--model-control-mode", "explicit").wait_ready()
    try:
        fronts = wait_for_fronts(k.proc.pid, 2)
        one, two = (http_connection_to(k.http_port, i, fronts) for i in (1, 2))
        assert call(two, "POST", "/v2/models/add_sub/infer", {"inputs": []})[0] in (400, 404)
        assert call(one, "POST", "/v2/repository/models/add_sub/load")[0] == 200
        assert add_sub(two)["OUTPUT0"] == (A + B).tolist()  # at once, through the other front
        assert call(one, "GET", "/v2/models/add_sub/ready")[0] == 200
        index_one = call(one, "POST", "/v2/repository/index")[1]
        assert index_one == call(two, "POST", "/v2/repository/index")[1]
        assert {"name": "add_sub", "version": "1", "state": "READY"} in index_one
        assert call(two, "POST", "/v2/repository/models/add_sub/unload")[0] == 200
        status, doc = call(one, "POST", "/v2/models/add_sub/infer", {"inputs": []})
        assert status in (400, 404, 503) and "add_sub" in doc["error"]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and call(one, "GET", "/v2/models/add_sub/ready")[0] == 200:
            time.sleep(0.1)
        assert call(one, "GET", "/v2/models/add_sub/ready")[0] != 200
        one.close()
        two.close()
    finally:
        k.stop()


def test_a_killed_front_is_replaced_while_the_other_keeps_serving():
    k = started()
    try:
        fronts = wait_for_fronts(k.proc.pid, 2)
        victim = next(pid for pid, i in fronts.items() if i == 1)
        survivor = http_connection_to(k.http_port, 2, fronts)
        failures, answers = [], [0]
        stop = threading.Event()

        def keep_asking() -> None:
            while not stop.is_set():
                try:
                    add_sub(survivor)
                    answers[0] += 1
                except Exception as exc:  # noqa: BLE001 - counted: the test asserts there is none
                    failures.append(exc)
                    return

        asker = threading.Thread(target=keep_asking)
        asker.start()
        time.sleep(0.3)
        os.kill(victim, signal.SIGKILL)
        replaced = wait_for_fronts(k.proc.pid, 2, timeout=30, exclude={victim})
        time.sleep(0.5)
        stop.set()
        asker.join(30)
        assert not failures, failures
        assert answers[0] > 5
        assert sorted(replaced.values()) == [1, 2] and victim not in replaced
        k.wait_ready(30)  # ready again once every front is
        fresh = http_connection_to(k.http_port, 1, replaced)
        assert add_sub(fresh)["OUTPUT1"] == (A - B).tolist()
        fresh.close()
        survivor.close()
        assert "front process 1" in k.log() and "exited with code -9" in k.log()
    finally:
        k.stop()


def test_a_killed_worker_is_restarted_for_every_front():
    k = started()
    try:
        fronts = wait_for_fronts(k.proc.pid, 2)
        conns = {i: http_connection_to(k.http_port, i, fronts) for i in (1, 2)}
        worker = next(pid for pid in children(k.proc.pid)
                      if b"add_sub/1/model.py" in open(f"/proc/{pid}/cmdline", "rb").read())
        os.kill(worker, signal.SIGKILL)
        assert k.wait_for_log("Stub process 'add_sub_0_0' restarted", timeout=30), k.log()[-3000:]
        deadline = time.monotonic() + 20
        served = set()
        while time.monotonic() < deadline and len(served) < 2:
            for i, conn in conns.items():
                status, doc = call(conn, "POST", "/v2/models/add_sub/infer", {"inputs": [
                    {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": A.tolist()},
                    {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": B.tolist()}]})
                if status == 200:
                    served.add(i)
            time.sleep(0.1)
        assert served == {1, 2}, k.log()[-3000:]
        for conn in conns.values():
            conn.close()
    finally:
        k.stop()


def test_sigterm_drains_every_front_within_the_exit_timeout():
    k = started("--exit-timeout-secs", "20")
    try:
        fronts = wait_for_fronts(k.proc.pid, 2)
        conns = {i: http_connection_to(k.http_port, i, fronts) for i in (1, 2)}
        results: dict[int, int] = {}

        def slow(i: int) -> None:
            body = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": A.tolist()},
                               {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": B.tolist()}]}
            results[i] = call(conns[i], "POST", "/v2/models/slow_add_sub/infer", body)[0]

        threads = [threading.Thread(target=slow, args=(i,)) for i in (1, 2)]
        for t in threads:
            t.start()
        time.sleep(0.5)  # both in flight (slow_add_sub takes 2 s; one instance: the second waits)
        began = time.monotonic()
        k.proc.send_signal(signal.SIGTERM)
        code = k.wait_exit(40)
        for t in threads:
            t.join(10)
        assert results == {1: 200, 2: 200}
        assert code == 0
        assert time.monotonic() - began < 20
        assert not any(os.path.exists(f"/proc/{pid}") for pid in fronts)  # every front ended with it
    finally:
        k.stop()

"""Standby workers at start-up (issue 23 D): one that cannot serve never fails an instance's start,
and one that serves shows what it runs, as every worker does.

`kernel serve` starts standby workers before it knows their models (standby.py); an instance
takes one and assigns it its model. A standby that was stopped (SIGSTOP) or killed meanwhile used
to be taken all the same: the instance then waited out its whole stub timeout and failed to load.
And a worker that started as a standby kept the standby's command line, so `ps` did not say which
model or instance it runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from conftest import KernelProcess, children
from kernel.backends.python import standby
from kernel.backends.python.backend import PythonBackend
from kernel.backends.python.instance import WorkerInstance, WorkerSettings
from kernel.core.backend import ModelSource
from kernel.core.request import InferRequest, InferTensor

IDENTITY = Path(__file__).resolve().parents[1] / "models" / "handover" / "identity"
STUB_TIMEOUT_S = 15.0
SIGNALS = pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["stopped", "killed"])


def instance(repo: Path, name: str) -> WorkerInstance:
    model_dir = repo / name
    if not model_dir.exists():
        shutil.copytree(IDENTITY, model_dir)
    config = {"name": name, "backend": "python", "max_batch_size": 0,
              "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": ["-1"]}]}
    source = ModelSource(name, 1, model_dir, model_dir / "1", repo, SimpleNamespace(default_model_filename="", parameters={}),
                         json.dumps(config))
    return WorkerInstance(source, f"{name}_0_0", "KIND_CPU", 0, WorkerSettings(stub_timeout_seconds=STUB_TIMEOUT_S))


def standbys() -> list[int]:
    """This process's standby worker children."""
    return [pid for pid in children(os.getpid()) if b"kernel.backends.python.standby" in cmdline(pid)]


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


async def answers(inst: WorkerInstance) -> None:
    got = asyncio.get_running_loop().create_future()
    data = np.arange(4, dtype=np.float32)
    request = InferRequest(inst.source.name, "", "r", [InferTensor("IN", "FP32", [4], raw=data.tobytes())])
    request.on_response = got.set_result
    inst.submit([request])
    response = await asyncio.wait_for(got, 30)
    assert response.error is None, response.error
    np.testing.assert_array_equal(response.outputs[0].as_numpy(), data)


@pytest.fixture(autouse=True)
def standbys_on(monkeypatch):
    monkeypatch.setattr(standby, "ENABLED", True)
    yield
    standby.release()


@SIGNALS
def test_a_standby_that_cannot_serve_is_replaced_by_a_fresh_worker(tmp_path, sig):
    async def main():
        await standby.prestart(1)
        pid, = standbys()
        os.kill(pid, sig)
        inst = instance(tmp_path, "identity")
        started = time.monotonic()
        await inst.start()
        try:
            assert time.monotonic() - started < STUB_TIMEOUT_S / 2  # no stub timeout waited out
            assert inst.process.pid != pid
            await answers(inst)
        finally:
            await inst.stop(5)
        deadline = time.monotonic() + 10  # the stopped one is not left behind either
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not Path(f"/proc/{pid}").exists()

    asyncio.run(main())


def test_a_worker_that_started_as_a_standby_names_its_instance_and_model(tmp_path):
    async def main():
        await standby.prestart(2)  # one started, one forked from it
        names = ("first", "second")
        instances = [instance(tmp_path, n) for n in names]
        await asyncio.gather(*(inst.start() for inst in instances))
        try:
            for inst in instances:
                await answers(inst)
                words = cmdline(inst.process.pid).rstrip(b"\0").split(b"\0")
                assert b"kernel.backends.python.worker" in words, words
                assert words[words.index(b"--instance-name") + 1] == inst.name.encode(), words
                assert words[words.index(b"--model-file") + 1] == str(inst.model_file).encode(), words
                assert b"kernel.backends.python.standby" in b" ".join(words)  # how it started, still said
        finally:
            await asyncio.gather(*(inst.stop(5) for inst in instances))

    asyncio.run(main())


@SIGNALS
def test_a_standby_signalled_right_after_it_was_taken_is_replaced_at_once(tmp_path, sig, monkeypatch):
    """Issue 31, D13: the signal lands after the instance took the standby, before it reported in.
    Killed, its exit started the backend's restart of the instance, which reset the instance under
    its own start ('NoneType' object has no attribute 'pid': the load failed); stopped, the start
    waited out the whole report time. Now the start replaces it with a fresh worker at once."""
    assign = standby.Standby.assign

    def assign_then_signal(self, worker_args):
        assign(self, worker_args)
        os.kill(self.process.pid, sig)

    monkeypatch.setattr(standby.Standby, "assign", assign_then_signal)

    async def main():
        await standby.prestart(1)
        pid, = standbys()
        inst = instance(tmp_path, "identity")
        inst.on_unexpected_exit = PythonBackend()._restart  # the restart policy `kernel serve` sets
        started = time.monotonic()
        await inst.start()
        try:
            assert time.monotonic() - started < 4, "the report time (5 s) was waited out"
            assert inst.process.pid != pid
            await answers(inst)
        finally:
            await inst.stop(5)

    asyncio.run(main())


@SIGNALS
def test_kernel_serve_starts_when_a_standby_is_signalled_as_it_is_taken(tmp_path, sig):
    """The same against a real `kernel serve`: the first standby is signalled as soon as it names
    the instance it was given (it rewrites its command line on assignment, before it reports in);
    the server still starts, without waiting out the report time, and serves every model."""
    names = [f"m{i}" for i in range(3)]
    for name in names:
        shutil.copytree(IDENTITY, tmp_path / name)
    k = KernelProcess([tmp_path])
    victim = None
    try:
        deadline = time.monotonic() + 30
        while victim is None and time.monotonic() < deadline and k.proc.poll() is None:
            for pid in children(k.proc.pid):
                words = cmdline(pid)
                if b"kernel.backends.python.standby" in words and b"--instance-name" in words:
                    os.kill(pid, sig)
                    victim = pid
                    break
            time.sleep(0.001)
        assert victim is not None, "no standby was taken"
        signalled = time.monotonic()
        k.wait_ready(30)
        assert time.monotonic() - signalled < 4, "the report time (5 s) was waited out"
        data = [1.0, 2.0]
        with httpx.Client(base_url=f"http://{k.url}", timeout=30) as client:
            for name in names:
                r = client.post(f"/v2/models/{name}/infer",
                                json={"inputs": [{"name": "IN", "shape": [2], "datatype": "FP32", "data": data}]})
                assert r.status_code == 200, r.text
                assert r.json()["outputs"][0]["data"] == data
        assert "AttributeError" not in k.log()
    finally:
        assert k.stop() == 0, k.log()[-3000:]
    deadline = time.monotonic() + 10  # the signalled standby is not left behind
    while Path(f"/proc/{victim}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{victim}").exists()

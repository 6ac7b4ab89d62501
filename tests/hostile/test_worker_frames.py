"""A frame the worker cannot decode fails the requests it carries, never the worker (issue 14 item 2).

The front checks every value before it reaches a worker, so this is the second line: the worker is
driven directly over its socket, as the front drives it, with an Execute whose request holds a
value its message types refuse (a float correlation id).
"""

from __future__ import annotations

import json
import socket
import subprocess

import msgspec
import numpy as np

from conftest import ROOT
from kernel.backends.python import messages
from kernel.backends.python.execenv import server_command

MODEL_DIR = ROOT / "benchmarks" / "model_repo" / "add_sub"


class Worker:
    def __init__(self):
        self.front, worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.fds, fd_worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        argv, env = server_command().module(
            "kernel.backends.python.worker", "--channel-fd", str(worker.fileno()),
            "--fd-channel-fd", str(fd_worker.fileno()), "--model-file", str(MODEL_DIR / "1" / "model.py"),
            "--instance-name", "add_sub_0_0",
        )
        self.proc = subprocess.Popen(argv, pass_fds=(worker.fileno(), fd_worker.fileno()), cwd=str(ROOT), env=env)
        worker.close()
        fd_worker.close()
        self.front.settimeout(30)
        self.buffer = bytearray()
        self.decoder = msgspec.msgpack.Decoder(messages.ToFront)

    def send_raw(self, payload: bytes) -> None:
        self.front.sendall(len(payload).to_bytes(4, "little") + payload)

    def send(self, message) -> None:
        self.send_raw(msgspec.msgpack.encode(message))

    def recv(self):
        while True:
            if len(self.buffer) >= 4:
                n = int.from_bytes(self.buffer[:4], "little")
                if len(self.buffer) >= 4 + n:
                    message = self.decoder.decode(bytes(self.buffer[4 : 4 + n]))
                    del self.buffer[: 4 + n]
                    return message
            chunk = self.front.recv(1 << 20)
            assert chunk, f"the worker closed its socket (exit code {self.proc.poll()})"
            self.buffer += chunk

    def recv_responses(self) -> messages.Responses:
        while True:
            message = self.recv()
            if isinstance(message, messages.Responses):
                return message

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.front.close()
        self.fds.close()


def test_undecodable_execute_fails_its_request_and_the_worker_keeps_serving():
    w = Worker()
    try:
        config = {"name": "add_sub", "max_batch_size": 0,
                  "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": ["4"]},
                             {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": ["4"]}]}
        w.send(messages.Initialize({
            "model_config": json.dumps(config), "model_name": "add_sub", "model_version": "1",
            "model_repository": str(MODEL_DIR), "model_instance_name": "add_sub_0_0",
            "model_instance_kind": "CPU", "model_instance_device_id": "0",
        }))
        ready = w.recv()
        while not isinstance(ready, messages.Ready):
            ready = w.recv()
        assert ready.error is None, ready

        data = np.arange(4, dtype=np.float32).tobytes()
        tensor = ["INPUT0", "FP32", [4], data]
        # An Execute as the front encodes it, but with correlation_id 1.5 (uint64 or string only).
        bad = msgspec.msgpack.encode(["exec", [[41, "r", [tensor, ["INPUT1", "FP32", [4], data]], [], 1.5]], 0])
        w.send_raw(bad)
        answer = w.recv_responses()
        assert [r.key for r in answer.responses] == [41]
        assert answer.responses[0].error is not None
        assert answer.responses[0].error.code == "INVALID_ARG"
        assert "could not read this request" in answer.responses[0].error.message
        assert len(answer.executions) == 1 and answer.executions[0].batch_size == 0

        good = messages.Request(42, "", [messages.Tensor("INPUT0", "FP32", [4], data),
                                         messages.Tensor("INPUT1", "FP32", [4], data)])
        w.send(messages.Execute([good]))
        answer = w.recv_responses()
        assert answer.responses[0].key == 42 and answer.responses[0].error is None
        assert w.proc.poll() is None
    finally:
        w.close()

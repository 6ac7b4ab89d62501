"""One worker process's share of a request: Execute -> Responses round trips, one at a time.

Drives `python -m kernel.backends.python.worker` for benchmarks/model_repo/add_sub directly over
its socket (no front process, no HTTP/gRPC), so the figure is the worker side alone and
moves little with the load of the box. Usage: python benchmarks/worker_roundtrip.py [N]
"""
import json, os, socket, statistics, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import msgspec, numpy as np  # noqa: E401,E402
from kernel.backends.python import messages  # noqa: E402
REPO = str(ROOT / "benchmarks" / "model_repo")
front, worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
fdf, fdw = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
p = subprocess.Popen([sys.executable, "-m", "kernel.backends.python.worker", "--channel-fd", str(worker.fileno()),
    "--fd-channel-fd", str(fdw.fileno()), "--model-file", f"{REPO}/add_sub/1/model.py", "--instance-name", "add_sub_0_0"],
    pass_fds=(worker.fileno(), fdw.fileno()), cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)))
worker.close(); fdw.close()
enc = msgspec.msgpack.Encoder(); dec = msgspec.msgpack.Decoder(messages.ToFront)
def send(m):
    b = enc.encode(m); front.sendall(len(b).to_bytes(4, "little") + b)
buf = bytearray()
def recv():
    global buf
    while True:
        if len(buf) >= 4:
            n = int.from_bytes(buf[:4], "little")
            if len(buf) >= 4 + n:
                m = dec.decode(bytes(buf[4:4 + n])); del buf[:4 + n]; return m
        buf += front.recv(1 << 20)
cfg = {"name": "add_sub", "max_batch_size": 0, "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": ["4"]}, {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": ["4"]}]}
send(messages.Initialize({"model_config": json.dumps(cfg), "model_name": "add_sub", "model_version": "1", "model_repository": f"{REPO}/add_sub", "model_instance_name": "add_sub_0_0"}))
r = recv()
while not isinstance(r, messages.Ready):  # the worker may announce itself (Started) before Ready
    r = recv()
assert r.error is None, r
a = np.arange(4, dtype=np.float32).tobytes()
times = []
N = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
for i in range(N):
    req = messages.Request(i + 1, "", [messages.Tensor("INPUT0", "FP32", [4], a), messages.Tensor("INPUT1", "FP32", [4], a)], [], 0, 0, "{}", 0)
    t = time.perf_counter_ns(); send(messages.Execute([req])); r = recv()
    times.append(time.perf_counter_ns() - t)
    assert isinstance(r, messages.Responses) and r.responses[0].error is None, r
times = times[N // 10:]
print(f"worker round trip: median {statistics.median(times)/1000:.1f} us, "
      f"p10 {np.percentile(times, 10)/1000:.1f}, p90 {np.percentile(times, 90)/1000:.1f} ({len(times)} requests)")
p.kill()

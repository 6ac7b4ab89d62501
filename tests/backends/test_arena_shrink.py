"""Shared memory grown for a burst of large tensors is given back once idle (issue 23 C).

Each side of a worker allocates large tensors in its own arena of memfd segments and the other
side maps them. Before, a segment once grown stayed mapped in both processes for their lifetime:
one burst of big requests (or one slow client holding many big responses) pinned that memory for
good. Now a grown segment wholly free for shm-idle-release-seconds is closed by its owner, and the
peer unmaps it when told (SegmentRemoved); the first segment of each arena stays.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import KernelProcess, running
from kernel.backends.python.arena import Arena, PeerArena, Segment

MODELS = Path(__file__).resolve().parents[1] / "models" / "handover"
MIB = 1 << 20


def test_an_idle_grown_segment_is_closed_and_its_index_never_reused():
    arena, peer = Arena(MIB, MIB), PeerArena()
    arena.on_new_segment = lambda index, seg: peer.add(index, os.dup(seg.fd), seg.size)
    idle = []
    arena.on_idle = lambda: idle.append(True)
    try:
        regions = [arena.alloc(MIB) for _ in range(3)]  # three segments: the first, two grown
        assert sorted(arena.segments) == [0, 1, 2]
        for region in regions:
            arena.free(*region)
        assert len(idle) == 2  # each grown segment reported once as it fell free; never the first
        assert arena.trim(60.0) == ([], pytest.approx(60.0, abs=1.0))  # not idle long enough yet
        removed, due = arena.trim(0.0)
        assert sorted(removed) == [1, 2] and due == 0.0 and sorted(arena.segments) == [0]
        for index in removed:
            peer.remove(index)
        assert sorted(peer.segments) == [0]
        arena.alloc(MIB)  # segment 0 again
        assert arena.alloc(MIB)[0] == 3  # a new segment, under a new index
        busy = arena.alloc(MIB // 2)
        assert arena.trim(0.0) == ([], 0.0)  # segments in use are never closed
        assert busy[0] in arena.segments
    finally:
        arena.close()
        peer.close()


def test_a_first_tensor_larger_than_the_default_segment_goes_in_a_segment_given_back():
    """The first segment is kept for good: it is the default size even when the first tensor is
    larger (before, a first request of 1 GiB made a first segment of 1 GiB, held until the end)."""
    arena = Arena(MIB, MIB)
    try:
        big = arena.alloc(3 * MIB)
        assert big[0] == 1 and arena.segments[0].size == MIB and arena.segments[1].size == 3 * MIB
        arena.free(*big)
        assert arena.trim(0.0)[0] == [1] and sorted(arena.segments) == [0]
        assert arena.alloc(MIB) == (0, 0)  # the first segment serves what fits in it
    finally:
        arena.close()


def test_segments_are_unmapped_on_a_thread_of_their_own(monkeypatch):
    """Giving back a large segment costs the kernel time (~0.2 s for 1 GiB here: the munmap and the
    last close of its memfd); trim, close and a peer's remove leave it to another thread, so the
    loop that calls them goes on serving."""
    closed_on = []
    plain_close = Segment.close

    ours = set()  # this test's segments (a closed arena of an earlier test may still be closing)

    def close(seg):
        if id(seg) in ours:
            closed_on.append(threading.current_thread())
        plain_close(seg)

    monkeypatch.setattr(Segment, "close", close)
    name = f"kernel-test-close-{os.getpid()}"
    arena, peer = Arena(MIB, MIB, name), PeerArena()
    arena.on_new_segment = lambda index, seg: peer.add(index, os.dup(seg.fd), seg.size)
    grown = arena.alloc(2 * MIB)
    ours.update(id(seg) for seg in [*arena.segments.values(), *peer.segments.values()])
    arena.free(*grown)
    removed, _ = arena.trim(0.0)
    peer.remove(removed[0])
    for closing in (arena, peer):
        closing.close()
    deadline = time.monotonic() + 10
    while memfd_maps(os.getpid(), name) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert memfd_maps(os.getpid(), name) == 0  # all four mappings are gone
    assert len(closed_on) == 4 and threading.current_thread() not in closed_on, closed_on


def memfd_maps(pid: int, name: str) -> int:
    """How many distinct memfd files called `name` process `pid` maps."""
    inodes = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(f"/memfd:{name} "):
                inodes.add(fields[4])
    return len(inodes)


def memfd_bytes(pid: int, name: str) -> int:
    """How many bytes of memfd files called `name` process `pid` maps."""
    total = 0
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(f"/memfd:{name} "):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                total += end - start
    return total


def worker_of(front: int, instance: str) -> int:
    """The pid of the front's worker child running `instance`."""
    for pid in Path(f"/proc/{front}/task/{front}/children").read_text().split():
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"--instance-name" in words and words[words.index(b"--instance-name") + 1] == instance.encode():
            return int(pid)
    raise AssertionError(f"no worker for {instance}")


@pytest.fixture(scope="module")
def server():
    yield from running(KernelProcess(
        [MODELS], "--model-control-mode", "explicit", "--load-model", "scale", "--load-model", "refill_stream",
        "--backend-config", "python,shm-default-byte-size=1048576",
        "--backend-config", "python,shm-growth-byte-size=1048576",
        "--backend-config", "python,shm-idle-release-seconds=0.5",
        env={"KERNEL_STANDBY_WORKERS": "0"},
    ))


def segments(front: int, worker: int) -> dict[str, int]:
    """Segments of the instance's two arenas (`kernel-scale_0_0`: the front's, `-out`: the worker's),
    as mapped in each process."""
    return {f"{who}:{name}": memfd_maps(pid, name) for who, pid in (("front", front), ("worker", worker))
            for name in ("kernel-scale_0_0", "kernel-scale_0_0-out")}


def test_shared_memory_goes_back_down_in_both_processes_after_a_burst(server):
    front = server.proc.pid
    worker = worker_of(front, "scale_0_0")
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    data = np.ones(MIB, np.float32)  # 4 MiB: a segment of its own in each arena
    inputs = httpclient.InferInput("IN", [MIB], "FP32")
    inputs.set_data_from_numpy(data)
    assert np.all(client.infer("scale", [inputs]).as_numpy("OUT") == 2)
    # The model's first request, larger than the first segment (1 MiB here): it went in a grown
    # segment of each arena, given back once idle, and the first segments stay at 1 MiB.
    held = {}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        held = {f"{who}:{name}": memfd_bytes(pid, name) for who, pid in (("front", front), ("worker", worker))
                for name in ("kernel-scale_0_0", "kernel-scale_0_0-out")}
        if set(held.values()) == {MIB}:
            break
        time.sleep(0.2)
    assert set(held.values()) == {MIB}, held
    baseline = segments(front, worker)
    assert set(baseline.values()) == {1}, baseline  # each arena's first segment, mapped on both sides

    peak = {}
    errors = []

    def burst() -> None:
        c = httpclient.InferenceServerClient(server.url, network_timeout=60)
        try:
            for _ in range(4):
                if not np.all(c.infer("scale", [inputs]).as_numpy("OUT") == 2):
                    errors.append("wrong answer")
                for key, value in segments(front, worker).items():
                    peak[key] = max(peak.get(key, 0), value)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=burst) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert all(peak[k] > 1 for k in peak), peak  # the burst grew both arenas, seen from both processes

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and segments(front, worker) != baseline:
        time.sleep(0.2)
    assert segments(front, worker) == baseline, (segments(front, worker), peak)
    # And the arenas still grow and serve after giving segments back.
    assert np.all(client.infer("scale", [inputs]).as_numpy("OUT") == 2)
    client.close()


def test_the_idle_release_setting_is_read_and_an_unknown_setting_is_only_a_warning(caplog):
    from kernel.backends.python.backend import settings_from_backend_config
    from kernel.backends.python.messages import LogSettings

    settings = settings_from_backend_config({"shm-idle-release-seconds": "0.5", "made-up-setting": "1"},
                                            LogSettings())
    assert settings.shm_idle_release_seconds == 0.5
    assert "unknown setting 'made-up-setting' ignored" in caplog.text


def test_segments_a_model_thread_grows_reach_the_front_before_the_responses_in_them(server):
    """Responses packed on a model thread after execute returned (16 MiB each, arenas of 1 MiB
    segments): every one needs a segment that thread grew, announced before the response."""
    import queue

    import tritonclient.grpc as grpcclient

    got: queue.SimpleQueue = queue.SimpleQueue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        n = 4 * MIB
        for round_ in range(2):
            inputs = []
            for name, value, datatype in (("N", np.array([n], np.int32), "INT32"),
                                          ("BASE", np.array([10.0 * round_], np.float32), "FP32"),
                                          ("FROM_THREAD", np.array([1], np.int32), "INT32")):
                tensor = grpcclient.InferInput(name, [1], datatype)
                tensor.set_data_from_numpy(value)
                inputs.append(tensor)
            client.async_stream_infer("refill_stream", inputs)
            for i in range(4):
                result, error = got.get(timeout=60)
                assert error is None, error
                out = result.as_numpy("OUT")
                assert out.shape == (n,) and np.all(out == 10.0 * round_ + i)
    finally:
        client.stop_stream()
        client.close()

"""Unit tests for the worker IPC: message framing and the shared-memory arena."""

from __future__ import annotations

import asyncio
import os
import socket

import msgspec
import numpy as np
import pytest

from kernel.backends.python import messages, wire
from kernel.backends.python.arena import Arena, PeerArena
from kernel.backends.python.framing import MessageChannel


def test_framing_reassembles_split_and_coalesced_frames():
    received = []
    ch = MessageChannel(messages.ToWorker, received.append, lambda exc: None)
    enc = msgspec.msgpack.Encoder()
    frames = b""
    sent = [
        messages.Execute([messages.Request(1, "a", [messages.Tensor("X", "FP32", [2], b"\0" * 8)])]),
        messages.Cancel(1),
        messages.Release([(0, 64)]),
    ]
    for m in sent:
        payload = enc.encode(m)
        frames += len(payload).to_bytes(4, "little") + payload
    # one byte at a time, then everything at once
    for i in range(len(frames)):
        ch.data_received(frames[i : i + 1])
    ch.data_received(frames)
    assert received == sent + sent


def test_channel_over_a_real_socketpair():
    async def main():
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        got = asyncio.Queue()
        _, left = await loop.create_unix_connection(lambda: MessageChannel(messages.ToFront, None, lambda e: None), sock=a)
        _, right = await loop.create_unix_connection(
            lambda: MessageChannel(messages.ToFront, got.put_nowait, lambda e: None), sock=b
        )
        big = os.urandom(200_000)
        left.send(messages.Responses([messages.Response(7, [messages.Tensor("Y", "UINT8", [len(big)], big)])]))
        msg = await asyncio.wait_for(got.get(), 5)
        assert msg.responses[0].key == 7
        assert msg.responses[0].outputs[0].data == big

    asyncio.run(main())


def test_arena_alloc_free_coalesces_and_reuses():
    arena = Arena(1 << 20, 1 << 20)
    try:
        a = arena.alloc(1000)
        b = arena.alloc(1000)
        c = arena.alloc(1000)
        assert a[0] == b[0] == c[0] == 0
        assert len({a[1], b[1], c[1]}) == 3
        arena.free(*b)
        arena.free(*a)
        arena.free(*c)
        assert arena.allocated == 0
        # after coalescing, the whole segment is one block again
        big = arena.alloc((1 << 20) - 64)
        assert big == (0, 0)
    finally:
        arena.close()


def test_arena_grows_when_a_tensor_does_not_fit():
    announced = []
    arena = Arena(1 << 16, 1 << 16)
    arena.on_new_segment = lambda index, seg: announced.append((index, seg.size))
    try:
        arena.alloc(1000)
        assert announced == [(0, 1 << 16)]
        arena.alloc(200_000)  # larger than the growth step: rounded up to whole steps
        assert announced[1][0] == 1 and announced[1][1] >= 200_000
        assert announced[1][1] % (1 << 16) == 0
    finally:
        arena.close()


def test_peer_maps_the_same_memory_and_checks_bounds():
    arena = Arena(1 << 16, 1 << 16)
    peer = PeerArena()
    arena.on_new_segment = lambda index, seg: peer.add(index, os.dup(seg.fd), seg.size)
    try:
        data = np.arange(100_000, dtype=np.float32)
        t = wire.pack("X", "FP32", data.shape, memoryview(data).cast("B"), arena)
        assert t.data is None  # above the inline limit: it went through the arena
        view = wire.view(t, peer)
        np.testing.assert_array_equal(np.frombuffer(view, np.float32), data)
        with pytest.raises(ValueError):
            peer.view(t.segment, t.offset, 1 << 30)
        with pytest.raises(ValueError):
            peer.view(99, 0, 1)
        small = wire.pack("S", "FP32", [2], b"\0" * 8, arena)
        assert small.data == b"\0" * 8
    finally:
        peer.close()
        arena.close()

"""A large request's response-cache key is hashed, and a large response copied into its entry,
beside the loop; requests still reach the model in order, and an entry never changes once stored.

Before, the local cache copied and hashed a request's input bytes on the front's event loop to make
its key (and compared them on a hit), and copied a response's outputs into its entry there: one
256 MiB request held every client of the front for 0.4-0.6 s. These tests use the real
ResponseCache and Admission, with the model and the client replaced by lists of what reached them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from kernel.core.cache import COPY_BESIDE_BYTES, ResponseCache
from kernel.core.cache_key import KEY_BYTES_INLINE, local_key, local_key_bytes
from kernel.core.admission import KEY_BESIDE_BYTES, Admission
from kernel.core.request import InferRequest, InferResponse, InferTensor
from kernel.core.stats import ModelStats

MIB = 1 << 20
LARGE = 3 * MIB
assert KEY_BESIDE_BYTES < LARGE and COPY_BESIDE_BYTES < LARGE and KEY_BYTES_INLINE < LARGE


@dataclass(eq=False)
class Model:
    """As much of kernel.core.model.Model as the cache and Admission read."""

    name: str
    response_cache: object = None
    bytes_inputs: bool = False
    version: int = 1
    version_str: str = "1"
    instances: tuple = ()
    stats: ModelStats = field(default=None)

    def __post_init__(self):
        self.stats = ModelStats(self.name, self.version_str)


async def until(done, timeout: float = 10.0) -> None:
    """Let the loop run until done() (what a thread beside it finishes is handed over on it)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not done():
        assert asyncio.get_running_loop().time() < deadline, "still waiting"
        await asyncio.sleep(0.005)


def request(id: str, data: bytes, parameters=None) -> InferRequest:
    r = InferRequest("m", id=id, parameters=parameters)
    r.inputs = [InferTensor("INPUT0", "UINT8", (len(data),), raw=memoryview(data))]
    return r


def test_large_inputs_are_keyed_by_their_digest_and_small_ones_by_their_bytes():
    model = Model("m")
    data = np.random.default_rng(0).integers(0, 256, LARGE, np.uint8).tobytes()
    changed = bytearray(data)
    changed[LARGE // 2] ^= 1
    key = local_key(model, request("a", data))
    assert key == local_key(model, request("b", data))  # the request id is not in it
    assert key != local_key(model, request("c", bytes(changed)))  # one bit differs
    assert key != local_key(model, request("d", data, {"p": 1}))
    assert local_key_bytes(key) < 100  # the entry does not keep a second copy of the input
    small = local_key(model, request("e", data[:KEY_BYTES_INLINE]))
    assert small[1][0][3] == data[:KEY_BYTES_INLINE]  # small inputs: the bytes themselves
    assert local_key_bytes(small) >= KEY_BYTES_INLINE


async def test_a_large_request_is_hashed_beside_the_loop_and_the_next_waits_behind_it():
    cache = ResponseCache(64 * MIB)
    m, other = Model("m", cache), Model("other", cache)
    admitted = []
    reads = Admission(lambda model, r, validated: admitted.append((model.name, r.id, r.cache_key)))
    large = request("large", bytes(LARGE))
    small = request("after", b"\1" * 16)
    assert reads.take(m, large) is True
    assert reads.take(m, small) is True  # behind the large one, though its key is quick
    assert reads.take(other, request("elsewhere", b"\2" * 16)) is False  # another model: not held
    assert reads.take(Model("plain"), request("big, no cache", bytes(LARGE))) is False
    await until(lambda: not reads.count)
    assert [(name, id) for name, id, _ in admitted] == [("m", "large"), ("m", "after")]
    assert admitted[0][2] == local_key(m, large)  # computed on the thread, as the loop would have
    assert admitted[1][2] is None  # a small request's key is made on the loop, at lookup


def missed(cache: ResponseCache, model: Model, id: str) -> tuple[InferRequest, list]:
    """A small request the cache does not have (the model is to run it), and the list its client gets."""
    r, delivered = request(id, b"\1" * 16), []
    r.on_response = delivered.append
    assert cache.serve(model, r) is False
    return r, delivered


async def test_a_large_response_is_copied_beside_the_loop_and_the_entry_is_its_own():
    cache = ResponseCache(64 * MIB)
    model = Model("m", cache)
    first, delivered = missed(cache, model, "first")
    output = np.arange(LARGE, dtype=np.uint8)  # the model's buffer (a worker arena's, say)
    first.on_response(InferResponse("m", "1", "first", [InferTensor("OUTPUT0", "UINT8", (LARGE,),
                                                                    raw=memoryview(output))]))
    assert delivered == [] and cache.pending == 1  # held while its copy is made
    await until(lambda: delivered)
    assert cache.pending == 0 and cache.entries == 1
    expected = output.copy()
    output[:] = 7  # the buffer is reused once the response is sent
    hits = []
    again = request("again", b"\1" * 16)
    again.on_response = hits.append
    assert cache.serve(model, again) is True
    stored = hits[0].outputs[0].raw
    assert np.array_equal(np.frombuffer(stored, np.uint8), expected)
    assert memoryview(stored).readonly  # nobody answered from it can change it for the next
    assert model.stats.cache_hit_count == 1 and model.stats.cache_miss_count == 1


async def test_a_response_larger_than_the_cache_is_sent_at_once_and_not_copied():
    cache = ResponseCache(2 * MIB)
    model = Model("m", cache)
    r, delivered = missed(cache, model, "r")
    r.on_response(InferResponse("m", "1", "r", [InferTensor("OUTPUT0", "UINT8", (LARGE,), raw=bytes(LARGE))]))
    assert len(delivered) == 1 and cache.pending == 0 and cache.entries == 0

"""A request whose BYTES input comes as late bytes (gRPC `bytes_contents` cut out of the message,
made beside the loop: transports/grpc/typed_contents.py) is also validated beside the loop when its
elements could be many. The client's size for them counts 2 bytes per element at least (a protobuf
tag and a length byte), not the 4 of the wire form: counted at 4, ~32,768 empty elements were
walked on the loop (~5 ms), twice the bound."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

from kernel.core.admission import BYTES_ELEMENTS_ON_LOOP, Admission
from kernel.core.request import InferRequest, InferTensor, LateBytes


class EmptyElements(LateBytes):
    """`n` empty elements, sent as protobuf `bytes_contents` would be: 2 bytes each."""

    __slots__ = ("n",)

    def __init__(self, n: int):
        super().__init__(2 * n)
        self.n = n

    def read(self) -> bytes:
        return struct.pack("<I", 0) * self.n


@dataclass(eq=False)
class Model:
    """As much of kernel.core.model.Model as Admission reads."""
    name: str = "m"
    response_cache: object = None
    bytes_inputs: bool = True
    instances: tuple = ()

    def validate_tagged(self, request) -> None:
        pass


def late_request(n: int) -> InferRequest:
    r = InferRequest("m", id=str(n))
    r.inputs = [InferTensor("IN", "BYTES", (n,), raw=EmptyElements(n))]
    r.late_inputs = True
    return r


async def test_late_bytes_that_may_hold_many_elements_are_validated_beside_the_loop():
    admitted = []
    admission = Admission(lambda model, r, validated: admitted.append((r.id, validated)))
    few, many = BYTES_ELEMENTS_ON_LOOP // 2, BYTES_ELEMENTS_ON_LOOP + BYTES_ELEMENTS_ON_LOOP // 2
    assert admission.take(Model(), late_request(few)) is True  # late bytes are always made beside
    assert admission.take(Model(), late_request(many)) is True
    for _ in range(400):
        if not admission.count:
            break
        await asyncio.sleep(0.005)
    assert sorted(admitted) == sorted([(str(few), False), (str(many), True)]), \
        "late bytes that may hold more elements than the loop's bound were left to validate on the loop"

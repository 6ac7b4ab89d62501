"""What identifies a request's response in the response caches: the local cache's key (a tuple in
this process) and the Redis cache's (the same fields, hashed, the same in every process).

The key covers everything of a request that reaches the model and can change its answer:

- every input's name, datatype, shape and bytes (inputs in name order: their order in the request
  does not matter; in the local key, an input over KEY_BYTES_INLINE as its SHA-256 digest);
- the request parameters (`request.parameters()` in a Python model, `parameters` of a bound
  callable's request): what KServe clients send as parameters, the headers
  --http/grpc-header-forward-pattern forwards, and the OpenAI API's sampling fields (temperature,
  max_tokens, seed, ...) for a model without a `sampling_parameters` input;
- the correlation id and the sequence flags (`request.correlation_id()`, `request.flags()`), which
  a model without a sequence batcher may read as data (sequence models cannot enable the cache).

Not in it: the request id (a label of the call: every OpenAI call has a new one, so it would make
every call a miss), priority and timeout (they decide when the model runs, not what it answers,
and do not reach a Python model), and the requested outputs, which choose among the outputs an
entry stored (kernel.core.cache_entry) instead, with classification applied to a hit's outputs as
to a computed response's.

tritonserver 2.51 keys on the model and its inputs only (its documented key; measured: requests
differing only in their parameters hit), so a model that reads its parameters got another
request's answer; Kernel differs here on purpose (issue 31, N3).

Parameters are written in one canonical form, JSON with sorted keys, so that values that compare
equal in Python but differ for the model stay apart (1, 1.0 and true; "1" and 1). A request with
no parameters, correlation id or flags (the common case) costs one test.
"""

from __future__ import annotations

import hashlib
import struct

import msgspec

REDIS_KEY_PREFIX = b"kernel:response-cache:v2:"

# The local key holds an input's bytes up to this size, and a SHA-256 digest of larger ones: the
# digest of 64 KiB costs ~40 us, and an entry of a large request no longer keeps a second copy of
# its input. What a digest part costs in the cache's byte accounting:
KEY_BYTES_INLINE = 64 << 10
DIGEST_PART_BYTES = 48

_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_canonical = msgspec.json.Encoder(order="sorted", enc_hook=repr).encode


def request_extras(request) -> bytes:
    """The parts of the key beyond the inputs, as bytes: b"" for a request with none of them."""
    params, cid, flags = request.parameters, request.correlation_id, request.flags
    if not params and not cid and not flags:
        return b""
    return _canonical([params or {}, cid, flags])


def _input_part(t) -> tuple:
    """An input as the local key holds it: its bytes up to KEY_BYTES_INLINE, beyond that a
    ("sha256", size, digest) tuple, which never equals any input's bytes. A digest is computed
    with hashlib, which lets go of the GIL: a large request's key is hashed beside the loop
    (kernel.core.admission), where a copy of its bytes would have held the loop."""
    view = memoryview(t.raw)
    if view.nbytes <= KEY_BYTES_INLINE:
        return (t.name, t.datatype, t.shape, view.tobytes())
    return (t.name, t.datatype, t.shape, ("sha256", view.nbytes, hashlib.sha256(view).digest()))


def local_key(model, request) -> tuple:
    """The local cache's key: this load of the model version (its ModelStats, so a reloaded model
    never answers from its previous load's entries), every input, and the extras."""
    inputs = request.inputs
    if len(inputs) == 1:
        parts = (_input_part(inputs[0]),)
    else:
        parts = tuple(sorted((_input_part(t) for t in inputs), key=_name))
    return (model.stats, parts, request_extras(request))


def _name(part: tuple) -> str:
    return part[0]


def local_key_bytes(key: tuple) -> int:
    """What a local key holds, for the cache's byte accounting."""
    return sum((len(p[3]) if type(p[3]) is bytes else DIGEST_PART_BYTES) + len(p[0]) for p in key[1]) + len(key[2])


def redis_key(model, request) -> bytes:
    """The same fields in every process: model name and version, then each input (in name order) as
    name, datatype, shape and bytes, then the extras, every field length-prefixed, hashed with SHA-256."""
    h = hashlib.sha256()
    name = model.name.encode()
    h.update(_U32.pack(len(name)) + name + _I64.pack(model.version))
    inputs = request.inputs if len(request.inputs) == 1 else sorted(request.inputs, key=lambda t: t.name)
    h.update(_U32.pack(len(inputs)))
    for t in inputs:
        tname, dtype = t.name.encode(), t.datatype.encode()
        h.update(_U32.pack(len(tname)) + tname + _U32.pack(len(dtype)) + dtype + _U32.pack(len(t.shape)))
        h.update(struct.pack(f"<{len(t.shape)}q", *t.shape))
        raw = t.raw
        h.update(_U64.pack(len(raw)))
        h.update(raw)
    extras = request_extras(request)
    h.update(_U64.pack(len(extras)))
    h.update(extras)
    return REDIS_KEY_PREFIX + h.hexdigest().encode()

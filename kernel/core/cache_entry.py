"""What a stored response answers: shared by the local cache (kernel.core.cache) and the Redis
cache (kernel.core.cache_redis), which the local one imports only when configured, so the piece
both need lives beside them rather than in either."""

from __future__ import annotations

from typing import Optional

from kernel.core.request import InferTensor


def stored_answer(outputs: list[InferTensor], all_outputs: bool, requested) -> Optional[list[InferTensor]]:
    """The stored `outputs` a request asking for `requested` (None: all) gets, or None when some
    are missing (an entry stored from a request that named fewer outputs): the lookup then misses.
    Local and Redis entries answer alike."""
    if requested is None:
        return list(outputs) if all_outputs else None
    by_name = {t.name: t for t in outputs}
    out = []
    for o in requested:
        t = by_name.get(o.name)
        if t is None:
            return None
        out.append(t)
    return out

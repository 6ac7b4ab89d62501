"""The descriptor pool Kernel's generated protobuf modules register into.

Kernel's messages keep Triton's full names (inference.ModelConfig, ...). In the
process-wide default pool they would collide with the same names registered by
tritonclient (or any other copy of Triton's protos), and whichever module is
imported second would fail. scripts/gen_protos.py points the generated modules
here instead, so Kernel and tritonclient can live in one process.
"""

from __future__ import annotations

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()


def Default() -> descriptor_pool.DescriptorPool:  # noqa: N802 - stands in for descriptor_pool.Default
    return POOL

"""add_sub as a bound Python callable, served by Kernel's PyTriton-compatible API or by real PyTriton.

The same program runs under both (only the import prefix differs), so `bound_callables.py` can put
Kernel, real PyTriton 0.7 and real Triton's Python backend side by side with perf_analyzer.
The model matches benchmarks/model_repo/add_sub: INPUT0, INPUT1 FP32 [4] -> OUTPUT0 = sum,
OUTPUT1 = difference, no batching, one instance.

    python benchmarks/bound_add_sub.py --api kernel --http-port 8000 --grpc-port 8001 --metrics-port 8002
"""

from __future__ import annotations

import argparse
import importlib
import logging

import numpy as np


def infer(requests):
    return [{"OUTPUT0": r["INPUT0"] + r["INPUT1"], "OUTPUT1": r["INPUT0"] - r["INPUT1"]} for r in requests]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--api", choices=["kernel", "pytriton"], default="kernel")
    ap.add_argument("--http-port", type=int, default=8000)
    ap.add_argument("--grpc-port", type=int, default=8001)
    ap.add_argument("--metrics-port", type=int, default=8002)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    triton = importlib.import_module(f"{args.api}.triton")
    model_config = importlib.import_module(f"{args.api}.model_config")
    # PyTriton restricts the statistics endpoint by default; perf_analyzer needs it.
    security = triton.TritonSecurityConfig(restricted_endpoints=[])
    config = triton.TritonConfig(http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port)
    with triton.Triton(config=config, security_config=security) as server:
        server.bind(
            model_name="add_sub",
            infer_func=infer,
            inputs=[model_config.Tensor(name="INPUT0", dtype=np.float32, shape=(4,)),
                    model_config.Tensor(name="INPUT1", dtype=np.float32, shape=(4,))],
            outputs=[model_config.Tensor(name="OUTPUT0", dtype=np.float32, shape=(4,)),
                     model_config.Tensor(name="OUTPUT1", dtype=np.float32, shape=(4,))],
            config=model_config.ModelConfig(batching=False),
        )
        server.serve()


if __name__ == "__main__":
    main()

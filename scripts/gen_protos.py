#!/usr/bin/env python3
"""Regenerate the committed protobuf modules (*_pb2.py and *_pb2.pyi).

The proto path is the repository root, so `kernel/protos/model_config.proto`
becomes the module `kernel.protos.model_config_pb2`, and a proto that imports
it by that path gets a matching Python import. Only message classes are
generated (no grpcio stubs): the servers bind their own handlers.

One edit is made to protoc's output: the modules register their descriptors in
Kernel's own pool (kernel/protos/_pool.py) rather than protobuf's default pool,
because Triton's message names would otherwise clash with tritonclient's copy
of the same protos when both are imported into one process.

    python scripts/gen_protos.py             # write next to the .proto files
    python scripts/gen_protos.py --out DIR   # write under DIR (staleness test)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# Folders (relative to the repository root) whose *.proto files are compiled.
PROTO_DIRS = ("kernel/protos", "transports/grpc/protos")


def proto_files(root: Path = REPO_ROOT) -> list[str]:
    """Repository-relative paths of every .proto to compile, in a stable order."""
    found: list[str] = []
    for rel in PROTO_DIRS:
        folder = root / rel
        if folder.is_dir():
            found.extend(p.relative_to(root).as_posix() for p in sorted(folder.glob("*.proto")))
    return found


def generate(out_dir: Path, root: Path = REPO_ROOT) -> list[str]:
    """Compile every proto into out_dir; returns the proto paths compiled."""
    # Imported lazily so that `--help` works without grpcio-tools installed.
    from grpc_tools import protoc
    import grpc_tools

    files = proto_files(root)
    if not files:
        return files
    out_dir.mkdir(parents=True, exist_ok=True)
    # grpc_tools ships the well-known types (google/protobuf/*.proto) here.
    wkt_include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    args = [
        "protoc",
        f"--proto_path={root}",
        f"--proto_path={wkt_include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *files,
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc} for {files}")
    for rel in files:
        _use_kernel_pool(out_dir / (rel[: -len(".proto")] + "_pb2.py"))
    return files


_DEFAULT_POOL_IMPORT = "from google.protobuf import descriptor_pool as _descriptor_pool\n"
_KERNEL_POOL_IMPORT = "from kernel.protos import _pool as _descriptor_pool\n"


def _use_kernel_pool(module: Path) -> None:
    text = module.read_text(encoding="utf-8")
    if text.count(_DEFAULT_POOL_IMPORT) != 1:
        raise RuntimeError(f"{module}: protoc output changed shape; cannot redirect it to kernel/protos/_pool.py")
    module.write_text(text.replace(_DEFAULT_POOL_IMPORT, _KERNEL_POOL_IMPORT), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="output root (default: repository root)")
    ns = parser.parse_args(argv)
    files = generate(ns.out.resolve())
    for f in files:
        print(f"generated {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

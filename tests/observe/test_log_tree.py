"""Kernel's log records go through Python's `logging` tree (issue 27).

A PyTriton program that calls `logging.basicConfig(...)` and runs kernel.triton's in-process server
gets Kernel's lines in its own format, and can route them (a handler on the `kernel` logger sees
each record with its structure: model, version, state); Kernel used to give the `kernel` logger a
handler of its own, drop the application's, and not propagate. A program that configures nothing
still sees Kernel's lines, in Triton's layout. Each program runs in a process of its own, as a
user's would, so that logging's global state is its own.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

from conftest import ROOT, free_ports

PROGRAM = """
import json, logging, sys
import numpy as np
{configure}
from kernel.model_config import ModelConfig, Tensor
from kernel.triton import Triton, TritonConfig

records = []


class Keep(logging.Handler):
    def emit(self, record):
        records.append({{"logger": record.name, "message": record.getMessage(),
                         **{{k: getattr(record, k) for k in ("model", "version", "state") if hasattr(record, k)}}}})


{route}


def double(requests):
    return [{{"y": r["x"] * 2}} for r in requests]


config = TritonConfig(http_port={http}, grpc_port={grpc}, metrics_port={metrics})
with Triton(config=config) as triton:
    triton.bind(model_name="double", infer_func=double, inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
                outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))], config=ModelConfig(max_batch_size=8))
    triton.run()
print("RECORDS " + json.dumps(records, default=str), flush=True)
"""

GLOG_STARTED = re.compile(r'^I\d{4} [\d:.]+ \d+ server\.py:\d+\] "Started HTTPService at ', re.M)


def run(configure: str, route: str) -> subprocess.CompletedProcess:
    http, grpc, metrics = free_ports(3)
    source = PROGRAM.format(configure=configure, route=route, http=http, grpc=grpc, metrics=metrics)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(source)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def records(done: subprocess.CompletedProcess) -> list[dict]:
    line = next(line for line in done.stdout.splitlines() if line.startswith("RECORDS "))
    return json.loads(line[len("RECORDS "):])


def test_an_application_formats_and_routes_kernels_records():
    done = run(
        configure='logging.basicConfig(level=logging.INFO, format="APP|%(name)s|%(levelname)s|%(message)s", '
                  'stream=sys.stdout)',
        route='logging.getLogger("kernel").addHandler(Keep())',
    )
    # formatted by the application's basicConfig, and not a second time by Kernel
    assert re.search(r"^APP\|kernel\.core\.server\|INFO\|Started HTTPService at \S+$", done.stdout, re.M), done.stdout
    assert re.search(r"^APP\|kernel\.core\.server\|INFO\|successfully loaded 'double'$", done.stdout, re.M)
    assert not GLOG_STARTED.search(done.stderr), done.stderr
    # routed: the application's handler on the `kernel` logger has every record, with its structure
    kept = records(done)
    loaded = [r for r in kept if r["message"] == "successfully loaded 'double'"]
    assert loaded == [{"logger": "kernel.core.server", "message": "successfully loaded 'double'", "model": "double",
                       "state": "READY"}]
    assert {"logger": "kernel.core.server", "message": "loading: double:1", "model": "double", "version": 1,
            "state": "LOADING"} in kept


def test_without_logging_configured_kernel_writes_its_lines_in_tritons_layout():
    done = run(configure="", route="")
    assert GLOG_STARTED.search(done.stderr), done.stderr
    assert records(done) == []  # nothing routed to the program: it asked for nothing

"""How many front processes `--front-processes auto` runs, from the CPUs this process may use.

A front spends about 40 % of the server's CPU per small request (measured, add_sub: ~90 us in the
front, ~130 us in the worker), and each model instance is a process of its own, so fronts get about
a third of the CPUs: 2 and 3 CPUs -> 1 (one front, no supervisor: exactly the single-process
server), 4-5 -> 1, 6-8 -> 2, 16 -> 5, 64 -> 21, capped at MAX_AUTO. "The CPUs this process may use"
is the smaller of its affinity mask and its cgroup's CPU quota (a container limited to 4 CPUs on a
64-core host gets 1 front, not 21).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

MAX_AUTO = 32


def usable_cpus() -> float:
    """CPUs this process may run on: its affinity mask, capped by its cgroup's quota."""
    try:
        cpus = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cpus = float(os.cpu_count() or 1)
    quota = cgroup_quota()
    return min(cpus, quota) if quota is not None else cpus


def cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> Optional[float]:
    """The CPU quota of this process's cgroup in CPUs (cgroup v2 cpu.max, else v1 cfs), None if unlimited."""
    try:
        text = (root / "cpu.max").read_text().split()
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def auto_count(cpus: float) -> int:
    """The front count `auto` picks for this many usable CPUs."""
    whole = int(math.floor(cpus + 1e-9))
    if whole < 6:
        return 1
    return max(1, min(MAX_AUTO, whole // 3))


def resolve(value) -> int:
    """The number of fronts for the flag's value ('auto' or an int)."""
    return auto_count(usable_cpus()) if value == "auto" else int(value)


def single_front_reason(args) -> str:
    """Why these flags need a single front ('' when several can serve them)."""
    if args.allow_http and args.http_server == "hypercorn":
        return "needs --http-server uvicorn (hypercorn binds its port for one process only)"
    if args.allow_sagemaker and os.environ.get("SAGEMAKER_MULTI_MODEL", "").strip().lower() == "true":
        # The multi-model endpoint keeps which models it loaded, under which names and urls, in its
        # transport; with several fronts each would know only its own loads.
        return "a SageMaker multi-model endpoint (SAGEMAKER_MULTI_MODEL=true) is served by one front process"
    return ""

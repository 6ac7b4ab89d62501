"""Shared pieces for the peer checks, and the differential check's summary line printed last.

The checks here reuse tests/conftest.py's helpers (free ports, model folders); pytest imports
this file as `conftest`, so it loads that one under another name and re-exports what is used.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "kernel_tests_conftest", Path(__file__).resolve().parent.parent / "tests" / "conftest.py")
_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tests)

EXAMPLES = _tests.EXAMPLES
ROOT = _tests.ROOT
TEST_MODELS = _tests.TEST_MODELS
free_ports = _tests.free_ports
KernelProcess = _tests.KernelProcess
running = _tests.running


def pytest_terminal_summary(terminalreporter):
    module = sys.modules.get("test_differential")
    if module is not None and module.RESULTS:
        terminalreporter.write_line(module.summary())

"""BLS outside execute: Triton refuses it with "BLS is only supported during the 'execute' function.".

From initialize the exception reaches the model (uncaught, the load fails); from
finalize it is logged. Both seen with tritonserver 2.51 on these two models.
"""

from __future__ import annotations

import shutil

from conftest import TEST_MODELS

MODELS = TEST_MODELS / "model_process"
REFUSED = "TritonModelException: BLS is only supported during the 'execute' function."


def test_bls_from_initialize_fails_the_load(start_kernel, tmp_path):
    shutil.copytree(MODELS / "bls_in_initialize", tmp_path / "bls_in_initialize")
    shutil.copytree(MODELS / "bls_in_finalize", tmp_path / "bls_in_finalize")
    k = start_kernel([tmp_path], "--exit-on-error", "false")
    assert k.wait_for_log("failed to load 'bls_in_initialize'", timeout=60), k.log()
    log = k.log()
    assert f"failed to load 'bls_in_initialize' version 1: Internal: {REFUSED}" in log
    # The model's own frames, as Triton's stub prints them.
    assert "/bls_in_initialize/1/model.py(14): _call\n" in log
    assert "/bls_in_initialize/1/model.py(19): initialize\n\n" in log


def test_bls_from_finalize_is_refused_and_logged(start_kernel, tmp_path):
    shutil.copytree(MODELS / "bls_in_finalize", tmp_path / "bls_in_finalize")
    k = start_kernel([tmp_path]).wait_ready()
    k.stop()
    log = k.log()
    assert REFUSED in log
    assert "/bls_in_finalize/1/model.py(18): finalize\n\n" in log

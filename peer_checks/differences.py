"""Every known difference between Kernel and tritonserver 2.51 that the differential check finds,
in one place, each with its reason. Two kinds:

- DIFFERENCES: deliberate. Kernel answers otherwise on purpose; the reason says why.
- OPEN: not deliberate: Kernel should answer as Triton does and does not yet. Each names the
  part of Kernel that owns it. The check reports these as expected failures (xfail) until fixed.

Any other difference fails the check. A listed case that no longer differs is reported in the
summary (so the lists stay true). Behaviour that cannot be put in the table because tritonserver
2.51 itself breaks on it is in NOT_SENT, with where Kernel's answer is tested instead.
"""

from __future__ import annotations

import os

_CLIENT_ERRORS = (
    "Kernel answers a load the client got wrong with 400 / INVALID_ARGUMENT and the reason after "
    "': ' (Triton: 500 / INTERNAL, and the reason only in its log); decided in issue 14 (commit 866b229)"
)
_SHM_CLIENT_ERRORS = (
    "a shared-memory key that cannot be opened is the client's mistake: 400 / INVALID_ARGUMENT "
    "(Triton: 500 / INTERNAL); decided in issue 14 items 3 and 12 (commit 506c4fe)"
)

_INFER_CLIENT_ERRORS = (
    "an infer request the client got wrong is 400 naming the problem (Triton 2.51: 500 for the type and "
    "shape errors its JSON parser finds); decided in issue 14 item 12"
)
_NOT_JSON = (
    "a body that is not JSON (or a setting of the wrong JSON type) is the client's mistake: 400 with "
    "Triton's words and offset (Triton 2.51: 500); issue 14 (commit 17843eb)"
)
_CRASHER_UNLOADING = (
    "Triton 2.51 never finishes unloading a model whose stub died earlier: crasher reads UNLOADING in "
    "every later index of the run; Kernel's unload completes (UNAVAILABLE, 'unloaded'). The other rows "
    "are the same"
)

_MME_INVOKE = (
    "POST /models/<name>/invoke without an X-Amzn-SageMaker-Target-Model header: Kernel serves the model "
    "loaded as <name> (whatever target name it was registered under); Triton 2.51 looks up <name> itself "
    "and answers 400 'Request for unknown model' when the load had named a target (SageMaker always sends "
    "the header, and then both serve the same model)"
)

_HEALTH_BODIES = (
    "same status codes; Kernel's health answers carry the KServe v2 (Open Inference Protocol) bodies "
    "{\"live\": bool}, {\"ready\": bool} and, for a ready model, {\"name\": m, \"ready\": true}, where "
    "tritonserver 2.51 sends none: KServe's own Python client (kserve 0.21 InferenceRESTClient) decodes them "
    "and raised JSONDecodeError on Triton's empty ones. tritonclient and perf_analyzer read only the status "
    "(issue 35, tests/transports/test_health_bodies.py). An unready model keeps Triton's 400 error body"
)

# case id -> why Kernel answers differently, on purpose
DIFFERENCES: dict[str, str] = {
    "health-live": _HEALTH_BODIES,
    "health-ready": _HEALTH_BODIES,
    "health-ready-after-failed-loads": _HEALTH_BODIES,
    "model-ready": _HEALTH_BODIES,
    "model-ready-version": _HEALTH_BODIES,
    "model-ready-after-bad-reloads": _HEALTH_BODIES,
    "vertex-redirect-health-ready": _HEALTH_BODIES,
    "load-unknown-model": _CLIENT_ERRORS,
    "grpc-load-unknown": _CLIENT_ERRORS,
    "load-files-without-config": _CLIENT_ERRORS,
    "load-file-escapes": _CLIENT_ERRORS,
    "load-bad-config-override": _CLIENT_ERRORS,
    "load-override-named-otherwise": _CLIENT_ERRORS + " (the words are Triton's, 'failed to load' first)",
    "load-bad-parameter-type": _CLIENT_ERRORS + " (the words are Triton's)",
    "repository-index-ready-not-bool": _CLIENT_ERRORS + " (the words are Triton's)",
    "shm-register-no-such-key": _SHM_CLIENT_ERRORS,
    "grpc-shm-register-bad": _SHM_CLIENT_ERRORS,
    "load-broken-config":
        "same status (500) and words; Kernel adds the parse error after ': ' (Triton writes it only to its log)",
    "model-ready-after-crash":
        "Kernel restarts a dead worker at once and reads NOT READY until the replacement is ready (issue 13); "
        "Triton 2.51 reads READY with a dead stub. (Timing: if the replacement is already up, both say 200 "
        "and the summary lists this as 'listed but now the same'.)",
    "infer-crasher-after-crash":
        "Kernel restarts a dead worker at once, so the next request is served; Triton 2.51 fails it with "
        "\"Stub process 'crasher_0' is not healthy.\" and restarts the stub only then",
    "unload-bad-dependents":
        "Kernel checks a parameter's type where it enters (unload_dependents must be a boolean: 400); "
        "Triton 2.51 ignores a non-boolean and unloads",
    "grpc-load-shell-name":
        "a name with whitespace or shell characters is refused before the repository is looked at, in "
        "the words later Triton uses ('Invalid stub name: contains invalid characters', issue 13); "
        "2.51 looks the name up first (and hangs the load when such a folder exists, see NOT_SENT)",
    "sagemaker-models-listed":
        "Triton 2.51 lists a model loaded with an X-Amzn-SageMaker-Target-Model header as an empty "
        "object ({\"models\": [{}]}); Kernel lists its modelName and modelUrl",
    "sagemaker-invoke-bad-json": _MME_INVOKE,
    "sagemaker-invoke-wrong-dtype": _MME_INVOKE,
    "sagemaker-invocations-response-stream":
        "Triton 2.51 has no /invocations-response-stream route (400, no body); Kernel serves SageMaker's "
        "response-streaming contract there (server-sent events), as later Triton releases do",
    "infer-too-few-elements": _INFER_CLIENT_ERRORS + " (Kernel's words name the input and both counts; "
                              "Triton: 'Shape does not match true shape of 'data' field')",
    "infer-data-not-numbers": _INFER_CLIENT_ERRORS + " (the words are Triton's)",
    "infer-inputs-not-a-list": _INFER_CLIENT_ERRORS,
    "infer-bad-parameter-type": _INFER_CLIENT_ERRORS + " (the words are Triton's)",
    "infer-bad-sequence-id": _INFER_CLIENT_ERRORS + " (the words are Triton's)",
    "infer-bad-timeout": _INFER_CLIENT_ERRORS + " (the words are Triton's)",
    "infer-binary-header-not-a-number":
        "Kernel refuses an Inference-Header-Content-Length that is not decimal digits (400 'Unable to parse "
        "inference header size'); Triton 2.51 reads it with atoi, so 'abc' is 0 and the body a raw request. "
        "Two parsers of one request must not split it differently (issue 14 item 12). A real 0 is a raw "
        "request in both (infer-raw-binary-single-input)",
    "generate-decoupled":
        "same words; Kernel answers 500 where Triton 2.51 answers 200 with the error in the body (a failed "
        "request must not read as a success to a client that checks the status)",
    "grpc-cuda-shm-register":
        "same status (INVALID_ARGUMENT); Kernel says why nothing can be registered ('GPUs not supported': "
        "this machine has none), where Triton 2.51 says 'failed to register shared memory region: invalid args'",
    "infer-malformed-json": _NOT_JSON,
    "infer-not-json": _NOT_JSON,
    "infer-empty-document": _NOT_JSON,
    "repository-index-bad-json": _NOT_JSON,
    "logging-bad-value": _NOT_JSON,
    "sagemaker-invocations-not-json": _NOT_JSON,
    "sagemaker-invocations-bad-json": _NOT_JSON,
    "vertex-predict-bad-json": _NOT_JSON,
    "load-bad-json": _NOT_JSON,
    "repository-index-after-failures": _CRASHER_UNLOADING,
    "grpc-repository-index": _CRASHER_UNLOADING,
    "vertex-redirect-index": _CRASHER_UNLOADING,
    "grpc-infer-extra-raw-contents":
        "more raw_input_contents than inputs that take one: Kernel refuses with INVALID_ARGUMENT naming both "
        "counts (issue 23 defect 8: the surplus was buffered for nothing, and which bytes belong to which "
        "input is a guess); Triton 2.51 uses the first ones and ignores the rest",
    "vertex-redirect-unload":
        "Kernel refuses redirects that change server state (load/unload, shared-memory register/"
        "unregister) with 403: the predict route is open to every caller of the endpoint, the "
        "repository API usually is not; Triton 2.51 performs them",
    "grpc-compression-grpcio-other-rpcs":
        "--grpc-infer-response-compression-level with --grpc-server grpcio (Kernel only): the answers of every "
        "RPC are compressed (ModelMetadata, ModelConfig, ServerLive...), where tritonserver 2.51 compresses "
        "ModelInfer and ModelStreamInfer answers only. grpcio offers a server-wide level or a per-call algorithm "
        "that ignores what the client accepts, and no handler sees grpc-accept-encoding; the algorithm chosen "
        "per level is the same. Clients read the compressed answers all the same; the native (default) and "
        "grpclib servers match Triton (peer_checks/test_grpc_compression_against_triton.py)",
}


def _several_fronts() -> bool:
    """The check runs against several front processes (KERNEL_TEST_SERVE_ARGS="--front-processes N", N > 1)."""
    words = os.environ.get("KERNEL_TEST_SERVE_ARGS", "").replace("=", " ").split()
    for i, word in enumerate(words[:-1]):
        if word == "--front-processes":
            if words[i + 1] == "auto":  # as many as `kernel serve` would start on this machine
                from kernel.serve.fronts import count

                return count.resolve("auto") > 1
            return words[i + 1].isdigit() and int(words[i + 1]) > 1
    return False


if _several_fronts():
    _MME_FRONTS = (
        "with several front processes the SageMaker /models routes answer 400 naming SAGEMAKER_MULTI_MODEL=true "
        "(which runs one front): which models they loaded would be known only to the front that loaded them "
        "(tests/serve/test_front_processes.py::test_sagemaker_models_routes_are_refused_and_invocations_served_by_every_front)"
    )
    for _case in ("sagemaker-models-empty", "sagemaker-load", "sagemaker-models-listed", "sagemaker-model-described",
                  "sagemaker-invoke", "sagemaker-invoke-bad-json", "sagemaker-invoke-wrong-dtype",
                  "sagemaker-load-again", "sagemaker-model-unknown", "sagemaker-invoke-unknown",
                  "sagemaker-unload-unknown", "sagemaker-load-missing-url"):
        DIFFERENCES[_case] = _MME_FRONTS

# case id -> what differs, and which part of Kernel owns the fix (not deliberate: to be fixed)
OPEN: dict[str, str] = {
}

# requests left out of the table: what real Triton 2.51 does with them, and where Kernel is tested
NOT_SENT: dict[str, str] = {
    "POST /v2/repository/models/a;b/load (file override)":
        "Triton 2.51 hangs the load forever (its stub is launched through a shell and dies); later "
        "Triton refuses with 'Invalid stub name: contains invalid characters', which Kernel answers "
        "(400) at once: tests/loading/test_repository_api.py::test_shell_characters_in_a_name_get_tritons_words",
    "POST /v2/repository/models/missing_model_py/load (no model.py in the version folder)":
        "Triton 2.51 never answers the load (the model stays LOADING), after its stub logged 'Failed to "
        "preinitialize Python stub: Python model file not found in '<path>''; Kernel fails the load at once "
        "with those words (its log: failed to load '<name>' version 1: Failed to preinitialize ...): "
        "tests/core/test_model_lifecycle.py (missing_model_py)",
    "A model whose EXECUTION_ENV_PATH archive has a member outside its folder ('../..', an absolute path)":
        "Triton 2.51 unpacks it, writing outside the folder (later Triton refuses it, logging libarchive's "
        "'Path contains '..'' / 'Path is absolute', which its QA env/test.sh looks for); Kernel refuses it "
        "with those words: tests/backends/test_execution_env.py::test_refused_environments_fail_the_load_clearly",
    "SageMaker POST /models with a url /opt/ml/models/<hash>/model naming the model folder itself":
        "the table's repositories live under a temporary folder and tritonserver only takes this form under "
        "/opt/ml/models; measured by hand with 2.51 (a private /opt in a mount namespace): modelUrl "
        "'/opt/ml/models/<hash>' in GET /models/<name>, and a second load of that folder (with or without a "
        "trailing '/') 409 \"model repository '/opt/ml/models/<hash>' has already been registered\"; a "
        "repository url stays as given. Kernel answers the same for <parent>/model anywhere: "
        "tests/transports/test_sagemaker.py::test_multi_model_load_invoke_unload",
    "SageMaker POST /models with a body that is not JSON":
        "Triton 2.51 aborts (std::out_of_range, the whole server exits); Kernel answers 400: "
        "tests/transports/test_sagemaker.py::test_multi_model_bad_loads",
    "SageMaker POST /models without model_name":
        "Triton 2.51 never answers (the request hangs); Kernel answers 400: test_multi_model_bad_loads",
    "SageMaker /invocations with no SAGEMAKER_TRITON_DEFAULT_MODEL_NAME and exactly one model":
        "(deliberate; not in the table, whose servers name a default model) tritonserver 2.51 answers 404 "
        "'Request for unknown model: 'unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME' is not found' (its "
        "container's serve script picks the only model); Kernel's endpoint picks the only model itself. With "
        "several models Kernel answers Triton's 404: tests/transports/test_sagemaker.py::test_default_model_selection",
    "Chunked /invocations body of 65537 one-byte chunks":
        "Triton 2.51 has no cap (later Triton caps at 65536 non-empty chunks with the words Kernel uses): "
        "tests/transports/test_sagemaker.py::test_chunked_invocations_body_is_capped_at_65536_chunks. "
        "A body of exactly 65536 chunks, some read in two pieces, is in the table "
        "(sagemaker-invocations-chunked-at-max): both serve it",
}

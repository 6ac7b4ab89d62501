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

_CLIENT_ERRORS = (
    "Kernel answers a load the client got wrong with 400 / INVALID_ARGUMENT and the reason after "
    "': ' (Triton: 500 / INTERNAL, and the reason only in its log); decided in issue 14 (commit 866b229)"
)
_SHM_CLIENT_ERRORS = (
    "a shared-memory key that cannot be opened is the client's mistake: 400 / INVALID_ARGUMENT "
    "(Triton: 500 / INTERNAL); decided in issue 14 items 3 and 12 (commit 506c4fe)"
)

_MME_INVOKE = (
    "POST /models/<name>/invoke without an X-Amzn-SageMaker-Target-Model header: Kernel serves the model "
    "loaded as <name> (whatever target name it was registered under); Triton 2.51 looks up <name> itself "
    "and answers 400 'Request for unknown model' when the load had named a target (SageMaker always sends "
    "the header, and then both serve the same model)"
)

# case id -> why Kernel answers differently, on purpose
DIFFERENCES: dict[str, str] = {
    "load-unknown-model": _CLIENT_ERRORS,
    "grpc-load-unknown": _CLIENT_ERRORS,
    "load-files-without-config": _CLIENT_ERRORS,
    "load-file-escapes": _CLIENT_ERRORS,
    "load-bad-config-override": _CLIENT_ERRORS,
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
    "vertex-redirect-unload":
        "Kernel refuses redirects that change server state (load/unload, shared-memory register/"
        "unregister) with 403: the predict route is open to every caller of the endpoint, the "
        "repository API usually is not; Triton 2.51 performs them",
}

# case id -> what differs, and which part of Kernel owns the fix (not deliberate: to be fixed)
OPEN: dict[str, str] = {
    "health-live-post": "transports/http: Triton answers POST on /v2/health/* with 405 Method Not Allowed",
    "model-metadata-bad-version": "transports/http: a version that is not a number is 404 {\"error\":\"Not Found\"} "
                                  "in Triton (the route does not match)",
    "model-ready-unknown": "transports/http: Triton's not-ready answer has the body {\"error\":\"Model version not ready\"}",
    "model-ready-unloaded": "transports/http: as model-ready-unknown",
    "model-ready-after-failed-load": "transports/http: as model-ready-unknown",
    "infer-too-few-elements": "transports/http codec: Triton 500 'Unable to parse 'data': Shape does not match "
                              "true shape of 'data' field'",
    "infer-unknown-input": "kernel/core request validation: Triton counts inputs first ('expected 2 inputs but "
                           "got 3 inputs ...')",
    "infer-unknown-output": "kernel/core: Triton's message has no '[request id: ...]' prefix",
    "grpc-infer-unknown-output": "kernel/core: as infer-unknown-output",
    "infer-bad-datatype-name": "transports/http codec: Triton says 'invalid datatype for input INPUT0'",
    "infer-binary-size-mismatch": "transports/http codec: Triton says 'unexpected additional input data for "
                                  "model 'add_sub''",
    "infer-binary-header-not-a-number": "transports/http: Triton ignores a non-numeric "
                                        "Inference-Header-Content-Length (the body is then raw input)",
    "infer-data-not-numbers": "transports/http codec: Triton answers JSON type errors with 500",
    "infer-inputs-not-a-list": "transports/http codec: Triton 500 'Unable to parse 'inputs': attempt to access "
                               "JSON non-array as array'",
    "infer-bad-parameter-type": "transports/http codec: Triton answers parameter type errors with 500",
    "infer-bad-sequence-id": "transports/http codec: as infer-bad-parameter-type",
    "infer-bad-timeout": "transports/http codec: as infer-bad-parameter-type",
    "infer-strings": "kernel/core: the shape error for a model with max_batch_size > 0 lacks Triton's "
                     "'NOTE: Setting a non-zero max_batch_size ...' sentence",
    "infer-decoupled-over-http": "transports/http: Triton refuses a decoupled model over HTTP with 501 'HTTP end "
                                 "point doesn't support models with decoupled transaction policy'",
    "infer-model-raises": "backends/python: Triton says \"for model 'raises_0'\" (Kernel: 'model instance')",
    "grpc-infer-model-raises": "backends/python: as infer-model-raises",
    "load-init-fails": "backends/python: Triton prefixes an initialize() failure with 'Internal: ' (Kernel: "
                       "'Failed to initialize Python stub: ')",
    "grpc-load-init-fails": "backends/python: as load-init-fails",
    "load-syntax-error": "backends/python: Triton gives 'Internal: SyntaxError: ...' without a traceback",
    "repository-index-after-failures": "backends/python: the reasons of load-init-fails and load-syntax-error, "
                                       "as they appear in the index",
    "grpc-repository-index": "as repository-index-after-failures",
    "vertex-redirect-index": "as repository-index-after-failures",
    "load-autocomplete-fails": "backends/python: Triton frames an auto_complete_config failure as the version's "
                               "('version 1 is at UNAVAILABLE state: Internal: ...;')",
    "infer-wrong-count": "backends/python: Triton prefixes \"Failed to process the request(s) for model "
                         "'wrong_count_0', message: \"",
    "infer-wrong-type": "backends/python: as infer-wrong-count",
    "infer-crasher-dies": "backends/python: Triton's answer for a request whose worker died is only \"Stub "
                          "process 'crasher_0' is not healthy.\"",
    "generate-decoupled": "transports/http generate: Triton answers 200 with the error in the body and without "
                          "Kernel's ' (got 2)'; Kernel answers 500 (the owner may rather list the status as "
                          "deliberate)",
    "infer-classification": "transports/http: the 'classification' output parameter is ignored (Triton answers "
                            "the top classes as BYTES '<value>:<index>')",
    "grpc-infer-classification": "transports/grpc: the 'classification' output parameter is refused as "
                                 "UNIMPLEMENTED (Triton answers the top classes)",
    "infer-raw-binary-single-input": "transports/http: a raw binary body (Inference-Header-Content-Length: 0) "
                                     "for a one-input model is refused as empty JSON; Triton takes it as the input",
    "stats-all": "follows from infer-decoupled-over-http and infer-raw-binary-single-input: Kernel ran the "
                 "first, which Triton refused, and refused the second, which Triton ran",
    "grpc-statistics-all": "as stats-all",
    "grpc-cuda-shm-register": "transports/grpc (CUDA shared memory on a machine without GPUs): Triton says "
                              "'failed to register shared memory region: invalid args'",
}

# requests left out of the table: what real Triton 2.51 does with them, and where Kernel is tested
NOT_SENT: dict[str, str] = {
    "POST /v2/repository/models/a;b/load (file override)":
        "Triton 2.51 hangs the load forever (its stub is launched through a shell and dies); later "
        "Triton refuses with 'Invalid stub name: contains invalid characters', which Kernel answers "
        "(400) at once: tests/loading/test_repository_api.py::test_shell_characters_in_a_name_get_tritons_words",
    "POST /v2/repository/models/missing_model_py/load (no model.py in the version folder)":
        "Triton 2.51 never answers the load (the model stays LOADING); Kernel fails it at once with the "
        "path it looked for: tests/core/test_model_lifecycle.py (missing_model_py)",
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
        "tests/transports/test_sagemaker.py::test_chunked_invocations_body_is_capped_at_65536_chunks",
}

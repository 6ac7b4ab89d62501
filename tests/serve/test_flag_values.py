"""`kernel serve` reads every flag's value as tritonserver 2.51 does.

The expectations were measured against the real tritonserver (each value below was passed to it and
its effect read back from GET /v2/logging, the start-up options table, or its refusal on stderr):

- <integer> flags: C's stoi: leading white space and a sign, then the leading digits, the rest
  ignored ('7abc' is 7, '1.5' is 1, '0x10' is 0); words refused ("Invalid option value. Got true"),
  beyond 32 bits refused ("Provided option value is out of bound. Got ...").
- --log-verbose, the one <integer> flag that also takes true/false (any case).
- <boolean> flags: exactly true/on/1 and false/off/0 in any case; yes/no/' true' refused
  ("invalid value for bool option: yes").
- <float>: C's stof (hexadecimal, exponent, trailing text ignored).
- `--flag value`, `--flag=value` and unambiguous prefixes (`--log-verb=2`) alike; a <boolean> flag
  needs its value (`option '--strict-readiness' requires an argument`).

A refused value exits with status 1 under tritonserver's two lines `Bad option: "--flag".` and the
reason. The parse-level tests run the parser itself; test_flag_startup.py starts real servers.
"""

from __future__ import annotations

import pytest

from kernel.serve import cli
from kernel.serve.flags import ArgumentsRefused

# Each tritonserver flag Kernel knows, with the kind tritonserver's --help gives its value.
INTEGER_FLAGS = [
    "exit-timeout-secs", "repository-poll-secs", "model-load-thread-count", "model-load-retry-count",
    "http-port", "http-thread-count", "grpc-port", "grpc-infer-allocation-pool-size", "grpc-keepalive-time",
    "grpc-keepalive-timeout", "grpc-http2-max-pings-without-data", "grpc-http2-max-ping-strikes",
    "grpc-http2-min-recv-ping-interval-without-data", "grpc-max-connection-age", "grpc-max-connection-age-grace",
    "sagemaker-port", "sagemaker-thread-count",
    "vertex-ai-port", "vertex-ai-thread-count", "metrics-port", "pinned-memory-pool-byte-size",
    "buffer-manager-thread-count", "response-cache-byte-size", "trace-rate", "trace-count", "trace-log-frequency",
]
BOOLEAN_FLAGS = [
    "log-info", "log-warning", "log-error", "exit-on-error", "strict-readiness", "enable-peer-access",
    "allow-http", "reuse-http-port", "allow-grpc", "reuse-grpc-port", "grpc-use-ssl", "grpc-use-ssl-mutual",
    "grpc-keepalive-permit-without-calls", "allow-sagemaker", "allow-vertex-ai", "allow-metrics",
    "allow-gpu-metrics", "allow-cpu-metrics", "strict-model-config",
]
FLOAT_FLAGS = ["metrics-interval-ms", "min-supported-compute-capability"]

INTEGER_VALUES = [  # value, what tritonserver makes of it (an int, or its refusal)
    ("7", 7), ("+5", 5), ("-5", -5), (" 7", 7), ("7abc", 7), ("1.5", 1), ("0x10", 0), ("2147483647", 2147483647),
    ("true", "Invalid option value. Got true"), ("TRUE", "Invalid option value. Got TRUE"),
    ("yes", "Invalid option value. Got yes"), ("on", "Invalid option value. Got on"),
    ("abc", "Invalid option value. Got abc"), ("", "Invalid option value. Got "),
]
BOOLEAN_VALUES = [
    *[(v, True) for v in ("true", "TRUE", "True", "1", "on", "ON")],
    *[(v, False) for v in ("false", "FALSE", "False", "0", "off", "Off", "OFF")],
    *[(v, f"invalid value for bool option: {v}")
      for v in ("yes", "no", "t", "f", "y", "n", "", "2", "-1", " true", "true ", "enabled")],
]
VERBOSE_VALUES = [
    ("true", 1), ("True", 1), ("TRUE", 1), ("false", 0), ("FALSE", 0), ("0", 0), ("1", 1), ("2", 2),
    ("-1", 0), ("-5", 0), ("+5", 5), ("0x10", 0), ("1.5", 1), (" 3", 3), ("3 ", 3), ("3abc", 3),
    ("yes", "Invalid option value. Got yes"), ("on", "Invalid option value. Got on"),
    ("abc", "Invalid option value. Got abc"), ("", "Invalid option value. Got "),
    ("99999999999", "Provided option value is out of bound. Got 99999999999"),
]
FLOAT_VALUES = [
    ("1.5", 1.5), ("2000abc", 2000.0), ("0x10", 16.0), ("1e3", 1000.0), ("-2.5", -2.5),
    ("true", "Invalid option value. Got true"), ("abc", "Invalid option value. Got abc"),
    ("", "Invalid option value. Got "),
]


def parse(*argv: str):
    return cli.build_parser().parse_args(["serve", *argv])


def refusal(capsys, *argv: str) -> str:
    """The message `kernel serve` refuses argv with (after checking it exits 1 and prints it)."""
    with pytest.raises(ArgumentsRefused) as refused:
        parse(*argv)
    assert refused.value.code == 1
    assert refused.value.message in capsys.readouterr().err
    return refused.value.message


def dest(flag: str) -> str:
    return flag.replace("-", "_")


def check(capsys, flag: str, value: str, expected, got_back=lambda v: v) -> None:
    for argv in ([f"--{flag}={value}"], [f"--{flag}", value]):
        if isinstance(expected, str):
            assert refusal(capsys, *argv) == f'Bad option: "--{flag}".\n{expected}', argv
            continue
        args = parse(*argv)
        if flag in cli.NO_EFFECT_FLAGS:  # accepted; nothing to read back
            assert f"--{flag}" in args.no_effect
        else:
            assert got_back(getattr(args, dest(flag))) == expected, argv


@pytest.mark.parametrize("flag", INTEGER_FLAGS)
@pytest.mark.parametrize("value, expected", INTEGER_VALUES)
def test_integer_flags(capsys, flag, value, expected):
    if flag.startswith("trace-") and not isinstance(expected, str):
        check(capsys, flag, value, expected, got_back=int)  # handed on as text to the trace settings
    else:
        check(capsys, flag, value, expected)


@pytest.mark.parametrize("flag", [f for f in INTEGER_FLAGS if not f.endswith("byte-size")])
def test_integer_flags_are_32_bit(capsys, flag):
    assert refusal(capsys, f"--{flag}=99999999999").endswith("Provided option value is out of bound. Got 99999999999")


@pytest.mark.parametrize("flag", ["pinned-memory-pool-byte-size", "response-cache-byte-size"])
def test_byte_sizes_are_64_bit(flag):
    parse(f"--{flag}=99999999999")  # tritonserver starts with this


@pytest.mark.parametrize("flag", BOOLEAN_FLAGS)
@pytest.mark.parametrize("value, expected", BOOLEAN_VALUES)
def test_boolean_flags(capsys, flag, value, expected):
    check(capsys, flag, value, expected)


@pytest.mark.parametrize("value, expected", VERBOSE_VALUES)
def test_log_verbose_takes_integers_and_true_false(capsys, value, expected):
    check(capsys, "log-verbose", value, expected)


@pytest.mark.parametrize("flag", FLOAT_FLAGS)
@pytest.mark.parametrize("value, expected", FLOAT_VALUES)
def test_float_flags(capsys, flag, value, expected):
    check(capsys, flag, value, expected)


def test_every_flag_of_a_kind_uses_that_kinds_parser():
    """No flag is left on argparse's own int/bool reading: each listed kind has one parser."""
    for flag in INTEGER_FLAGS:
        if flag not in cli.NO_EFFECT_FLAGS and not flag.startswith("trace-"):
            assert parse(f"--{flag}=12abc") is not None
    every = {*INTEGER_FLAGS, *BOOLEAN_FLAGS, *FLOAT_FLAGS}
    assert not every & cli.NOT_YET_FLAGS
    assert {f for f in cli.NO_EFFECT_FLAGS | cli.NOT_YET_FLAGS if f not in cli.FLAG_KINDS} == set()
    assert set(cli.FLAG_KINDS) - (cli.NO_EFFECT_FLAGS | cli.NOT_YET_FLAGS) == set()  # no stale kinds


@pytest.mark.parametrize(
    "argv, attribute, expected",
    [
        (["--model-control-mode=EXPLICIT"], "model_control_mode", "explicit"),
        (["--model-control-mode", "Poll"], "model_control_mode", "poll"),
        (["--log-format=ISO8601"], "log_format", "ISO8601"),
        (["--log-format", "json"], "log_format", "json"),
        (["--log-verb=2"], "log_verbose", 2),  # an unambiguous prefix, as getopt_long takes it
        (["--strict-read=false"], "strict_readiness", False),
        (["--exit-on-error=true", "--exit-on-error=false"], "exit_on_error", False),  # the last one wins
        (["--disable-auto-complete-config"], "disable_auto_complete_config", True),
        (["--exit-timeout-secs", "-5"], "exit_timeout_secs", -5),
        ([], "grpc_infer_response_compression_level", "none"),
        (["--grpc-infer-response-compression-level=HIGH"], "grpc_infer_response_compression_level", "high"),
        (["--grpc-infer-response-compression-level", "Medium"], "grpc_infer_response_compression_level", "medium"),
        (["--grpc-infer-response-compression-level=low"], "grpc_infer_response_compression_level", "low"),
        (["--grpc-infer-response-compression-level=none"], "grpc_infer_response_compression_level", "none"),
    ],
)
def test_value_forms(argv, attribute, expected):
    assert getattr(parse(*argv), attribute) == expected


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--log-format=iso8601"], 'Bad option: "--log-format".\ninvalid argument for --log-format'),
        (["--model-control-mode=sometimes"], 'Bad option: "--model-control-mode".\ninvalid argument for '
                                             "--model-control-mode"),
        (["--strict-readiness"], "option '--strict-readiness' requires an argument"),
        (["--log-verbose"], "option '--log-verbose' requires an argument"),
        (["--disable-auto-complete-config=true"], "option '--disable-auto-complete-config' doesn't allow an argument"),
        (["--log=1"], "option '--log=1' is ambiguous; possibilities: '--log-verbose' '--log-info' '--log-warning' "
                      "'--log-error' '--log-format' '--log-file'"),
        (["--bogus"], "unrecognized option '--bogus'"),
        # tritonserver names this flag with underscores when it refuses a value
        (["--grpc-infer-response-compression-level=maximum"], 'Bad option: "--grpc-infer-response-compression-level".'
                                                              "\ninvalid argument for --grpc_infer_response_compression_level"),
        (["--grpc-infer-response-compression-level="], 'Bad option: "--grpc-infer-response-compression-level".'
                                                       "\ninvalid argument for --grpc_infer_response_compression_level"),
        (["--grpc-infer-response-compression-level= high"], 'Bad option: "--grpc-infer-response-compression-level".'
                                                            "\ninvalid argument for --grpc_infer_response_compression_level"),
        (["--grpc-infer-response-compression-level=1"], 'Bad option: "--grpc-infer-response-compression-level".'
                                                        "\ninvalid argument for --grpc_infer_response_compression_level"),
        (["--grpc-infer-response-compression-level"], "option '--grpc-infer-response-compression-level' requires "
                                                      "an argument"),
        (["--bogus=1"], "unrecognized option '--bogus=1'"),
    ],
)
def test_refusals_in_tritonservers_words(capsys, argv, message):
    assert refusal(capsys, *argv).startswith(message)


def test_a_boolean_flag_does_not_swallow_the_next_flag(capsys):
    # tritonserver takes the next word as the value and refuses it; Kernel refuses as well.
    assert "--strict-readiness" in refusal(capsys, "--strict-readiness", "--model-repository=/x")


@pytest.mark.parametrize(
    "argv, message",
    [  # tritonserver 2.51's refusals of structured values, word for word
        (["--backend-config=bogus"], "--backend-config option format is '<backend name>,<setting>=<value>'. Got bogus"),
        (["--backend-config=python,k"], "--backend-config option format is '<backend name>,<setting>=<value>'. "
                                        "Got python,k"),
        (["--backend-config=python,k="], "--backend-config option format is '<backend name>,<setting>=<value>'. "
                                         "Got python,k="),
        (["--backend-config=k=a,b"], "--backend-config option format is '<backend name>,<setting>=<value>'. Got k=a,b"),
        (["--backend-config=,k=v"], "No backend specified. --backend-config option format is "
                                    "<backend name>,<setting>=<value> or <setting>=<value>. Got ,k=v"),
        (["--metrics-config=bogus"], "--metrics-config option format is <setting>=<value>. Got bogus"),
        (["--metrics-config=g,k=v"], "--metrics-config option format is <setting>=<value>. Got g,k=v"),
        (["--metrics-config=k="], "--metrics-config option format is <setting>=<value>. Got k="),
        (["--sagemaker-safe-port-range=abc"], "Cannot parse pair option due to incorrect number of inputs.--<pair "
                                              "option> argument requires format <first>-<second>. Found: abc"),
        (["--sagemaker-safe-port-range=10-x"], "Invalid option value. Got x"),
        (["--sagemaker-safe-port-range=10-"], "Invalid option value. Got "),
    ],
)
def test_structured_values_refused_in_tritonservers_words(capsys, argv, message):
    flag = argv[0].split("=")[0]
    assert refusal(capsys, *argv) == f'Bad option: "{flag}".\n{message}'


@pytest.mark.parametrize(
    "argv, attribute, expected",
    [  # and what it takes
        (["--backend-config=python,k=v=w"], "backend_config", ["python,k=v=w"]),
        (["--backend-config=python,k=a,b"], "backend_config", ["python,k=a,b"]),
        (["--backend-config=k=v"], "backend_config", ["k=v"]),
        (["--metrics-config=summary_quantiles=0.5:0.05,0.9:0.01"], "metrics_config",
         ["summary_quantiles=0.5:0.05,0.9:0.01"]),
        (["--sagemaker-safe-port-range=10-20-30"], "sagemaker_safe_port_range", (10, 20)),
    ],
)
def test_structured_values_taken(argv, attribute, expected):
    assert getattr(parse(*argv), attribute) == expected


@pytest.mark.parametrize(
    "argv, refused",
    [  # a tritonserver flag Kernel does not implement starts only when it asks for the feature's off value
        (["--model-namespacing=false"], None), (["--model-namespacing", "OFF"], None),
        (["--model-namespacing=true"], "--model-namespacing: this tritonserver flag is not supported by Kernel yet"),
        (["--model-namespacing=yes"], 'Bad option: "--model-namespacing".\ninvalid value for bool option: yes'),
        (["--rate-limit=OFF"], None), (["--rate-limit=off"], None),
        (["--rate-limit=execution_count"], "--rate-limit: this tritonserver flag is not supported by Kernel yet"),
        (["--rate-limit-resource=R1:10"], "--rate-limit-resource: this tritonserver flag is not supported by Kernel yet"),
    ],
)
def test_not_yet_flags_take_their_off_value(capsys, argv, refused):
    if refused is None:
        parse(*argv)
    else:
        assert refusal(capsys, *argv) == refused

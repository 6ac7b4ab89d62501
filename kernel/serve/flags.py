"""How `kernel serve` reads its command line: tritonserver's value kinds, words and help groups.

One parser per kind of value (<integer>, <boolean>, <float>, a few structured forms), used by every
flag of that kind, so that a start-up script written for tritonserver 2.51 means the same thing here;
an argparse parser that refuses a command line in tritonserver's words and with its exit status (1);
and the --help layout, in tritonserver's groups, each flag with one line of help and its default.
The flags themselves are listed in kernel/serve/cli.py (build_parser).
"""

from __future__ import annotations

import argparse
import re
import sys

# ---- flag values, read as tritonserver reads them ------------------------------------------
#
# One parser per kind of value (tritonserver's --help names the kind: <integer>, <boolean>,
# <float>, <string>), used by every flag of that kind, so that a start-up script written for
# tritonserver means the same thing here. Measured against tritonserver 2.51; the error texts are
# its own, and `kernel serve` prints them under a `Bad option: "--flag".` line as it does.

_SPACE = "[ \t\n\v\f\r]*"
_STOI = re.compile(_SPACE + r"([+-]?[0-9]+)")
_STOF = re.compile(
    _SPACE + r"([+-]?(?:0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?"
    r"|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?|nan))",
    re.IGNORECASE,
)
_FLOAT32_MAX = 3.4028234663852886e38


def _leading_int(value: str, bits: int) -> int:
    match = _STOI.match(value)
    if match is None:
        raise argparse.ArgumentTypeError(f"Invalid option value. Got {value}")
    number = int(match.group(1))
    if not -(2 ** (bits - 1)) <= number < 2 ** (bits - 1):
        raise argparse.ArgumentTypeError(f"Provided option value is out of bound. Got {value}")
    return number


def parse_int(value: str) -> int:
    """<integer>: C's stoi, as tritonserver reads it: leading white space and a sign, then the
    leading digits, the rest ignored ('7abc' is 7, '1.5' is 1, '0x10' is 0); outside 32 bits refused.
    Boolean words are refused ('Invalid option value. Got true')."""
    return _leading_int(value, 32)


def parse_int64(value: str) -> int:
    """<integer> for byte sizes, which tritonserver reads as 64-bit (--pinned-memory-pool-byte-size)."""
    return _leading_int(value, 64)


def parse_int_text(value: str) -> str:
    """<integer> flags whose value a later stage parses again (the deprecated --trace-rate...)."""
    return str(parse_int(value))


def parse_front_processes(value: str):
    """--front-processes: 'auto' or a count of front processes (kernel.serve.fronts.count)."""
    text = value.strip().lower()
    if text == "auto":
        return "auto"
    count = _leading_int(value, 32)
    if not 1 <= count <= 254:  # link ids are one byte, 0 is the supervisor's (kernel.serve.fronts.count)
        raise argparse.ArgumentTypeError(f"--front-processes must be 'auto' or 1 to 254. Got {value}")
    return count


def parse_float(value: str) -> float:
    """<float>: C's stof, as tritonserver reads it: the leading number ('2000abc' is 2000, '1e3',
    hexadecimal '0x10'); beyond a 32-bit float refused."""
    match = _STOF.match(value)
    if match is None:
        raise argparse.ArgumentTypeError(f"Invalid option value. Got {value}")
    text = match.group(1)
    number = float.fromhex(text) if "x" in text.lower() else float(text)
    if abs(number) > _FLOAT32_MAX and "inf" not in text.lower():
        raise argparse.ArgumentTypeError(f"Provided option value is out of bound. Got {value}")
    return number


def parse_bool(value: str) -> bool:
    """<boolean>: exactly true/on/1 or false/off/0, in any case, nothing around them; 'yes', 'no'
    and ' true' are refused, as tritonserver refuses them."""
    word = value.lower()
    if word in ("true", "on", "1"):
        return True
    if word in ("false", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"invalid value for bool option: {value}")


def parse_verbose_level(value: str) -> int:
    """--log-verbose, the one <integer> flag that also takes true/false (any case): true is level 1,
    false 0; anything else is an <integer>, a negative level meaning 0. (on/yes are refused.)"""
    word = value.lower()
    if word in ("true", "false"):
        return int(word == "true")
    return max(0, parse_int(value))


def choice(flag: str, choices: tuple[str, ...], fold_case: bool = False):
    """<string> flags with a fixed set of values (--model-control-mode is read in any case,
    --log-format exactly); refused with tritonserver's 'invalid argument for <flag>'."""

    def parse(value: str) -> str:
        key = value.lower() if fold_case else value
        for option in choices:
            if key == (option.lower() if fold_case else option):
                return option
        raise argparse.ArgumentTypeError(
            f"invalid argument for {flag} (invalid choice '{value}'; choose from {', '.join(choices)})"
        )

    parse.__name__ = flag.lstrip("-").replace("-", "_")  # argparse names a failing type by it
    return parse


def parse_port_range(value: str) -> tuple[int, int]:
    """<integer>-<integer> (--sagemaker-safe-port-range), each side an <integer>."""
    low, sep, high = value.partition("-")
    if not sep:
        raise argparse.ArgumentTypeError(
            "Cannot parse pair option due to incorrect number of inputs.--<pair option> argument requires format "
            f"<first>-<second>. Found: {value}"
        )
    return parse_int(low), parse_int(high)


def parse_backend_setting(value: str) -> str:
    """--backend-config <backend name>,<setting>=<value>, or a global <setting>=<value>: a name, a
    setting and a value are all needed, as tritonserver refuses ',k=v', 'python,k' and 'k='."""
    comma = value.find(",")
    if comma == 0:
        raise argparse.ArgumentTypeError(
            "No backend specified. --backend-config option format is <backend name>,<setting>=<value> or "
            f"<setting>=<value>. Got {value}"
        )
    key, sep, setting = value[comma + 1:].partition("=")
    if not key or not sep or not setting:
        raise argparse.ArgumentTypeError(
            f"--backend-config option format is '<backend name>,<setting>=<value>'. Got {value}")
    return value


def parse_metrics_setting(value: str) -> str:
    """--metrics-config <setting>=<value>: tritonserver 2.51 takes no group before the setting."""
    key, sep, setting = value.partition("=")
    if not key or not sep or not setting or "," in key:
        raise argparse.ArgumentTypeError(f"--metrics-config option format is <setting>=<value>. Got {value}")
    return value


# The value kind of each tritonserver flag that Kernel accepts without effect or refuses as not
# supported yet: a wrong value is refused as tritonserver refuses it, before anything else.
FLAG_KINDS = {
    "http-thread-count": parse_int, "grpc-infer-thread-count": parse_int, "model-load-thread-count": parse_int,
    "buffer-manager-thread-count": parse_int, "pinned-memory-pool-byte-size": parse_int64,
    "cuda-memory-pool-byte-size": str, "cuda-virtual-address-size": str,
    "min-supported-compute-capability": parse_float,
    "model-load-retry-count": parse_int, "grpc-max-response-pool-size": parse_int,
    "reuse-http-port": parse_bool, "reuse-grpc-port": parse_bool, "enable-peer-access": parse_bool,
    "host-policy": str, "model-load-gpu-limit": str, "repoagent-directory": str,
    "sagemaker-thread-count": parse_int, "vertex-ai-thread-count": parse_int,
    "model-namespacing": parse_bool,
    "cache-directory": str,
    "rate-limit": str, "rate-limit-resource": str, "allow-client-shm": parse_bool,
}

# tritonserver's --help groups, in its order; each flag below is listed under one of them.
HELP_GROUPS = (
    "Server", "Logging", "Model Repository", "HTTP", "GRPC", "Sagemaker", "Vertex", "Metrics", "Tracing",
    "Backend", "Repository Agent", "Response Cache", "Rate Limiter", "Memory/Device Management", "DEPRECATED",
)
FLAG_GROUPS = {
    "http-thread-count": "HTTP", "reuse-http-port": "HTTP", "grpc-infer-thread-count": "GRPC",
    "reuse-grpc-port": "GRPC", "grpc-max-response-pool-size": "GRPC", "model-load-thread-count": "Model Repository",
    "model-load-retry-count": "Model Repository", "enable-peer-access": "Model Repository",
    "model-namespacing": "Model Repository", "allow-gpu-metrics": "Metrics", "sagemaker-thread-count": "Sagemaker",
    "vertex-ai-thread-count": "Vertex", "repoagent-directory": "Repository Agent", "cache-config": "Response Cache",
    "cache-directory": "Response Cache", "rate-limit": "Rate Limiter", "rate-limit-resource": "Rate Limiter",
    "response-cache-byte-size": "DEPRECATED", "allow-client-shm": "Server",
    "grpc-http2-min-recv-ping-interval-without-data": "GRPC", "grpc-http2-max-ping-strikes": "GRPC",
    "grpc-max-connection-age": "GRPC", "grpc-max-connection-age-grace": "GRPC",
}


KIND_NAMES = {parse_int: "<integer>", parse_int64: "<integer>", parse_int_text: "<integer>",
               parse_verbose_level: "<integer>", parse_bool: "<boolean>", parse_float: "<float>"}


def flag_adder(group):
    """group.add_argument, naming a value by its kind as tritonserver's --help does (<integer>...)."""

    def add(*names, **options):
        if "metavar" not in options and options.get("action") not in ("store_true", "version"):
            options["metavar"] = KIND_NAMES.get(options.get("type"), "<string>")
        return group.add_argument(*names, **options)

    return add


class HelpFormatter(argparse.HelpFormatter):
    """One line of help per flag, then its default where it has one (booleans as true/false,
    the words tritonserver's flags take)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if action.nargs == 0 or default in (None, "", []) or default is argparse.SUPPRESS:
            return text
        shown = str(default).lower() if isinstance(default, bool) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


class ArgumentsRefused(SystemExit):
    """A command line `kernel serve` refuses: exit status 1, as tritonserver's; `message` in its
    words, for callers that parse arguments in-process."""

    def __init__(self, message: str):
        super().__init__(1)
        self.message = message


class KernelArgumentParser(argparse.ArgumentParser):
    """argparse, with tritonserver's wording and exit status for a command line it refuses."""

    def error(self, message: str):
        failure = triton_message(message)
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{failure}\n")
        raise ArgumentsRefused(failure)


_ARGUMENT = re.compile(r"argument (-[^/:\s]+)[^:]*: (.*)", re.DOTALL)
_AMBIGUOUS = re.compile(r"ambiguous option: (\S+) could match (.*)")


def triton_message(message: str) -> str:
    """argparse's complaint in tritonserver's words, where tritonserver has words for it."""
    match = _ARGUMENT.fullmatch(message)
    if match:
        flag, problem = match.groups()
        if problem == "expected one argument":
            return f"option '{flag}' requires an argument"
        if problem.startswith("ignored explicit argument"):
            return f"option '{flag}' doesn't allow an argument"
        if problem.startswith("invalid ") and " value: " in problem:  # a type error argparse worded
            problem = f"Invalid option value. Got {problem.split(' value: ', 1)[1].strip(chr(39))}"
        return f'Bad option: "{flag}".\n{problem}'
    match = _AMBIGUOUS.match(message)
    if match:
        options = " ".join(f"'{name.strip()}'" for name in match.group(2).split(","))
        return f"option '{match.group(1)}' is ambiguous; possibilities: {options}"
    if message.startswith("unrecognized arguments: "):
        return f"unrecognized option '{message.split(': ', 1)[1].split(' ')[0]}'"
    return message

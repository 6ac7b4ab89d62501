"""Model names and version strings as model control accepts them, with Triton's messages."""

from __future__ import annotations

from kernel.core.errors import ErrorCode, KernelError

# Characters a shell gives a meaning to; a model name is never handed to a
# shell, but a name made of them is a mistake or an attack, not a model.
_SHELL_CHARACTERS = frozenset(";&|$`<>()*?!'\"[]{}~#")
INVALID_STUB_NAME = "Invalid stub name: contains invalid characters"
_NAME_MAX = 255  # bytes in one path component (Linux NAME_MAX)


def validate_model_name(name: str) -> None:
    """Refuse a model name that could not be a model folder of a repository (KernelError INVALID_ARG)."""
    stripped = name.strip()
    if not stripped:
        raise KernelError(ErrorCode.INVALID_ARG, "Model name cannot be empty. Please enter a valid name to deploy.")
    shown = printable(name)
    if stripped in (".", "..") or "/" in name or "\\" in name:
        raise KernelError(
            ErrorCode.INVALID_ARG,
            f"invalid model name '{shown}', model name must not contain path traversal characters",
        )
    if any(not c.isprintable() or c.isspace() or c in _SHELL_CHARACTERS for c in name):
        # tritonserver's Python backend refuses such a name (it becomes the stub's name) in these
        # words, and scripts match them; 2.51 itself hangs on the load instead.
        raise KernelError(ErrorCode.INVALID_ARG, INVALID_STUB_NAME)
    if len(name.encode("utf-8", "surrogatepass")) > _NAME_MAX:
        raise KernelError(
            ErrorCode.INVALID_ARG, f"invalid model name '{shown[:64]}...', model name is longer than {_NAME_MAX} bytes"
        )


def parse_version(version: str) -> str:
    """A pb_utils.is_model_ready version string, checked as Triton's Python backend checks it."""
    if not version:
        return ""
    try:
        number = int(version)
    except ValueError:
        raise KernelError(
            ErrorCode.INVALID_ARG,
            f"failed to get model version from specified version string '{version}' (details: stol), "
            "version should be an integral value > 0",
        ) from None
    if number < 0:
        raise KernelError(
            ErrorCode.INVALID_ARG,
            f"failed to get model version from specified version string '{version}', "
            "version should be an integral value > 0",
        )
    return str(number)


def printable(text: str) -> str:
    """Text for an error message or log line, with control characters escaped."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)

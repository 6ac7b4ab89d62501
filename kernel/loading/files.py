"""The file side of model control: change detection and load-time override folders.

`fingerprint` says what a model folder holds (path, mtime, size of every file),
so poll mode and repeated load requests reload only what changed.
`write_override_folder` turns a load request's `config` and `file:<path>`
parameters into a model folder of its own, inside a fresh temporary folder
that nothing in the request can write outside of.

Both do blocking file I/O: callers run them in a thread, never on the event loop.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from google.protobuf import text_format

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.backend import FILE_PREFIX
from kernel.loading.names import printable
from kernel.loading.repository import CONFIG_FILENAME, ModelDir


# Written by Python itself when a worker imports model.py: not a change to the model.
_IGNORED = frozenset({"__pycache__"})

Stamp = tuple  # ((relative path, mtime_ns, size), ...) sorted


@dataclass(frozen=True)
class Fingerprint:
    """What a model folder held when it was looked at."""

    config: Stamp  # the config file the model is read from
    other: Stamp  # every other file outside the version folders (labels, ...)
    versions: tuple[tuple[int, Stamp], ...]  # (version, stamp of its folder)

    def version(self, version: int) -> Stamp | None:
        return dict(self.versions).get(version)

    def same_version(self, other: "Fingerprint", version: int) -> bool:
        """Nothing a version depends on changed, apart from the config file (compared parsed)."""
        return self.other == other.other and self.version(version) == other.version(version)


def fingerprint(md: ModelDir) -> Fingerprint:
    """Fingerprint a model folder. Raises OSError when it cannot be read (e.g. it vanished)."""
    root = md.path
    version_dirs = {p.name: v for v, p in md.versions.items()}
    config = _stamp(md.config_path, root) if md.config_path is not None else ()
    config_rel = os.path.relpath(md.config_path, root) if md.config_path is not None else None
    other: list = []
    versions: dict[int, list] = {v: [] for v in md.versions}
    for child in sorted(os.scandir(root), key=lambda e: e.name):
        if child.name in _IGNORED:
            continue
        target = versions[version_dirs[child.name]] if child.name in version_dirs else other
        target.extend(_walk(Path(child.path), root))
    other = [item for item in other if item[0] != config_rel]
    return Fingerprint(
        config=config,
        other=tuple(sorted(other)),
        versions=tuple(sorted((v, tuple(sorted(items))) for v, items in versions.items())),
    )


def _stamp(path: Path, root: Path) -> Stamp:
    st = path.stat()
    return ((os.path.relpath(path, root), st.st_mtime_ns, st.st_size),)


def _walk(path: Path, root: Path) -> list:
    items = [(os.path.relpath(path, root), *_mtime_size(path))]
    if path.is_dir() and not path.is_symlink():
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if d not in _IGNORED)
            for name in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, name)
                items.append((os.path.relpath(full, root), *_mtime_size(Path(full))))
    return items


def _mtime_size(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()  # follows symlinks: a changed target is a changed model
    except FileNotFoundError:  # a dangling link
        st = path.lstat()
    return st.st_mtime_ns, st.st_size


# ---- override folders --------------------------------------------------------


# Bounds on what one load request may create: a request is held to --http-max-input-size in bytes,
# but 2,000 nested folders in a few kilobytes once made every recursive walk fail (RecursionError)
# and left the temporary folder behind.
MAX_OVERRIDE_FILES = 4096
MAX_OVERRIDE_DEPTH = 32  # folders between the model folder and a file


def write_override_folder(model_name: str, config, files: dict[str, bytes]) -> Path:
    """A new model folder `<fresh temporary folder>/<model_name>` with `files` and config.pbtxt.

    `files` maps "file:<relative path>" to contents (leading slashes are
    dropped, as tritonserver does). A path that leaves the model folder once normalized, or too many files or
    folders too deep, is refused (KernelError INVALID_ARG) and nothing is left
    behind. `model_name` must already be validated (no path separators). The
    caller deletes the temporary folder (the returned folder's parent) when the
    model no longer uses it.
    """
    if len(files) > MAX_OVERRIDE_FILES:
        raise _invalid(f"a model load request may carry at most {MAX_OVERRIDE_FILES} files, got {len(files)}")
    root = Path(tempfile.mkdtemp(prefix="kernel-model-"))
    try:
        folder = root / model_name
        folder.mkdir()
        base = os.path.realpath(folder)
        for key, content in files.items():
            _write_file(base, key, content)
        # The `config` parameter wins over a "file:config.pbtxt".
        _write_new(os.path.join(base, CONFIG_FILENAME), text_format.MessageToString(config).encode(), key="config")
        return folder
    except BaseException:
        remove_tree(root)
        raise


def remove_override_folder(folder: Path) -> None:
    """Delete what write_override_folder made for `folder`."""
    root = folder.parent
    if root.name.startswith("kernel-model-"):
        remove_tree(root)


def remove_tree(root) -> None:
    """Delete a folder and all it holds, however deep, without recursion and never through a link.

    Why not shutil.rmtree: it recurses once per folder level, so a deep enough tree
    raises RecursionError (which ignore_errors does not cover) and stays on disk.
    """
    stack = [(os.fspath(root), False)]
    while stack:
        path, emptied = stack.pop()
        if emptied:
            _quietly(os.rmdir, path)
            continue
        stack.append((path, True))
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir:
                stack.append((entry.path, False))
            else:
                _quietly(os.unlink, entry.path)


def _quietly(operation, path: str) -> None:
    try:
        operation(path)
    except OSError:
        pass


def _invalid(message: str) -> KernelError:
    return KernelError(ErrorCode.INVALID_ARG, message)


def _write_file(base: str, key: str, content: bytes) -> None:
    # tritonserver reads "file:/1/model.py" (any number of leading slashes) as relative to the
    # model folder, and clients written against it send such keys: strip them the same way.
    relative = key[len(FILE_PREFIX):].lstrip("/")
    if not relative or "\0" in relative:
        raise _invalid(f"Invalid file parameter '{printable(key)}': expected 'file:<path relative to the model directory>'")
    target = os.path.normpath(os.path.join(base, relative))
    if target == base or os.path.commonpath([target, base]) != base:
        raise _invalid(
            f"Invalid file parameter '{printable(key)}' with normalized path '{printable(target)}' "
            "must stay within model directory."
        )
    depth = os.path.relpath(target, base).count(os.sep)
    if depth > MAX_OVERRIDE_DEPTH:
        raise _invalid(
            f"Invalid file parameter '{printable(key)[:200]}': {depth} folders deep, the most a model file "
            f"may be is {MAX_OVERRIDE_DEPTH}"
        )
    _make_parents(base, os.path.dirname(target), key)
    _write_new(target, content, key)


def _make_parents(base: str, directory: str, key: str) -> None:
    """Create the folders between `base` and `directory`, refusing anything that is not a plain folder."""
    current = base
    for part in os.path.relpath(directory, base).split(os.sep):
        if part in ("", "."):
            continue
        current = os.path.join(current, part)
        try:
            os.mkdir(current, 0o700)
        except FileExistsError:
            if os.path.islink(current) or not os.path.isdir(current):
                raise _invalid(f"Invalid file parameter '{printable(key)}', directory has been created as a file") from None


def _write_new(path: str, content: bytes, key: str) -> None:
    # O_NOFOLLOW: never write through a link, whatever is at `path`.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except IsADirectoryError:
        raise _invalid(f"Invalid file parameter '{printable(key)}', a directory has the same path") from None
    except OSError as exc:
        raise _invalid(f"Invalid file parameter '{printable(key)}': {exc.strerror}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(content)


def fingerprint_or_none(md: ModelDir) -> Optional[Fingerprint]:
    try:
        return fingerprint(md)
    except OSError:
        return None


def fingerprints(dirs: dict[str, ModelDir]) -> dict[str, Optional[Fingerprint]]:
    return {name: fingerprint_or_none(md) for name, md in dirs.items()}

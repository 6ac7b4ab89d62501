"""Unpacks execution-environment tarballs (conda-pack archives) safely, once.

An archive is unpacked into `<cache>/<sha256 of its bytes>/`, so:

* a restart finds the environment already there (the hash of an archive whose
  size, mtime and inode have not changed is remembered in `<cache>/index/`, so
  it is not even re-read);
* models naming the same archive (or copies of it at other paths) share one
  extraction;
* an archive that changes gets a fresh directory.

Hostile archives are refused before anything lands outside the destination:
members with absolute names or `..` components, device files and FIFOs, links
whose target is absolute or leaves the destination, and members written
through a link. Extraction happens in a private temporary directory that is
renamed into place only when complete and checked, so a refused or interrupted
archive never leaves a half-made environment behind.

Everything here is blocking; callers run it in a thread.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tarfile
import uuid
from pathlib import Path

_CHUNK = 1 << 20


class UnsafeArchive(Exception):
    """The archive tries to write (or point) outside its destination, or holds special files."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kernel" / "python-execution-envs"


def content_hash(archive: Path, cache_dir: Path) -> str:
    """sha256 of the archive's bytes, remembered per (path, size, mtime, inode)."""
    st = archive.stat()
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "dev": st.st_dev}
    index = cache_dir / "index" / (hashlib.sha256(str(archive).encode()).hexdigest()[:32] + ".json")
    try:
        known = json.loads(index.read_text())
        if known.get("stamp") == stamp and isinstance(known.get("sha256"), str):
            return known["sha256"]
    except (OSError, ValueError):
        pass
    digest = hashlib.sha256()
    with open(archive, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    value = digest.hexdigest()
    try:
        index.parent.mkdir(parents=True, exist_ok=True)
        tmp = index.with_name(f".{index.name}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps({"archive": str(archive), "stamp": stamp, "sha256": value}))
        os.replace(tmp, index)
    except OSError:
        pass  # a read-only cache still works, only slower
    return value


def unpack_cached(archive: Path, cache_dir: Path) -> tuple[Path, bool]:
    """The directory holding `archive` unpacked, and whether this call unpacked it.

    Raises UnsafeArchive for hostile archives and tarfile.TarError/OSError for
    unreadable ones.
    """
    archive = Path(os.path.realpath(archive))
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = content_hash(archive, cache_dir)[:40]
    final = cache_dir / key
    if final.is_dir():
        return final, False
    # One process unpacks a given archive at a time; the others wait and reuse it.
    with open(cache_dir / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir():
            return final, False
        for stale in cache_dir.glob(f".{key}.*.partial"):  # left by a process that died unpacking
            shutil.rmtree(stale, ignore_errors=True)
        staging = cache_dir / f".{key}.{uuid.uuid4().hex}.partial"
        staging.mkdir()
        try:
            extract(archive, staging)
            os.rename(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return final, True


# ---- safe extraction ----------------------------------------------------------


def _member_path(name: str) -> str:
    """The member's path relative to the destination; UnsafeArchive if it has none."""
    if "\0" in name:
        raise UnsafeArchive(f"member {name!r} has a NUL byte in its name")
    # libarchive's words, which Triton's Python backend logs for these (and its QA looks for)
    if name.startswith("/") or name.startswith("\\"):
        raise UnsafeArchive(f"member '{name}': Path is absolute")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(f"member '{name}': Path contains '..'")
    return "/".join(parts)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def check_member(m: tarfile.TarInfo) -> str:
    """Everything that can be judged from the member alone; its path relative to the destination."""
    rel = _member_path(m.name)
    if m.isdev() or m.isfifo():
        raise UnsafeArchive(f"member '{m.name}' is a device file or FIFO")
    if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
        raise UnsafeArchive(f"member '{m.name}' has an unsupported type {m.type!r}")
    if m.issym():
        target = m.linkname
        if target.startswith("/"):
            raise UnsafeArchive(f"symlink '{m.name}' points to the absolute path '{target}'")
        resolved = os.path.normpath(os.path.join(os.path.dirname(rel), target))
        if resolved == ".." or resolved.startswith("../"):
            raise UnsafeArchive(f"symlink '{m.name}' -> '{target}' points outside the archive")
    elif m.islnk():
        try:
            _member_path(m.linkname)
        except UnsafeArchive:
            raise UnsafeArchive(f"hard link '{m.name}' -> '{m.linkname}' points outside the archive") from None
    if not rel and not m.isdir():
        raise UnsafeArchive(f"member '{m.name}' would replace the destination itself")
    return rel


def extract(archive: Path, dest: Path) -> None:
    """Unpack `archive` into the (empty, existing) directory `dest`, refusing hostile members.

    One sequential pass (a compressed archive is never re-read from the start);
    a refusal part-way leaves only files inside `dest`, which the caller removes.
    """
    root = os.path.realpath(dest)
    dir_modes: list[tuple[str, int]] = []
    with tarfile.open(archive, "r|*") as tf:
        for m in tf:
            rel = check_member(m)
            if not rel:
                continue  # the archive's own root directory
            target = os.path.join(root, rel)
            parent = os.path.dirname(target)
            # The parent must really be inside the destination: an earlier member
            # may have made one of its components a link.
            if not _inside(os.path.realpath(parent), root):
                raise UnsafeArchive(f"member '{m.name}' would be written through a link that leaves the archive")
            os.makedirs(parent, exist_ok=True)
            if m.isdir():
                if os.path.islink(target) or (os.path.lexists(target) and not os.path.isdir(target)):
                    os.unlink(target)
                os.makedirs(target, exist_ok=True)
                dir_modes.append((target, (m.mode & 0o755) | 0o700))
                continue
            if os.path.lexists(target):
                if os.path.isdir(target) and not os.path.islink(target):
                    raise UnsafeArchive(f"member '{m.name}' would replace a directory")
                os.unlink(target)
            if m.issym():
                os.symlink(m.linkname, target)
            elif m.islnk():
                source = os.path.join(root, _member_path(m.linkname))
                if not _inside(os.path.realpath(source), root) or not os.path.isfile(source):
                    raise UnsafeArchive(f"hard link '{m.name}' -> '{m.linkname}' does not name a file of the archive")
                try:
                    os.link(source, target, follow_symlinks=False)
                except OSError:
                    shutil.copy2(source, target, follow_symlinks=False)
            else:
                _write_file(tf, m, target)
    for path, mode in reversed(dir_modes):
        os.chmod(path, mode)
    _check_links(root)


def _write_file(tf: tarfile.TarFile, m: tarfile.TarInfo, target: str) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    mode = (m.mode & 0o755) | 0o600  # no setuid/setgid/sticky, no group/other write
    fd = os.open(target, flags, mode)
    try:
        src = tf.extractfile(m)
        with os.fdopen(fd, "wb", closefd=False) as out:
            if src is not None:
                shutil.copyfileobj(src, out, _CHUNK)
        os.fchmod(fd, mode)
        # Keep mtimes: cached bytecode in the archive is validated against them.
        os.utime(fd, (m.mtime, m.mtime))
    finally:
        os.close(fd)


def _check_links(root: str) -> None:
    """After the fact: every link in the tree resolves inside it (chains included)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) and not _inside(os.path.realpath(path), root):
                rel = os.path.relpath(path, root)
                raise UnsafeArchive(f"symlink '{rel}' -> '{os.readlink(path)}' resolves outside the archive")

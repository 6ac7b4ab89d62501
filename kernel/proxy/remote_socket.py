"""Where a server's remote-binding socket is, and who may be at the other end of it.

A binding process (kernel.triton.RemoteTriton) sends its models' configs over this socket and
answers their inference calls, so it must reach its own user's server and nobody else's; the
server in turn must take bindings from that user only. Other users on the host may be hostile:
they can create any name under /tmp before we do, and listen on a port our server is not using.

The socket of the server whose HTTP or gRPC port is P is `<folder>/P.sock`, in the first of these
folders that is private (a real folder, not a link, owned by this uid, closed to group and others):

1. `$XDG_RUNTIME_DIR/kernel-remote` (and `/run/user/<uid>/kernel-remote`): the per-user runtime
   folder of a login session, which other users cannot create;
2. `/tmp/kernel-remote-<uid>`, created with mode 0700 when missing;
3. when another user took that name first (or it is a file, a link, or open to others): a fresh
   folder `/tmp/kernel-remote-<uid>-<random>` made by mkdtemp, whose name nobody can take first.

So a squatted name never stops a server from starting. A binding process looks in the same
places, the random ones by listing /tmp, and skips every folder that is not private. Folders are
only a first filter: both ends also check the peer's uid on the connected socket (SO_PEERCRED),
the server before it reads a frame, the binding process before it sends one.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import struct
import tempfile
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

log = logging.getLogger("kernel.remote")

# Module attributes rather than literals so a test can point them at its own tmp_path.
SHARED_TMP = Path("/tmp")  # not $TMPDIR: server and binder may see different environments
RUN_USER = Path("/run/user")  # systemd's runtime folders, for a binder whose XDG_RUNTIME_DIR is unset
FOLDER_NAME = "kernel-remote"
_MAX_PATH = 107  # sun_path holds 108 bytes with the terminating NUL


class UnsafeFolder(PermissionError):
    """A folder that may hold the socket is not private to this user."""


class PeerRefused(PermissionError):
    """The process at the other end of a binding socket runs as another user."""


def problem(folder: Path, uid: Optional[int] = None) -> Optional[str]:
    """Why `folder` may not hold a binding socket of `uid` (None: it may). Never follows a link."""
    uid = os.getuid() if uid is None else uid
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be examined ({exc.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if info.st_uid != uid:
        return f"belongs to uid {info.st_uid}, not {uid}"
    if info.st_mode & 0o077:
        return f"is open to group or others (mode {oct(info.st_mode & 0o777)}; 0700 is required)"
    return None


def _fits(folder: Path) -> bool:
    return len(os.fsencode(str(folder / "65535.sock"))) <= _MAX_PATH


def _runtime_folders(uid: int) -> List[Path]:
    """kernel-remote inside each private per-user runtime folder, $XDG_RUNTIME_DIR's first."""
    parents = []
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        parents.append(Path(xdg))
    parents.append(RUN_USER / str(uid))
    folders = []
    for parent in dict.fromkeys(parents):
        if problem(parent, uid) is None and _fits(parent / FOLDER_NAME):
            folders.append(parent / FOLDER_NAME)
    return folders


def shared_folder(uid: Optional[int] = None) -> Path:
    """The well-known folder under /tmp (anyone may create this name first; see fallback_folders)."""
    return SHARED_TMP / f"{FOLDER_NAME}-{os.getuid() if uid is None else uid}"


def fallback_folders(uid: Optional[int] = None) -> Iterator[Path]:
    """The fresh folders servers made because the shared one was taken; private ones only."""
    uid = os.getuid() if uid is None else uid
    prefix = f"{FOLDER_NAME}-{uid}-"
    try:
        names = sorted(os.listdir(SHARED_TMP))
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            folder = SHARED_TMP / name
            if problem(folder, uid) is None:
                yield folder


def server_folder() -> Tuple[Path, bool]:
    """The private folder a starting server puts its socket in, created if needed, and whether it is a
    fresh one (to remove when the server stops). Never fails because of another user."""
    uid = os.getuid()
    for folder in [*_runtime_folders(uid), shared_folder(uid)]:
        if not _fits(folder):
            continue
        try:
            os.mkdir(folder, 0o700)  # umask can only narrow it
        except FileExistsError:
            pass
        except OSError as exc:
            log.debug("remote binding: cannot create %s: %s", folder, exc)
            continue
        wrong = problem(folder, uid)
        if wrong is None:
            return folder, False
        log.warning("Remote binding: %s %s, so the socket does not go there", folder, wrong)
    fresh = Path(tempfile.mkdtemp(prefix=f"{FOLDER_NAME}-{uid}-", dir=SHARED_TMP))  # mode 0700, random name
    wrong = problem(fresh, uid) or (None if _fits(fresh) else "is too long a path for a Unix socket in it")
    if wrong is not None:  # not unless /tmp itself is hostile (or SHARED_TMP is very deep)
        os.rmdir(fresh)
        raise UnsafeFolder(f"the folder made for the remote-binding socket, {fresh}, {wrong}")
    log.warning("Remote binding: the socket goes to the fresh private folder %s instead (RemoteTriton looks "
                "there too)", fresh)
    return fresh, True


def socket_name(port: int) -> str:
    return f"{int(port)}.sock"


def candidate_sockets(port: int) -> List[Path]:
    """Every existing socket path a server of this user with HTTP or gRPC port `port` may listen on,
    in the order servers choose their folder; folders that are not private are skipped."""
    uid = os.getuid()
    found = []
    shared = shared_folder(uid)
    folders = [*_runtime_folders(uid), *([shared] if problem(shared, uid) is None else []), *fallback_folders(uid)]
    for folder in folders:
        path = folder / socket_name(port)
        if os.path.lexists(path):
            found.append(path)
    return found


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket (as it was at connect)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def check_peer(sock: socket.socket, uid: Optional[int] = None, where: str = "the remote-binding socket") -> None:
    """Raise PeerRefused unless the process at the other end of `sock` runs as `uid` (default: ours)."""
    uid = os.getuid() if uid is None else uid
    try:
        peer = peer_uid(sock)
    except OSError as exc:
        raise PeerRefused(f"the user at the other end of {where} cannot be told ({exc.strerror})") from None
    if peer != uid:
        raise PeerRefused(f"the process at the other end of {where} runs as uid {peer}, not uid {uid}")

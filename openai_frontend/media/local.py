"""Local media files: regular files under the media root, and nothing else.

Owns: ``local_components`` (pure: a user path -> its components below the root, or refusal) and
``read_local_file`` (blocking: open and read one file; run it in a worker thread).

How escapes are closed:

* syntax first, without touching the disk: NUL, ``..`` anywhere, and absolute paths outside the
  root are refused; no percent-decoding happens, so ``%2e%2e`` is just an odd file name;
* the root is opened as a directory, then every component with ``openat`` relative to its parent
  and ``O_NOFOLLOW`` (directories also ``O_DIRECTORY``): a symlink anywhere below the root fails
  the open itself, so swapping a component for a link after any check has nothing to race;
* the file is opened ``O_NONBLOCK`` (a FIFO without a writer must not hang the worker) and judged
  by ``fstat`` of the opened descriptor: only a regular file with one link (a hard link may point
  at a file outside the root) and a size within the cap is read, and reading stops at cap + 1
  bytes in case it grows.

The root itself may be a symlink: it is the operator's configuration, not user input.
"""

from __future__ import annotations

import errno
import os
import stat

from openai_frontend.media.errors import MediaError, MediaFailure, too_large

MAX_PATH_CHARS = 4096
READ_BLOCK = 1024 * 1024
_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def local_components(path: str, root: str) -> tuple[str, ...]:
    """The components of ``path`` below ``root`` (``path`` relative to the root, or absolute inside it)."""
    if not path or len(path) > MAX_PATH_CHARS or "\x00" in path:
        raise MediaError(MediaFailure.INVALID_REFERENCE, "empty, over-long or NUL in local path")
    parts = path.split("/")
    if ".." in parts:
        raise MediaError(MediaFailure.NOT_ALLOWED, f"'..' in local path {path!r}")
    components = tuple(part for part in parts if part not in ("", "."))
    if path.startswith("/"):
        root_parts = tuple(part for part in os.path.normpath(root).split("/") if part)
        if components[: len(root_parts)] != root_parts:
            raise MediaError(MediaFailure.NOT_ALLOWED, f"absolute path {path!r} outside the media root")
        components = components[len(root_parts) :]
    if not components:
        raise MediaError(MediaFailure.INVALID_REFERENCE, f"local path {path!r} names no file")
    return components


def _read_capped(fd: int, cap: int) -> bytes:
    data = bytearray()
    while len(data) <= cap:
        chunk = os.read(fd, min(READ_BLOCK, cap + 1 - len(data)))
        if not chunk:
            return bytes(data)
        data += chunk
    raise too_large(cap, f"local file grew past {cap} bytes while read")


def _check_opened(fd: int, cap: int, shown: str) -> None:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise MediaError(MediaFailure.UNAVAILABLE, f"{shown} is not a regular file (mode {info.st_mode:o})")
    if info.st_nlink != 1:
        raise MediaError(MediaFailure.UNAVAILABLE, f"{shown} has {info.st_nlink} hard links")
    if info.st_size > cap:
        raise too_large(cap, f"{shown} is {info.st_size} bytes")


def read_local_file(components: tuple[str, ...], root: str, cap: int) -> bytes:
    """The bytes of the file at ``components`` below ``root``; blocking, so run in a worker thread."""
    shown = "/".join(components)  # relative to the root: for the log only
    fds: list[int] = []
    try:
        fds.append(os.open(root, _ROOT_FLAGS))
        for name in components[:-1]:
            fds.append(os.open(name, _DIR_FLAGS, dir_fd=fds[-1]))
        fds.append(os.open(components[-1], _FILE_FLAGS, dir_fd=fds[-1]))
        _check_opened(fds[-1], cap, shown)
        return _read_capped(fds[-1], cap)
    except OSError as exc:
        reason = errno.errorcode.get(exc.errno or 0, "error")
        raise MediaError(MediaFailure.UNAVAILABLE, f"{shown}: {reason}") from exc
    finally:
        for fd in reversed(fds):
            os.close(fd)

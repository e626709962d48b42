"""Creating and opening gatherwise's shared-memory files so that nobody else can own, redirect or block them.

Stdlib only (both sides use it). The rules, and why:

* `shm_dir` and every engine directory are created 0700 and must be a real directory (not a symlink) owned by
  this user (or root) and writable by nobody else: whoever can write a directory can replace the files in it,
  so a directory another user owns or can write would let that user feed the engine a control block of their
  own or swap a ring for a link to any file.
* Files are created 0600 with O_CREAT|O_EXCL|O_NOFOLLOW under a fresh temporary name, then renamed into place:
  an existing file or a planted symlink is never opened for writing, and readers never see a half-built file.
  The permission bits hold at any umask (umask only removes bits).
* Readers open with O_NOFOLLOW|O_NONBLOCK and accept only regular files: a symlink, a FIFO (whose open would
  block a reader forever) or a device is refused instead of read.
"""

from __future__ import annotations

import errno
import os
import stat

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

_READ_CHUNK = 1 << 16  # bytes per read() of a small file


class UnsafePathError(PermissionError):
    """A directory or file gatherwise would use is not private to this user (or not what it should be)."""


def _trusted_owner(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def check_private_dir(path: str | os.PathLike, st: os.stat_result | None = None) -> None:
    """Raise UnsafePathError unless `path` is a directory (not a symlink) owned by this user or root and not
    writable by group or others."""
    path = os.fspath(path)
    st = os.lstat(path) if st is None else st
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"{path}: is a symlink; gatherwise only uses real directories here")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{path}: not a directory")
    if not _trusted_owner(st.st_uid):
        raise UnsafePathError(f"{path}: owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}): another "
                              f"user could replace the files in it; remove it or choose another engine.shm_dir")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePathError(f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets other users write into it; "
                              f"run `chmod go-w {path}` or choose another engine.shm_dir")


def ensure_private_dir(path: str | os.PathLike) -> str:
    """Create `path` 0700 (parents too) unless it exists, then check it is private. Returns the path."""
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        os.makedirs(parent, PRIVATE_DIR_MODE, exist_ok=True)
    try:
        os.mkdir(path, PRIVATE_DIR_MODE)
    except FileExistsError:
        pass
    check_private_dir(path)
    return path


def temporary_name(path: str | os.PathLike) -> str:
    """A fresh sibling name for building `path` before renaming it into place (unique per process and call)."""
    return f"{os.fspath(path)}.tmp-{os.getpid()}-{os.urandom(6).hex()}"


def create_private_file(path: str | os.PathLike) -> int:
    """A new 0600 file opened read-write; fails if anything (a file, a symlink, a FIFO) already has the name."""
    return os.open(os.fspath(path), _CREATE, PRIVATE_FILE_MODE)


def write_private_file(path: str | os.PathLike, data: bytes) -> None:
    """Replace `path` atomically with a 0600 file holding `data`; never follows or writes through a link."""
    path = os.fspath(path)
    tmp = temporary_name(path)
    fd = create_private_file(tmp)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)  # rename replaces a planted symlink itself, never its target
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def open_regular_file(path: str | os.PathLike, flags: int = os.O_RDONLY) -> int:
    """Open without following a symlink and without blocking on a FIFO; raise UnsafePathError unless the result
    is a regular file. The caller owns the returned descriptor."""
    path = os.fspath(path)
    try:
        fd = os.open(path, flags | _OPEN)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise UnsafePathError(f"{path}: is a symlink; gatherwise does not follow links here") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafePathError(f"{path}: not a regular file (mode {mode:o}); ignored")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_small_file(path: str | os.PathLike, limit: int) -> bytes:
    """The content of a regular file of at most `limit` bytes (ValueError beyond), opened as above."""
    fd = open_regular_file(path)
    try:
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, _READ_CHUNK)
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            if total > limit:
                raise ValueError(f"{os.fspath(path)}: larger than {limit} bytes")
            chunks.append(chunk)
    finally:
        os.close(fd)

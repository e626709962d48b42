"""Creating and opening gatherwise's shared-memory files so that nobody else can own, redirect or block them.

Stdlib only (both sides use it). The rules, and why:

* `shm_dir` and every engine directory are created 0700 and must be a real directory (not a symlink) owned by
  this user (or root) and writable by nobody else: whoever can write a directory can replace the files in it,
  so a directory another user owns or can write would let that user feed the engine a control block of their
  own or swap a ring for a link to any file.
* The path to `shm_dir` is walked one component at a time from `/` (openat with O_NOFOLLOW|O_DIRECTORY), and
  missing components are created 0700 the same way: a symlink on the way is followed only if root or this user
  owns it and nobody else can replace it, and a directory on the way must belong to root or this user; so
  another user can redirect no component of the path, not only its last one.
* A reader running as root (a sidecar for an engine of another user) accepts a private directory of any one
  owner and, inside it, only files that owner owns: root trusts that user's files as much as the engine does,
  and never a file of somebody else linked into the directory.
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


MAX_SYMLINKS = 40  # links followed while walking one path (the kernel's own limit)


class UnwritableDirError(OSError):
    """A directory gatherwise must create files in is on a read-only filesystem or not writable by this user."""


def _trusted_owner(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def _others_can_write(st: os.stat_result) -> bool:
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def check_private_dir(path: str | os.PathLike[str], st: os.stat_result | None = None, *, reader: bool = False) -> None:
    """Raise UnsafePathError unless `path` is a directory (not a symlink) owned by this user or root and not
    writable by group or others. `reader`: the caller only reads engines' files and writes into files they made;
    as root it accepts a directory of any owner (see the module docstring)."""
    path = os.fspath(path)
    st = os.lstat(path) if st is None else st
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"{path}: is a symlink; gatherwise only uses real directories here")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{path}: not a directory")
    if not _trusted_owner(st.st_uid) and not (reader and os.geteuid() == 0):
        raise UnsafePathError(f"{path}: owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}): another "
                              f"user could replace the files in it; remove it or choose another engine.shm_dir")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePathError(f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets other users write into it; "
                              f"run `chmod go-w {path}` or choose another engine.shm_dir")


def _step(parent: int, name: str, where: str, create: bool,
          owners: frozenset[int]) -> tuple[os.stat_result, str | None]:
    """lstat `name` in the directory `parent` (creating it 0700 if missing and `create`); the link's target when
    it is a symlink that is safe to follow (owned by one of `owners`). `where` names the component in errors."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(name, PRIVATE_DIR_MODE, dir_fd=parent)
        except FileExistsError:
            pass
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if not stat.S_ISLNK(st.st_mode):
        return st, None
    parent_st = os.fstat(parent)
    if st.st_uid not in owners:
        raise UnsafePathError(f"{where}: is a symlink owned by uid {st.st_uid}: another user could point it "
                              f"anywhere; gatherwise follows only links of root or this user")
    if _others_can_write(parent_st) and not parent_st.st_mode & stat.S_ISVTX:
        raise UnsafePathError(f"{where}: is a symlink in a directory other users can write (mode "
                              f"{stat.S_IMODE(parent_st.st_mode):04o}): they could replace it; use the real path")
    return st, os.readlink(name, dir_fd=parent)


def _open_dir_path(path: str, create: bool, owners: frozenset[int] | None = None) -> int:
    """A descriptor of directory `path`, walked one component at a time from `/` without following any link
    the checks in _step refuse; every directory on the way belongs to one of `owners` (root and this user unless
    given). The caller closes it."""
    owners = frozenset((os.geteuid(), 0)) if owners is None else owners
    todo = [part for part in path.split("/") if part]
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    walked, links = "", 0
    try:
        while todo:
            name = todo.pop(0)
            if name == ".":
                continue
            where = f"{walked}/{name}"
            st, target = _step(fd, name, where, create, owners)
            if target is not None:
                links += 1
                if links > MAX_SYMLINKS:
                    raise UnsafePathError(f"{path}: more than {MAX_SYMLINKS} symlinks on the way")
                todo[:0] = [part for part in target.split("/") if part]
                if target.startswith("/"):
                    os.close(fd)
                    fd, walked = -1, ""
                    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafePathError(f"{where}: not a directory")
            if st.st_uid not in owners:
                raise UnsafePathError(f"{where}: owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}) or "
                                      f"root: that user could replace what lies below it; choose another "
                                      f"engine.shm_dir")
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd, walked = child, os.path.normpath(where) if name == ".." else where
        return fd
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise


def ensure_private_dir(path: str | os.PathLike[str]) -> str:
    """Create `path` 0700 (missing parents too, each 0700) unless it exists, then check it is private and
    writable. Every component of the path is walked as described in the module docstring. Returns the path."""
    path = os.fspath(path)
    absolute = os.path.abspath(path)
    name = os.path.basename(absolute)
    parent = _open_dir_path(os.path.dirname(absolute), create=True)
    try:
        try:
            os.mkdir(name, PRIVATE_DIR_MODE, dir_fd=parent)
        except FileExistsError:
            pass
        check_private_dir(path, os.stat(name, dir_fd=parent, follow_symlinks=False))
        if not os.access(name, os.W_OK | os.X_OK, dir_fd=parent, effective_ids=True):
            target = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            try:
                read_only = os.fstatvfs(target).f_flag & os.ST_RDONLY
            finally:
                os.close(target)
            problem = "is on a read-only filesystem" if read_only else "is not writable by this user"
            raise UnwritableDirError(f"{path}: {problem}; gatherwise creates its files there: choose another "
                                     f"engine.shm_dir")
    finally:
        os.close(parent)
    return path


def check_shm_dir_for_reading(path: str | os.PathLike[str]) -> None:
    """What a reader (the sidecar) requires of `shm_dir`: check_private_dir(reader=True), and every component of
    its path walked as the engine walks it, where a reader running as root also accepts directories of the
    user who owns `shm_dir`. FileNotFoundError while no engine created it yet."""
    path = os.path.abspath(os.fspath(path))
    st = os.lstat(path)
    check_private_dir(path, st, reader=True)
    os.close(_open_dir_path(os.path.dirname(path), create=False,
                            owners=frozenset((os.geteuid(), 0, st.st_uid if os.geteuid() == 0 else 0))))


def temporary_name(path: str | os.PathLike[str]) -> str:
    """A fresh sibling name for building `path` before renaming it into place (unique per process and call)."""
    return f"{os.fspath(path)}.tmp-{os.getpid()}-{os.urandom(6).hex()}"


def create_private_file(path: str | os.PathLike[str]) -> int:
    """A new 0600 file opened read-write; fails if anything (a file, a symlink, a FIFO) already has the name."""
    return os.open(os.fspath(path), _CREATE, PRIVATE_FILE_MODE)


def write_private_file(path: str | os.PathLike[str], data: bytes) -> None:
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


def open_regular_file(path: str | os.PathLike[str], flags: int = os.O_RDONLY, *, owner_of_dir: bool = False) -> int:
    """Open without following a symlink and without blocking on a FIFO; raise UnsafePathError unless the result
    is a regular file (and, with `owner_of_dir`, owned by whoever owns its directory, or by this process's user,
    who wrote it: a reader running as root then never opens somebody else's file linked into an engine
    directory). The caller owns the descriptor."""
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
        if owner_of_dir:
            uid, dir_uid = os.fstat(fd).st_uid, os.stat(os.path.dirname(path) or ".", follow_symlinks=False).st_uid
            if uid not in (dir_uid, os.geteuid()):
                raise UnsafePathError(f"{path}: owned by uid {uid}, its directory by uid {dir_uid}; ignored")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_small_file(path: str | os.PathLike[str], limit: int) -> bytes:
    """The content of a regular file of at most `limit` bytes (ValueError beyond), opened as above and owned as
    its directory is (every such file lives in a directory of the engine's user)."""
    fd = open_regular_file(path, owner_of_dir=True)
    try:
        chunks: list[bytes] = []
        total = 0
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

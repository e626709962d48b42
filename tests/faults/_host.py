"""Host-level tools of the fault suite: tmpfs mounts, a second local user, acting as that user, and the TCP
sockets a process listens on. Each tool undoes what it made (unmount, userdel) however the test ends."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import socket
import struct
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount -t tmpfs, useradd); CI runs as root")


@contextlib.contextmanager
def tmpfs(path: str, options: str) -> Iterator[str]:
    """`mount -t tmpfs -o OPTIONS tmpfs PATH` (PATH created), unmounted and removed at the end."""
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path], check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False, capture_output=True)
        with contextlib.suppress(OSError):
            os.rmdir(path)


@dataclass(frozen=True)
class LocalUser:
    name: str
    uid: int
    gid: int


@contextlib.contextmanager
def other_user() -> Iterator[LocalUser]:
    """A fresh local user (useradd, no home, no login), removed with userdel at the end."""
    name = f"gwfault{os.getpid() % 100000}{os.urandom(2).hex()}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
                   check=True, capture_output=True)
    try:
        entry = pwd.getpwnam(name)
        yield LocalUser(name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def as_user(uid: int, gid: int, action: Callable[[], object]) -> int:
    """Run `action` in a child process with uid/gid; returns the errno it raised (0 if none)."""
    pid = os.fork()
    if pid == 0:  # child: no pytest machinery from here on
        code = 0
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            action()
        except OSError as exc:
            code = exc.errno or 255
        except BaseException:
            code = 254
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def run_as(user: LocalUser, args: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run(args, user=user.uid, group=user.gid, extra_groups=[], capture_output=True, text=True,
                          **kwargs)


def listening_addresses(pid: int) -> list[str]:
    """The local addresses (`host:port`) of every TCP socket process `pid` listens on (from /proc)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if m := re.fullmatch(r"socket:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}")):
                    inodes.add(m.group(1))
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # state LISTEN
                    host_hex, port_hex = fields[1].split(":")
                    raw = bytes.fromhex(host_hex)
                    words = struct.unpack(f"<{len(raw) // 4}I", raw)  # /proc prints each 32-bit word host-endian
                    host = socket.inet_ntop(family, struct.pack(f">{len(words)}I", *words))
                    found.append(f"{host}:{int(port_hex, 16)}")
    return found

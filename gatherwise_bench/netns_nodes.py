"""Two "nodes" on one Linux host: network namespaces joined by a veth pair, each node's processes in their own
mount namespace with a private tmpfs on /dev/shm. Root only. Used by scripts/two_node.py and `gatherwise bench serve
--nodes 2`."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
from pathlib import Path

NODES = (("gw-node0", "gw-veth0", "10.77.0.1"), ("gw-node1", "gw-veth1", "10.77.0.2"))


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def address(node: int) -> str:
    return NODES[node][2]


def veth(node: int) -> str:
    return NODES[node][1]


def in_node(node: int, *cmd: str) -> list[str]:
    return ["ip", "netns", "exec", NODES[node][0], *cmd]


def set_up_network() -> None:
    tear_down_network()
    for ns, _, _ in NODES:
        run("ip", "netns", "add", ns)
    run("ip", "link", "add", NODES[0][1], "type", "veth", "peer", "name", NODES[1][1])
    for k, (ns, dev, addr) in enumerate(NODES):
        run("ip", "link", "set", dev, "netns", ns)
        run(*in_node(k, "ip", "addr", "add", f"{addr}/24", "dev", dev))
        run("ip", "-n", ns, "link", "set", dev, "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")


def limit_link(rate: str) -> None:
    """Both directions of the veth pair at `rate` (tc's units, e.g. 100mbit): an htb class every packet takes."""
    for k in range(len(NODES)):
        run(*in_node(k, "tc", "qdisc", "add", "dev", veth(k), "root", "handle", "1:", "htb", "default", "10"))
        run(*in_node(k, "tc", "class", "add", "dev", veth(k), "parent", "1:", "classid", "1:10", "htb", "rate", rate))


def tear_down_network() -> None:
    for ns, _, _ in NODES:
        run("ip", "netns", "del", ns, check=False)  # takes its veth end (and so the pair) with it


def http(node: int, method: str, url: str, body: object = None, token: str | None = None,
         timeout: float = 60.0) -> tuple[int, str]:
    """One request from inside the node's namespace (curl): (status, body); status 0 when nothing answered."""
    cmd = ["curl", "-s", "-o", "-", "-w", "\n%{http_code}", "-X", method, "--max-time", str(timeout), url]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    if token:
        cmd += ["-H", f"Authorization: Bearer {token}"]
    out = run(*in_node(node, *cmd), check=False).stdout
    text, _, code = out.rpartition("\n")
    return int(code or 0), text


class NodeProcess:
    """A shell script run in node k's network namespace and a private mount namespace whose /dev/shm is a fresh
    tmpfs (what another host's /dev/shm looks like); its output goes to `log`. stop() ends its whole group."""

    def __init__(self, node: int, script: str, env: dict[str, str], log: Path) -> None:
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            in_node(node, "unshare", "-m", "--propagation", "private", "sh", "-c",
                    f"mount -t tmpfs tmpfs /dev/shm && {script}"),
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def exited(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
            except ProcessLookupError:
                pass
        self.log.close()


def background(cmd: list[str], log: Path) -> str:
    """`cmd` started in the background of a node's script, its output to `log`."""
    return f"{shlex.join(cmd)} > {shlex.quote(str(log))} 2>&1 & "

"""Two "nodes" on one Linux host: network namespaces joined by a veth pair, each node's processes in their own
mount namespace with a private tmpfs on /dev/shm. Root only. Used by tests/machine/two_node.py and `gatherwise bench
serve --nodes 2`."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
from pathlib import Path

NODES = (("gw-node0", "gw-veth0", "10.77.0.1"), ("gw-node1", "gw-veth1", "10.77.0.2"))
# node k's front link to the host: (host end, node end, host address, node end's address), a /30 of its own
FRONT = (("gw-host0", "gw-front0", "10.77.10.1", "10.77.10.2"), ("gw-host1", "gw-front1", "10.77.11.1", "10.77.11.2"))


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def address(node: int) -> str:
    return NODES[node][2]


def veth(node: int) -> str:
    return NODES[node][1]


def in_node(node: int, *cmd: str) -> list[str]:
    return ["ip", "netns", "exec", NODES[node][0], *cmd]


def gloo_env(node: int) -> dict[str, str]:
    """gloo's sockets on the node's veth: the engines' process groups are gloo on CPU."""
    return {"GLOO_SOCKET_IFNAME": veth(node)}


def in_use() -> list[str]:
    """The nodes' namespaces that exist with processes in them: another two-node run owns them (the names are
    fixed, and set_up_network would tear that run's network down under it)."""
    listed = run("ip", "netns", "list", check=False).stdout
    present = [ns for ns, _, _ in NODES if any(line.split()[:1] == [ns] for line in listed.splitlines())]
    return [ns for ns in present if run("ip", "netns", "pids", ns, check=False).stdout.strip()]


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


def link_host() -> None:
    """A front link from this (the host's) namespace to every node: a veth pair per node and a host route to the
    node's address through it, so processes here reach node k at address(k) without crossing the link between
    the nodes (that one carries only what the ranks send each other; limit_link shapes it alone). Packets to
    address(k) arriving on the front end are the node's own (it holds that address), so nothing forwards."""
    for k, (host_dev, node_dev, host_addr, node_addr) in enumerate(FRONT):
        run("ip", "link", "add", host_dev, "type", "veth", "peer", "name", node_dev)
        run("ip", "link", "set", node_dev, "netns", NODES[k][0])
        run("ip", "addr", "add", f"{host_addr}/30", "dev", host_dev)
        run("ip", "link", "set", host_dev, "up")
        run(*in_node(k, "ip", "addr", "add", f"{node_addr}/30", "dev", node_dev))
        run("ip", "-n", NODES[k][0], "link", "set", node_dev, "up")
        run("ip", "route", "add", f"{address(k)}/32", "via", node_addr, "dev", host_dev)


def limit_link(rate: str) -> None:
    """Both directions of the veth pair at `rate` (tc's units, e.g. 100mbit): an htb class every packet takes."""
    for k in range(len(NODES)):
        run(*in_node(k, "tc", "qdisc", "add", "dev", veth(k), "root", "handle", "1:", "htb", "default", "10"))
        run(*in_node(k, "tc", "class", "add", "dev", veth(k), "parent", "1:", "classid", "1:10", "htb", "rate", rate))


def tear_down_network() -> None:
    for ns, _, _ in NODES:
        run("ip", "netns", "del", ns, check=False)  # takes its veth ends (and so the pairs and routes) with it
    for host_dev, _, _, _ in FRONT:  # a front pair whose node end never moved into its namespace
        run("ip", "link", "del", host_dev, check=False)


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

"""`gatherwise bench serve --nodes 2`: the engine's TP=2 group with one rank on each of two "nodes" of this host
(gatherwise.bench.netns_nodes: network namespaces joined by a veth pair, each node's processes with a /dev/shm of
their own), and with gatherwise a sidecar on each node. Node 0 serves HTTP; this process, the engine's benchmark
client and every readiness and sidecar call reach the nodes over their front links (netns_nodes.link_host), so
the link between the nodes carries only what the ranks send each other, and that is the link --link-rate shapes.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from gatherwise.bench.bench_sidecar import TOKEN
from gatherwise.bench.netns_nodes import (
    NODES,
    NodeProcess,
    address,
    background,
    gloo_env,
    in_use,
    limit_link,
    link_host,
    run,
    set_up_network,
    tear_down_network,
)
from gatherwise.bench.serve.engine_spec import EngineSpec, NodeRank
from gatherwise.bench.serve.sidecar_link import SidecarLink

NODE_COUNT = 2
ENGINE_PORT, DIST_PORT, SIDECAR_PORT = 30000, 29500, 9400  # each node has its own ports: fixed ones are free
NODE_SHM_DIR = "/dev/shm/gatherwise"  # in each node's own /dev/shm
READY_TIMEOUT_S = 900.0
STOP_GRACE_S = 2.0
LOG_TAIL_CHARS = 6000


def node_rank(k: int) -> NodeRank:
    return NodeRank(k, NODE_COUNT, address(k), address(0), DIST_PORT)


@contextmanager
def two_node_network(link_rate: str | None) -> Iterator[None]:
    """The nodes, their front links and the link's rate for the block; torn down whatever happens in it. Refuses
    while another run's processes live in the namespaces (their names are fixed)."""
    busy = in_use()
    if busy:
        raise RuntimeError(f"network namespaces {', '.join(busy)} are in use by another two-node run "
                           f"(`ip netns pids {busy[0]}`); wait for it to end")
    try:
        set_up_network()
        link_host()
        if link_rate:
            limit_link(link_rate)
        yield
    finally:
        tear_down_network()


class NodeServers:
    """Node 0's server and node 1's share of the group, each a netns_nodes.NodeProcess; with `plugin`, a gatherwise
    sidecar beside each engine in its node's script, since only processes in the node's mount namespace see its
    /dev/shm (where the node's ranks put their rings). The interface of ServerProcess: url, host, port,
    wait_ready(), log_tail(), stop()."""

    def __init__(self, engine: EngineSpec, command_for: Callable[[NodeRank], list[str]], env: dict[str, str],
                 plugin: bool, log_dir: Path, tag: str) -> None:
        self.host, self.port = address(0), ENGINE_PORT
        self.url = f"http://{self.host}:{self.port}"
        self.plugin = plugin
        self.commands = [command_for(node_rank(k)) for k in range(NODE_COUNT)]
        self.log_paths = [log_dir / f"server-{tag}-node{k}.log" for k in range(NODE_COUNT)]
        self.started = time.monotonic()
        self.nodes: list[NodeProcess] = []
        self.node_envs = [{**engine.node_env(node_rank(k)), **gloo_env(k)} for k in range(NODE_COUNT)]
        for k, command in enumerate(self.commands):
            node_env = {**env, **self.node_envs[k], "GATHERWISE_API_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
            script = ""
            if plugin:
                script += background([sys.executable, "-m", "gatherwise.cli", "sidecar", "--host", address(k),
                                      "--port", str(SIDECAR_PORT), "--shm-dir", NODE_SHM_DIR],
                                     log_dir / f"sidecar-{tag}-node{k}.log")
            script += "exec " + shlex.join(command)
            self.nodes.append(NodeProcess(k, script, node_env, self.log_paths[k]))

    def sidecars(self) -> SidecarLink:
        """Node 0's sidecar (the controller) first, then node 1's (an observer)."""
        return SidecarLink([f"http://{address(k)}:{SIDECAR_PORT}" for k in range(NODE_COUNT)])

    def log_tail(self) -> str:
        return "\n".join(f"--- node {k}:\n" + path.read_text(errors="replace")[-LOG_TAIL_CHARS // 2:]
                         for k, path in enumerate(self.log_paths))

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Seconds from start until node 0 lists its model (it serves once every node joined the group)."""
        deadline = time.monotonic() + timeout_s
        while True:
            gone = [k for k, node in enumerate(self.nodes) if node.exited() is not None]
            if gone:
                raise RuntimeError(f"node(s) {gone} exited before the group served:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=5).status_code == 200:
                    return time.monotonic() - self.started
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"node 0 did not serve within {timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(1.0)

    def stop(self) -> int | None:
        """Every node's process group ended; then whatever still runs in a node's namespace (a worker that left
        its group) is killed by its id, so the node's /dev/shm goes with its last process."""
        for node in self.nodes:
            node.stop()
        time.sleep(STOP_GRACE_S)
        for ns, _, _ in NODES:
            for pid in run("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return self.nodes[0].proc.returncode


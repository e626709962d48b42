"""One TP group over several nodes, laid out as SGLang does: `--nnodes N --node-rank K --dist-init-addr HOST:PORT`.

Node K runs the contiguous global ranks [K*P/N, (K+1)*P/N); rank 0, on node 0, serves the rendezvous store on
HOST:PORT (that address only) and every other rank connects to it. Torch-free, so a command's bad layout fails
with argparse's exit 2 before anything heavy is imported.
"""

from __future__ import annotations

import argparse
import socket
from dataclasses import dataclass

MAX_NODES = 1024  # beyond it a layout is a typo, not a cluster this launcher is meant for


@dataclass(frozen=True)
class Nodes:
    count: int
    rank: int
    addr: str  # node 0's address: the store listens here, the other nodes dial it
    port: int

    def ranks(self, world: int) -> range:
        """The global ranks this node runs."""
        if world % self.count:
            raise ValueError(f"a TP group of {world} ranks does not split evenly over {self.count} nodes")
        per = world // self.count
        return range(self.rank * per, (self.rank + 1) * per)

    def describe(self, world: int) -> str:
        r = self.ranks(world)
        return f"node {self.rank} of {self.count} (ranks {r.start}..{r.stop - 1} of {world})"


def add_node_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nnodes", type=int, default=1, help="nodes the TP group spans (default 1: all ranks local)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's index, 0..nnodes-1; node 0 holds rank 0")
    p.add_argument("--dist-init-addr", default=None, metavar="HOST:PORT",
                   help="node 0's address for the rendezvous (needed with --nnodes > 1); set GLOO_SOCKET_IFNAME "
                        "to the interface gloo should use between nodes")


def nodes_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace, world: int) -> Nodes | None:
    """The layout the three flags describe (None: every rank local, the loopback default); a bad one exits 2."""
    n, k, text = args.nnodes, args.node_rank, args.dist_init_addr
    if not 1 <= n <= MAX_NODES:
        parser.error(f"--nnodes {n} out of range: must be 1..{MAX_NODES}")
    if not 0 <= k < n:
        parser.error(f"--node-rank {k} out of range: must be 0..{n - 1} for --nnodes {n}")
    if world % n:
        parser.error(f"--tp {world} is not divisible by --nnodes {n}: every node runs the same number of ranks")
    if text is None:
        if n > 1:
            parser.error(f"--nnodes {n} needs --dist-init-addr HOST:PORT (node 0's address)")
        return None
    host, sep, port_text = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:29500
    if not sep or not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        parser.error(f"--dist-init-addr {text!r}: expected HOST:PORT with a port in 1..65535")
    nodes = Nodes(n, k, host, int(port_text))
    try:
        family = socket.getaddrinfo(host, nodes.port, type=socket.SOCK_STREAM)[0][0]
    except OSError as exc:
        parser.error(f"--dist-init-addr {text!r}: cannot resolve {host!r}: {exc}")
    if k == 0:  # rank 0 will listen there: an address not of this host, or a port in use, is refused now
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, nodes.port))
            except OSError as exc:
                parser.error(f"--dist-init-addr {text!r}: node 0 cannot listen there: {exc.strerror or exc}")
    return nodes

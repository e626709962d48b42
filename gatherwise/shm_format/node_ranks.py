"""The node file (`node.json`): which TP ranks an engine directory holds, written once the directory is complete.

Each node of a TP group has its own shm_dir, so each engine directory holds the files of the ranks on that node
only, and its sidecar must know which ranks those are to join a call (docs/shm-format.md). Nobody configures it:
at install, every rank makes its files, the group passes a barrier, and then every rank lists the liveness
locks (`alive-<r>`) in its own directory — exactly the ranks of its node, all made before the barrier. The
node's lowest rank writes this file (0600, temporary name then rename), so its presence says the directory is
complete: a reader never mistakes a directory still being built for a node with fewer ranks. Node indices order
the nodes by their lowest rank, so rank 0's node is node 0. Stdlib only.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from gatherwise.shm_format.json_record import is_u63, parse_record, record_json
from gatherwise.shm_format.liveness import ALIVE_PREFIX
from gatherwise.shm_format.private_files import read_small_file, write_private_file

FORMAT = 1
NODE_NAME = "node.json"
MAX_NODE_BYTES = 65536  # room for every rank of the largest TP group as JSON integers
MAX_TEXT_CHARS = 200


@dataclass(frozen=True)
class NodeRanks:
    tp_size: int
    ranks: tuple[int, ...]  # the TP ranks whose files this directory holds, ascending, never empty
    node_index: int  # this node among the group's, ordered by their lowest rank: rank 0's node is 0
    nodes: int  # how many nodes (engine directories) the group's ranks made
    node: str  # host name of the rank that wrote the file

    @property
    def every_rank(self) -> bool:
        """The directory holds the whole group (a single-node engine)."""
        return len(self.ranks) == self.tp_size

    def to_json(self) -> bytes:
        return record_json(self, FORMAT)

    @classmethod
    def from_json(cls, data: bytes) -> NodeRanks:
        """Parse a node file; ValueError for anything that is not a consistent one."""
        obj = parse_record(data, FORMAT, "node file")
        tp, ranks, index, nodes, node = (obj.get(k) for k in ("tp_size", "ranks", "node_index", "nodes", "node"))
        if not (is_u63(tp) and is_u63(index) and is_u63(nodes) and isinstance(node, str)):
            raise ValueError("tp_size, node_index, nodes or node missing or of the wrong type")
        if not isinstance(ranks, list) or not ranks or not all(is_u63(r) for r in ranks):
            raise ValueError("ranks is not a non-empty list of ranks")
        if ranks != sorted(set(ranks)) or ranks[-1] >= tp or not index < nodes <= tp:
            raise ValueError(f"inconsistent node file: ranks {ranks[:8]} of tp {tp}, node {index} of {nodes}")
        return cls(tp, tuple(ranks), index, nodes, node[:MAX_TEXT_CHARS])


def node_path(engine_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(engine_dir), NODE_NAME)


def ranks_in_dir(engine_dir: str | os.PathLike[str]) -> tuple[int, ...]:
    """The ranks whose liveness locks are in the directory, ascending: once every rank of the group has made its
    files, the ranks of this node."""
    names = os.listdir(engine_dir)
    return tuple(sorted(int(n[len(ALIVE_PREFIX):]) for n in names
                        if n.startswith(ALIVE_PREFIX) and n[len(ALIVE_PREFIX):].isdigit()))


def write_node_ranks(engine_dir: str | os.PathLike[str], tp_size: int, ranks: tuple[int, ...], node_index: int,
                     nodes: int) -> NodeRanks:
    """The directory's node file (OSError when it cannot be written)."""
    info = NodeRanks(tp_size, ranks, node_index, nodes, socket.gethostname()[:MAX_TEXT_CHARS])
    write_private_file(node_path(engine_dir), info.to_json())
    return info


def read_node_ranks(engine_dir: str | os.PathLike[str]) -> NodeRanks | None:
    """The directory's node file, or None where there is none yet (OSError, ValueError for one that is no node
    file: the directory is then not attached)."""
    try:
        data = read_small_file(node_path(engine_dir), MAX_NODE_BYTES)
    except FileNotFoundError:
        return None
    return NodeRanks.from_json(data)

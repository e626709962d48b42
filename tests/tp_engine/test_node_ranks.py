"""The node file: each engine directory says which TP ranks it holds, learned by the engine itself at install (real
gloo ranks; two "nodes" are two shared-memory directories, as two hosts' /dev/shm are), and the file's reader
refuses anything that is not a consistent one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gatherwise.shm_format.node_ranks import NodeRanks, node_path, ranks_in_dir, read_node_ranks, write_node_ranks
from gatherwise.shm_format.ring import engine_dir
from tests._dist import run_ranks

pytestmark = pytest.mark.timeout(180)
ENGINE_ID = 0x5EED


def node_files_on_two_nodes(rank: int, world: int, base: str) -> tuple[int, ...]:
    """Ranks 0 and 1 on node "a", the others on node "b": each makes its directory and liveness lock there, as
    install_hooks does, then the group learns who shares which directory."""
    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.install import publish_node_ranks
    from gatherwise.shm_format.liveness import LivenessLock
    from gatherwise.shm_format.private_files import ensure_private_dir

    shm = os.path.join(base, "a" if rank < 2 else "b")
    directory = Path(ensure_private_dir(engine_dir(ensure_private_dir(shm), ENGINE_ID)))
    lock = LivenessLock(directory, rank)
    try:
        return publish_node_ranks(default_communicator(), directory, "cpu")
    finally:
        lock.close()


def installed_node_file(rank: int, world: int, shm: str) -> tuple[dict, bool]:
    """install_hooks on one node: (the node file's fields, whether this rank removes the directory at close)."""
    from dataclasses import asdict

    import torch.distributed as dist

    from gatherwise.config import GatherwiseConfig
    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.install import install_hooks

    config = GatherwiseConfig.model_validate({"engine": {"shm_dir": shm}})
    hooks = install_hooks(default_communicator(), vocab=64, config=config)
    try:
        dist.barrier()  # rank 0 writes the file after the group's last install collective, which rank 1 may leave first
        assert hooks.engine_dir is not None
        node = read_node_ranks(hooks.engine_dir)
        assert node is not None
        return asdict(node), hooks.removes_dir
    finally:
        dist.barrier()  # rank 0 removes the directory at close
        hooks.close()


def test_each_node_learns_its_ranks_from_the_directory_it_shares(tmp_path: Path) -> None:
    base = tmp_path / "nodes"
    base.mkdir(mode=0o700)
    assert run_ranks(node_files_on_two_nodes, 3, str(base)) == [(0, 1), (0, 1), (2,)]
    a, b = (read_node_ranks(engine_dir(base / n, ENGINE_ID)) for n in ("a", "b"))
    assert a is not None and (a.tp_size, a.ranks, a.node_index, a.nodes) == (3, (0, 1), 0, 2)
    assert b is not None and (b.tp_size, b.ranks, b.node_index, b.nodes) == (3, (2,), 1, 2)
    assert not a.every_rank and a.node


def test_a_single_node_install_writes_a_node_file_of_every_rank(shm_dir: str) -> None:
    found = run_ranks(installed_node_file, 2, shm_dir)
    for node, _ in found:
        assert (node["tp_size"], node["ranks"], node["node_index"], node["nodes"]) == (2, (0, 1), 0, 1)
    assert [removes for _, removes in found] == [True, False]  # rank 0, the node's lowest, as before


def test_the_reader_refuses_what_is_no_consistent_node_file(tmp_path: Path) -> None:
    assert read_node_ranks(tmp_path) is None  # none yet: the directory is not complete
    written = write_node_ranks(tmp_path, 4, (2, 3), 1, 2)
    assert read_node_ranks(tmp_path) == written and oct(os.stat(node_path(tmp_path)).st_mode & 0o777) == "0o600"
    bad = [b"not json", b'{"format": 2}', b'{"format": 1, "tp_size": 4, "ranks": [], "node_index": 0, '
           b'"nodes": 1, "node": "h"}', b'{"format": 1, "tp_size": 4, "ranks": [3, 2], "node_index": 0, '
           b'"nodes": 1, "node": "h"}', b'{"format": 1, "tp_size": 2, "ranks": [2], "node_index": 0, '
           b'"nodes": 1, "node": "h"}', b'{"format": 1, "tp_size": 4, "ranks": [2], "node_index": 2, '
           b'"nodes": 2, "node": "h"}', b'{"format": 1, "tp_size": 4, "ranks": [true], "node_index": 0, '
           b'"nodes": 1, "node": "h"}']
    for data in bad:
        with pytest.raises(ValueError):
            NodeRanks.from_json(data)
    os.unlink(node_path(tmp_path))
    os.symlink(tmp_path / "elsewhere", node_path(tmp_path))  # never followed
    with pytest.raises(OSError):
        read_node_ranks(tmp_path)


def test_ranks_in_dir_are_the_liveness_locks(tmp_path: Path) -> None:
    from gatherwise.shm_format.liveness import LivenessLock

    locks = [LivenessLock(tmp_path, r) for r in (5, 3)]
    (tmp_path / "rank-7").write_bytes(b"")  # a ring is no lock
    (tmp_path / "alive-x").write_bytes(b"")
    try:
        assert ranks_in_dir(tmp_path) == (3, 5)
    finally:
        for lock in locks:
            lock.close()

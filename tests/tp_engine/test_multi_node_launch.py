"""One TP group over two "nodes" on this host: two `gatherwise generate` (or `gatherwise bench`) commands, node 0 and
node 1, meeting at 127.0.0.1:<port> as two hosts would at node 0's address. Node 0 prints single-node tokens bit for
bit; a bad layout is argparse's exit 2; a missing peer or other arguments on a node fail cleanly, never hang."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gatherwise.bench.cli import main as bench_main
from gatherwise.free_port import free_port
from gatherwise.tp_engine.nodes import Nodes, add_node_args, nodes_from_args
from tests._generate_cli import CLI_TIMEOUT_S, assert_refused, generate_json
from tests._processes import kill_tree

SAMPLED = ("--prompts", "5", "--max-new-tokens", "5", "--temperature", "0.9", "--top-k", "50", "--top-p", "0.95",
           "--seed", "3")


def run_nodes(tmp_path: Path, command: list[str], node_args: list[list[str]] | None = None,
              nnodes: int = 2) -> list[tuple[int, str, str]]:
    """`gatherwise COMMAND` once per node (node k adds node_args[k]), all at once; (exit status, stdout, stderr)
    of each. Output goes to files, so a chatty node cannot block on a full pipe."""
    port, procs, files = free_port(), [], []
    try:
        for k in range(nnodes):
            shm = tmp_path / f"node{k}-shm"  # each node its own engine shm dir, as on two hosts
            out, err = (open(tmp_path / f"node{k}.{s}", "w+") for s in ("out", "err"))
            files.append((out, err))
            argv = [sys.executable, "-m", "gatherwise.cli", *command, *(node_args[k] if node_args else []),
                    "--nnodes", str(nnodes), "--node-rank", str(k), "--dist-init-addr", f"127.0.0.1:{port}"]
            procs.append(subprocess.Popen(argv, stdout=out, stderr=err,
                                          env={**os.environ, "GATHERWISE_ENGINE_SHM_DIR": str(shm)}))
        for p in procs:
            p.wait(CLI_TIMEOUT_S)
        results = []
        for p, (out, err) in zip(procs, files, strict=True):
            out.seek(0)
            err.seek(0)
            results.append((p.returncode, out.read(), err.read()))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p)
        for out, err in files:
            out.close()
            err.close()


@pytest.mark.slow
@pytest.mark.timeout(2 * CLI_TIMEOUT_S + 60)
@pytest.mark.parametrize("mode", ["all_gather", "gather", "sharded"])
def test_two_nodes_print_the_single_node_tokens(mode, tmp_path):
    one = generate_json("--tp", "2", "--mode", mode, *SAMPLED)
    (rc0, out0, err0), (rc1, out1, err1) = run_nodes(tmp_path, ["generate", "--tp", "2", "--mode", mode, *SAMPLED,
                                                                "--json"])
    assert rc0 == 0, err0
    assert rc1 == 0, err1
    two = json.loads(out0)
    assert two["tokens"] == one["tokens"] and len(two["tokens"]) == 5
    assert two["prompt_ids"] == one["prompt_ids"]
    # per-rank lists cover node 0's rank only, and say so
    assert two["ranks"] == [0] and two["modes"] == one["modes"][:1] and two["collectives"] == one["collectives"][:1]
    assert set(two["modes"][0]) == {mode}
    assert json.loads(out1) == {"node_rank": 1, "nnodes": 2, "ranks": [1]}
    assert not any((tmp_path / f"node{k}-shm").exists() for k in (0, 1))  # generate runs without telemetry


@pytest.mark.slow
@pytest.mark.timeout(CLI_TIMEOUT_S)
def test_the_plain_text_of_each_node(tmp_path):
    (rc0, out0, err0), (rc1, out1, err1) = run_nodes(tmp_path, ["generate", "--tp", "2", "--prompts", "2",
                                                                "--max-new-tokens", "2"])
    assert rc0 == 0 and rc1 == 0, err0 + err1
    assert "tp=2 mode=all_gather requests=2" in out0 and "modes identical on node 0's ranks 0..0: True" in out0
    assert out1.strip() == "gatherwise generate: node 1 of 2 (ranks 1..1 of 2) done; node 0 prints the tokens"


@pytest.mark.slow
@pytest.mark.timeout(CLI_TIMEOUT_S)
@pytest.mark.parametrize("node", [0, 1])
def test_a_node_whose_peer_never_comes_fails_within_its_timeout(node, tmp_path):
    port = free_port()
    argv = [sys.executable, "-m", "gatherwise.cli", "generate", "--tp", "2", "--prompts", "2", "--timeout", "5",
            "--nnodes", "2", "--node-rank", str(node), "--dist-init-addr", f"127.0.0.1:{port}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                          env={**os.environ, "GATHERWISE_ENGINE_SHM_DIR": str(tmp_path / "shm")})
    assert done.returncode == 1
    assert f"1 of 1 ranks on node {node} of 2 (ranks {node}..{node} of 2) failed" in done.stderr
    assert f"did every one of the 2 nodes start, and can each reach 127.0.0.1:{port}?" in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(CLI_TIMEOUT_S)
def test_nodes_given_other_arguments_refuse_to_start(tmp_path):
    results = run_nodes(tmp_path, ["generate", "--tp", "2", "--prompts", "2", "--timeout", "60"],
                        node_args=[["--seed", "1"], ["--seed", "2"]])
    for rc, _, err in results:
        assert rc == 1
        assert "ranks [1] were given other generate arguments" in err


def _listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


LAYOUT = ["--tp", "2", "--nnodes", "2"]


@pytest.mark.parametrize("argv, message", [
    (["--tp", "3", "--nnodes", "2", "--dist-init-addr", "127.0.0.1:29500"], "--tp 3 is not divisible by --nnodes 2"),
    ([*LAYOUT, "--node-rank", "2", "--dist-init-addr", "127.0.0.1:29500"],
     "--node-rank 2 out of range: must be 0..1 for --nnodes 2"),
    ([*LAYOUT, "--node-rank", "-1", "--dist-init-addr", "127.0.0.1:29500"], "--node-rank -1 out of range"),
    (["--nnodes", "0"], "--nnodes 0 out of range"),
    (LAYOUT, "--nnodes 2 needs --dist-init-addr HOST:PORT"),
    ([*LAYOUT, "--dist-init-addr", "127.0.0.1"], "'127.0.0.1': expected HOST:PORT with a port in 1..65535"),
    ([*LAYOUT, "--dist-init-addr", "127.0.0.1:70000"], "expected HOST:PORT with a port in 1..65535"),
    ([*LAYOUT, "--dist-init-addr", ":29500"], "expected HOST:PORT"),
    ([*LAYOUT, "--dist-init-addr", "192.0.2.1:29500"], "node 0 cannot listen there"),  # not this host's address
])
def test_generate_refuses_a_bad_layout(argv, message, capsys):
    assert_refused(argv, message, capsys)


def test_node_0_refuses_a_port_already_in_use(capsys):
    with _listening() as s:
        assert_refused([*LAYOUT, "--dist-init-addr", f"127.0.0.1:{s.getsockname()[1]}"],
                       "node 0 cannot listen there: Address already in use", capsys)


def test_node_1_does_not_listen_so_a_busy_port_is_node_0s_business(capsys):
    parser = argparse.ArgumentParser()
    add_node_args(parser)
    with _listening() as s:
        port = s.getsockname()[1]
        args = parser.parse_args(["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", f"127.0.0.1:{port}"])
        assert nodes_from_args(parser, args, 4) == Nodes(2, 1, "127.0.0.1", port)
    assert Nodes(2, 1, "127.0.0.1", port).ranks(4) == range(2, 4)


@pytest.mark.parametrize("argv, message", [
    (["--tp", "3", "--nnodes", "2", "--dist-init-addr", "127.0.0.1:29500"], "--tp 3 is not divisible by --nnodes 2"),
    ([*LAYOUT, "--node-rank", "5", "--dist-init-addr", "127.0.0.1:29500"], "--node-rank 5 out of range"),
    ([*LAYOUT, "--dist-init-addr", "localhost"], "expected HOST:PORT"),
])
def test_bench_refuses_a_bad_layout(argv, message, capsys, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as info:
        bench_main([*argv, "--device", "cpu", "--out", str(out)])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.timeout(CLI_TIMEOUT_S)
def test_bench_across_two_nodes_reports_on_node_0(tmp_path):
    outs = [tmp_path / f"sweep{k}" for k in (0, 1)]
    results = run_nodes(tmp_path, ["bench", "--tp", "2", "--rows", "1", "--vocab", "1000", "--dtype", "float32",
                                   "--iters", "2", "--warmup", "1", "--device", "cpu", "--timeout", "150"],
                        node_args=[["--out", str(out)] for out in outs])
    (rc0, table, err0), (rc1, _, err1) = results
    assert rc0 == 0, err0
    assert rc1 == 0, err1
    assert "node 1 of 2 (ranks 1..1 of 2) done: node 0 writes the report" in err1
    assert not outs[1].exists()  # only node 0 writes the report
    doc = json.loads((outs[0] / "results.json").read_text())
    assert doc["config"]["tp"] == 2
    assert doc["env"]["nodes"] == {"count": 2, "dist_init_addr": doc["env"]["nodes"]["dist_init_addr"],
                                   "ranks_by_node": {"0": [0], "1": [1]}, "measured_ranks": [0],
                                   "measured_on_node": 0}
    assert "spans over ranks 0..0 on node 0 only" in doc["timing"] and "spans over ranks 0..0" in table
    (shape,) = doc["results"]
    assert set(shape["modes"]) == {"all_gather", "gather", "sharded"}
    assert shape["bytes"] == 2 * 1 * 500 * 4  # the whole group's logits, not node 0's share
    assert (outs[0] / "crossover.png").is_file()

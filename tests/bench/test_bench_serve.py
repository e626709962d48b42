"""`gatherwise bench serve`'s parts that need no engine: its arguments, the interleaved order, the local tokenizer,
the logits path's share from two scrapes, the greedy comparison. The real servers run in tests/vllm and
tests/sglang (test_*_bench_serve.py, `--quick`)."""

from __future__ import annotations

import json
import os
import random
import sys

import pytest

from gatherwise.bench.cli import main
from gatherwise.bench.serve.cells import build_cells
from gatherwise.bench.serve.cli import build_parser
from gatherwise.bench.serve.configurations import interleaved
from gatherwise.bench.serve.engine_spec import NodeRank, Workload
from gatherwise.bench.serve.greedy_match import TokenCounter, compare_outputs
from gatherwise.bench.serve.logits_share import logits_share
from gatherwise.bench.serve.process_cpu import CpuSnapshot, cores_busy
from gatherwise.bench.serve.real_prompts import RealPrompts, documentation_paragraphs
from gatherwise.bench.serve.report import format_cpu_table, format_in_start, in_start_comparison, summarize
from gatherwise.bench.serve.run import ServeBench, phases, real_prompts, server_environment
from gatherwise.bench.serve.sglang_engine import SglangEngine
from gatherwise.bench.serve.tokenizer import write_tokenizer
from gatherwise.bench.serve.vllm_engine import VllmEngine


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: --engine"),
    (["--engine", "trt"], "invalid choice: 'trt'"),
    (["--engine", "vllm", "--configurations", "plain,scatter"], "unknown configuration 'scatter'"),
    (["--engine", "vllm", "--concurrency", "0"], "--concurrency must be >= 1, got 0"),
    (["--engine", "sglang", "--sampling", "beam"], "unknown sampling 'beam'"),
    (["--engine", "sglang", "--python", "no-such-venv/bin/python"],
     "no executable interpreter at 'no-such-venv/bin/python'"),
    (["--engine", "vllm", "--auto-against", "scatter"], "invalid choice: 'scatter'"),
    (["--engine", "vllm", "--configurations", "plain,sharded", "--auto-against", "sharded"],
     "--configurations needs an auto one"),
])
def test_bad_arguments_exit_2_and_start_nothing(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_relative_interpreter_reaches_servers_and_clients_as_an_absolute_path(tmp_path, monkeypatch):
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["--engine", "vllm", "--python", "venv/bin/python"])
    assert args.python == str(venv_python)


def test_servers_get_the_cpu_settings_and_a_callers_omp_wait_policy_and_core_list_win(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv("GATHERWISE_ENABLE", "1")  # only a configuration turns gatherwise on
    sglang = server_environment(SglangEngine(), tp=2)
    assert sglang["OMP_WAIT_POLICY"] == "PASSIVE" and sglang["SGLANG_USE_CPU_ENGINE"] == "1"
    assert sglang["HF_HUB_OFFLINE"] == "1" and "GATHERWISE_ENABLE" not in sglang
    assert server_environment(VllmEngine(), tp=2)["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert server_environment(SglangEngine(), tp=2)["OMP_WAIT_POLICY"] == "ACTIVE"
    assert server_environment(VllmEngine(), tp=2)["OMP_WAIT_POLICY"] == "ACTIVE"
    # a core per rank, ranks past the cores sharing them from the first again: a default on vLLM, which the
    # caller may replace (nobind included), and always on SGLang, whose NUMA check wants a core per rank
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1, 0})
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    assert server_environment(VllmEngine(), tp=2)["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert server_environment(VllmEngine(), tp=3)["VLLM_CPU_OMP_THREADS_BIND"] == "0|1|0"
    # the cores this process may run on, not core 0 onwards: a container's cpuset
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5, 4})
    assert server_environment(VllmEngine(), tp=3)["VLLM_CPU_OMP_THREADS_BIND"] == "4|5|4"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1, 0})
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    assert server_environment(VllmEngine(), tp=3)["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    monkeypatch.setenv("SGLANG_CPU_OMP_THREADS_BIND", "0")
    assert server_environment(SglangEngine(), tp=3)["SGLANG_CPU_OMP_THREADS_BIND"] == "0|1|0"
    # the nodes of one host: each node's one rank unpinned, not both on core 0
    node = NodeRank(index=1, count=2, address="10.77.0.2", master="10.77.0.1", dist_port=29500)
    assert VllmEngine().node_env(node)["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


def test_the_gatherwise_sampler_variant_is_opt_in_and_reaches_the_engine_through_its_environment():
    from gatherwise.bench.serve.cli import DEFAULTS
    from gatherwise.bench.serve.configurations import CONFIGURATIONS

    variant = CONFIGURATIONS["sharded+gw-sampler"]
    assert variant.environment("/dev/shm/x") == {
        "GATHERWISE_ENABLE": "1", "GATHERWISE_ENGINE_SHM_DIR": "/dev/shm/x",
        "GATHERWISE_ENGINE_INITIAL_MODE": "sharded", "GATHERWISE_ENGINE_SAMPLER": "gatherwise"}
    assert CONFIGURATIONS["sharded"].environment("/d")["GATHERWISE_ENGINE_SAMPLER"] == "engine"
    assert CONFIGURATIONS["plain"].environment("/d") == {}
    # its tokens are gatherwise's, not the engine's: only asked for by name
    defaults = DEFAULTS["configurations"]
    assert isinstance(defaults, tuple) and "sharded+gw-sampler" not in defaults and "sharded" in defaults
    auto = CONFIGURATIONS["auto+gw-sampler"]
    assert auto.auto and auto.environment("/d")["GATHERWISE_ENGINE_SAMPLER"] == "gatherwise"
    assert auto.environment("/d")["GATHERWISE_ENGINE_INITIAL_MODE"] == "all_gather" and auto.name not in defaults


def test_configurations_run_forward_then_backward():
    assert interleaved(["a", "b", "c"], 2) == ["a", "b", "c", "c", "b", "a"]
    assert interleaved(["a", "b"], 3) == ["a", "b", "b", "a", "a", "b"]


def test_every_configuration_warms_up_alike_on_prompts_the_measured_pass_never_sees(tmp_path):
    def bench(warmup_rounds: int) -> ServeBench:
        return ServeBench(VllmEngine(), tmp_path, [], Workload(64, 32, seed=7), "python", tmp_path, None, 0.0,
                          warmup_rounds)

    rounds = phases(bench(2))
    assert [phase for phase, _ in rounds] == ["warmup", "warmup", "measured"]
    seeds = [workload.seed for _, workload in rounds]
    assert seeds[-1] == 7 and len(set(seeds)) == 3
    assert all((w.input_len, w.output_len) == (64, 32) for _, w in rounds)
    assert phases(bench(0)) == [("measured", Workload(64, 32, 7))]


def test_auto_is_compared_with_the_pinned_mode_in_its_own_start_in_abba_order_on_prompts_of_each_rounds_own(
        tmp_path):
    bench = ServeBench(VllmEngine(), tmp_path, [], Workload(64, 32, seed=7), "python", tmp_path, None, 0.0, 1,
                       auto_against="sharded")
    rounds = phases(bench, auto=True)
    assert [phase for phase, _ in rounds] == ["warmup", "measured", "pinned", "pinned", "auto"]
    assert len({workload.seed for _, workload in rounds}) == 5 and rounds[1][1].seed == 7
    assert phases(bench) == rounds[:2]  # a pinned configuration runs no in-start rounds

    def cell(phase: str, key: str, tok_s: float) -> dict:
        return {"phase": phase, "cell": key, "output_throughput": tok_s}

    runs = [{"configuration": "auto+gw-sampler", "pass": 0,
             "cells": [cell("warmup", "greedy-c1", 1.0), cell("measured", "greedy-c1", 10.0),
                       cell("pinned", "greedy-c1", 11.0), cell("pinned", "greedy-c1", 9.0),
                       cell("auto", "greedy-c1", 9.0)]},
            {"configuration": "plain", "pass": 0, "cells": [cell("measured", "greedy-c1", 5.0)]}]
    (found,) = in_start_comparison(runs, "sharded")
    assert found["auto_per_round"] == [10.0, 9.0] and found["pinned_per_round"] == [11.0, 9.0]
    assert found["auto_vs_pinned"] == pytest.approx(0.95)
    assert "auto / pinned 0.950x over 1 passes" in format_in_start([found])


def test_the_tokenizer_has_exactly_the_vocabulary_and_every_word_id_round_trips(tmp_path):
    write_tokenizer(tmp_path, 32000)
    tokens = TokenCounter(tmp_path)
    assert tokens.tokenizer.get_vocab_size(with_added_tokens=True) == 32000
    ids = random.Random(0).sample(range(3 + 256, 32000), 400)  # after the 3 specials and the 256 byte symbols
    assert tokens.ids(tokens.tokenizer.decode(ids)) == ids


def _scrape(path_s: dict[tuple[str, str], float], calls: dict[tuple[str, str], int]) -> str:
    lines = ["# TYPE gatherwise_op_seconds counter"]
    lines += [f'gatherwise_op_seconds_total{{engine="e",rank="{r}",op="logits_path",mode="{m}"}} {v}'
              for (r, m), v in path_s.items()]
    lines += [f'gatherwise_op_seconds_total{{engine="e",rank="{r}",op="sample",mode="{m}"}} 99'
              for (r, m) in path_s]
    lines += ["# TYPE gatherwise_calls counter"]
    lines += [f'gatherwise_calls_total{{engine="e",rank="{r}",mode="{m}"}} {v}' for (r, m), v in calls.items()]
    return "\n".join(lines) + "\n"


def test_the_share_is_the_slower_ranks_path_time_over_the_run():
    before = _scrape({("0", "all_gather"): 1.0, ("1", "all_gather"): 1.5}, {("0", "all_gather"): 10,
                                                                          ("1", "all_gather"): 10})
    after = _scrape({("0", "all_gather"): 1.5, ("1", "all_gather"): 2.5, ("0", "gather"): 1.0, ("1", "gather"): 0.5},
                    {("0", "all_gather"): 20, ("1", "all_gather"): 20, ("0", "gather"): 30, ("1", "gather"): 30})
    share = logits_share(before, after, duration_s=10.0)
    assert share["path_seconds"] == pytest.approx(1.5) and share["share"] == pytest.approx(0.15)  # rank 0: 0.5 + 1.0
    assert share["calls"] == 40 and share["path_us_per_call"] == pytest.approx(1.5e6 / 40)
    assert share["calls_by_mode"] == {"all_gather": 10, "gather": 30}
    assert logits_share("", "", 1.0)["share"] is None  # no gatherwise counters: the plain engine


def test_the_run_counts_its_own_top_p_rows_and_fallback_rows_once_over_a_groups_sidecars():
    def node(rows: int, fallback: int) -> str:
        return (_scrape({("0", "sharded"): 1.0}, {("0", "sharded"): 4})
                + f'gatherwise_topp_rows_total{{engine="e"}} {rows}\n'
                + f'gatherwise_topp_fallback_rows_total{{engine="e"}} {fallback}\n')

    rank_1_node = _scrape({("1", "sharded"): 1.0}, {("1", "sharded"): 4})  # not rank 0: exports no top-p rows
    share = logits_share([node(100, 7), rank_1_node], [node(160, 19), rank_1_node], duration_s=10.0)
    assert share["topp_rows"] == {"rows": 60, "fallback_rows": 12}
    assert logits_share("", "", 1.0)["topp_rows"] == {"rows": 0, "fallback_rows": 0}


def test_greedy_outputs_are_compared_token_for_token(tmp_path):
    write_tokenizer(tmp_path, 2000)
    tokens = TokenCounter(tmp_path)
    same = compare_outputs([" ab cd", " ef"], [" ab cd", " ef"], tokens)
    assert same == {"requests": 2, "equal": 2, "all_equal": True, "first_difference": None}
    differ = compare_outputs([" ab cd", " ef"], [" ab cd", " ef ab"], tokens)
    assert not differ["all_equal"] and differ["first_difference"] == {"request": 1, "token": 1}


def test_real_prompts_fit_the_input_length_and_every_round_and_cell_gets_its_own(tmp_path):
    write_tokenizer(tmp_path, 32000)
    (tmp_path / "config.json").write_text("{}")
    pool = RealPrompts.for_model(tmp_path, input_len=64)
    tokens = TokenCounter(tmp_path)
    paragraphs = documentation_paragraphs()
    assert not pool.chat and len(pool.prompts) > 500  # no chat template: the text itself, to continue
    assert all(len(tokens.ids(p)) <= 64 and any(par.startswith(p) for par in paragraphs) for p in pool.prompts)
    cells = build_cells(("greedy", "sampled"), (1, 8), prompts_per_slot=2, min_prompts=8)
    bench = ServeBench(VllmEngine(), tmp_path, cells, Workload(64, 32, seed=3), "python", tmp_path, None, 0.0, 1,
                       prompts=pool)
    drawn = [real_prompts(bench, r, cell) for r in (0, 1) for cell in cells]
    flat = [p for prompts in drawn for p in prompts or []]
    assert [len(p or []) for p in drawn] == [c.num_prompts for c in cells] * 2
    assert len(set(flat)) == len(flat)  # no prompt twice: warm-up rounds never hand the measured pass a prefix
    assert real_prompts(bench, 1, cells[0]) == drawn[len(cells)]  # the same for every configuration
    assert real_prompts(ServeBench(VllmEngine(), tmp_path, cells, Workload(64, 32, 3), "python", tmp_path, None,
                                   0.0, 1), 0, cells[0]) is None


@pytest.mark.parametrize("engine", [VllmEngine(), SglangEngine()], ids=["vllm", "sglang"])
def test_real_prompts_reach_each_client_as_its_own_dataset_file(engine, tmp_path):
    cell = build_cells(("greedy",), (2,), prompts_per_slot=2, min_prompts=4)[0]
    prompts = ["Why is the sky blue?", 'A "quoted"\nline']
    command = engine.client_command("python", tmp_path, "127.0.0.1", 1, cell, Workload(64, 32, 0),
                                    tmp_path / "client.json", prompts)
    path = command[command.index("--dataset-path") + 1]
    text = open(path).read()
    if engine.name == "vllm":
        assert [json.loads(line)["prompt"] for line in text.splitlines()] == prompts
        assert "--skip-chat-template" in command and command[command.index("--custom-output-len") + 1] == "32"
    else:
        assert [c["conversations"][0]["value"] for c in json.loads(text)] == prompts
        assert "--apply-chat-template" not in command and command[command.index("--sharegpt-output-len") + 1] == "32"
    random_dataset = engine.client_command("python", tmp_path, "127.0.0.1", 1, cell, Workload(64, 32, 0),
                                           tmp_path / "client.json")
    assert "--dataset-path" not in random_dataset and "64" in random_dataset



def test_cpu_is_counted_per_process_of_the_engines_session_by_the_title_it_gives_itself():
    """A stand-in server session (no engine runs here): its leader, and a child titled as vLLM titles its ranks
    that burns half a CPU second (/proc counts it in clock ticks: at least 0.4 s of it), then both sleep until
    killed."""
    import signal
    import subprocess
    import time

    burn = "import time\nwhile time.process_time() < 0.5: pass\ntime.sleep(60)"
    leader = ("import subprocess, sys, time; "
              f"subprocess.Popen(['VLLM::Worker_TP0', '-c', {burn!r}], executable=sys.executable); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", leader], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while (seen := CpuSnapshot.take(proc.pid, None).seconds).get("VLLM::Worker_TP0", 0.0) < 0.4:
            assert time.monotonic() < deadline, seen
            time.sleep(0.1)
        assert "server" in seen and "sidecar" not in seen and seen["host"] > 0
        assert not [label for label in seen if label.startswith("python")]  # every process of it is labelled
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_cores_busy_is_cpu_seconds_over_wall_seconds_and_the_table_means_the_passes():
    before = CpuSnapshot({"VLLM::Worker_TP0": 10.0, "sidecar": 1.0, "client": 0.0, "host": 100.0})
    after = CpuSnapshot({"VLLM::Worker_TP0": 18.0, "VLLM::Worker_TP1": 2.0, "sidecar": 1.5, "client": 1.0,
                         "host": 119.0})
    # the engine and the sidecar over the client's measured 10 s, the client and the host over its whole 20 s
    cores = cores_busy(before, after, 10.0, 20.0)
    assert cores == {"VLLM::Worker_TP0": 0.8, "VLLM::Worker_TP1": 0.2, "sidecar": 0.05, "client": 0.05, "host": 0.95}
    assert cores_busy(before, after, 0.0, 20.0) == {}
    cells = [{"phase": "measured", "cell": "greedy-c8", "sampling": "greedy", "concurrency": 8,
              "output_throughput": 1.0, "request_throughput": 1.0, "latencies_ms": {"tpot_p99": 1.0},
              "logits_path": None, "cpu_cores": c} for c in ({"host": 2.0, "sidecar": 0.1}, {"host": 1.0})]
    runs = [{"configuration": "sharded", "pass": p, "cells": [cell], "outputs": {}} for p, cell in enumerate(cells)]
    row, = summarize(runs, model=None)  # type: ignore[arg-type]  # no greedy comparison without a plain run
    assert row["cpu_cores"] == {"host": 1.5, "sidecar": 0.05}
    assert "host 1.50  sidecar 0.05" in format_cpu_table([row], ["sharded"])

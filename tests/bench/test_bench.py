"""`gatherwise bench`: argument validation, a tiny real sweep end to end, and the starting-table file."""

from __future__ import annotations

import json
import pathlib

import pytest

from gatherwise.bench.cli import build_parser, main
from gatherwise.modes import NUM_BUCKETS, Mode, ModeTable, bucket_label
from gatherwise.table_file import load_table_file, read_table_file, save_table_file


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rows", "1,,2"], "--rows: expected a comma-separated list"),
        (["--rows", ""], "--rows: expected a comma-separated list"),
        (["--rows", "1,two"], "--rows: 'two' is not an integer"),
        (["--rows", "0,1"], "--rows must be >= 1, got 0"),
        (["--rows", "-4"], "--rows must be >= 1, got -4"),
        (["--vocab", "32000,"], "--vocab: expected a comma-separated list"),
        (["--vocab", "0"], "--vocab must be >= 1, got 0"),
        (["--dtype", "float32,int8"], "--dtype: unknown dtype 'int8'"),
        (["--modes", "all_gather,scatter"], "--modes: unknown mode 'scatter'"),
        (["--sampling", "greedy,top_k=0"], "--sampling: bad sampling 'top_k=0'"),
        (["--sampling", "top_p=1"], "--sampling: bad sampling 'top_p=1'"),
        (["--sampling", "beam"], "--sampling: bad sampling 'beam'"),
        (["--tp", "0"], "--tp must be >= 1, got 0"),
        (["--iters", "0"], "--iters must be >= 1, got 0"),
        (["--warmup", "-1"], "--warmup must be >= 0, got -1"),
        (["--from-results", "/nonexistent/results.json"], "--from-results: no such file"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message_and_run_nothing(argv, message, capsys, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(out)])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()  # nothing ran, nothing was written


def test_lists_are_parsed_sorted_and_deduplicated():
    args = build_parser().parse_args(["--rows", "4, 1,2,4", "--dtype", "BFloat16,float32,bfloat16",
                                      "--modes", "gather,ALL_GATHER"])
    assert args.rows == (1, 2, 4)
    assert args.dtype == ("bfloat16", "float32")
    assert args.modes == ("gather", "all_gather")  # the interleaving order is the user's


def test_cuda_without_gpus_is_an_argument_error(capsys):
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has GPUs")
    with pytest.raises(SystemExit) as exc:
        main(["--device", "cuda", "--tp", "2"])
    assert exc.value.code == 2
    assert "--device cuda needs 2 GPUs" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_tiny_sweep_end_to_end(tmp_path, capsys):
    out = tmp_path / "sweep"
    rc = main(["--tp", "2", "--rows", "1,2", "--vocab", "1000", "--dtype", "float32,bfloat16",
               "--sampling", "greedy,top_p=0.9", "--iters", "2", "--warmup", "1", "--out", str(out),
               "--timeout", "150"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "winner" in printed and "busbw" in printed and "full-row fallback" in printed

    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["tp"] == 2 and doc["config"]["iters"] == 2
    assert doc["config"]["samplings"] == ["greedy", "top_p=0.9"]
    assert len(doc["results"]) == 2 * 2 * 2  # rows x dtypes x samplings (one vocab)
    for shape in doc["results"]:
        assert set(shape["modes"]) == {"all_gather", "gather", "sharded"}
        elem = 4 if shape["dtype"] == "float32" else 2
        assert shape["bytes"] == 2 * shape["rows"] * 500 * elem
        for st in shape["modes"].values():
            assert 0 < st["p10_us"] <= st["median_us"] <= st["p90_us"]
            assert st["busbw_gbs"] == pytest.approx(st["algbw_gbs"] / 2)
        ag, ga, sh = (shape["modes"][m] for m in ("all_gather", "gather", "sharded"))
        assert ga["broadcast_us"] > 0 and ag["broadcast_us"] == 0
        assert ag["wire_bytes"] == 2 * (shape["rows"] * 500 * elem + 8)  # each rank receives both shards + word
        if shape["sampling"] == "greedy":  # one exchange of (max, index) per row + the word, from each rank
            assert sh["broadcast_us"] == 0 and sh["wire_bytes"] == 2 * (1 + 2 * shape["rows"]) * 8
            assert sh["fallback_share"] is None
        else:  # random logits are flat: the nucleus is never inside 64 candidates, every row falls back
            assert sh["broadcast_us"] > 0 and sh["fallback_share"] == 1.0
        fastest = min(shape["modes"], key=lambda m: shape["modes"][m]["median_us"])
        assert shape["winner"] == fastest and shape["ratio"] >= 1.0
        assert 0.0 <= shape["paired_win_share"] <= 1.0

    png = (out / "crossover.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000

    # one starting table per (vocab, dtype, sampling)
    assert set(doc["table_files"]) == {"1000/float32", "1000/bfloat16", "1000/float32/top_p=0.9",
                                       "1000/bfloat16/top_p=0.9"}
    for dtype in ("float32", "bfloat16"):
        name = doc["table_files"][f"1000/{dtype}"]
        loaded = read_table_file(out / name)
        table = loaded.mode_table()
        assert loaded.meta["tp"] == 2 and loaded.meta["vocab"] == 1000 and loaded.meta["dtype"] == dtype
        clear = {s["rows"]: s["winner"] for s in doc["results"]
                 if s["dtype"] == dtype and s["clear"] and s["sampling"] == "greedy"}
        beyond = {table.mode_for_rows(r).label for r in (2, 3, 256, 100_000)}
        assert len(beyond) == 1  # everything past the last measured bucket copies it
        for rows, winner in clear.items():  # clear winners are kept (ties take a decided neighbour)
            assert table.mode_for_rows(rows).label == winner

    # re-rendering from results.json measures nothing and reproduces the same outputs
    again = tmp_path / "again"
    assert main(["--from-results", str(out / "results.json"), "--out", str(again)]) == 0
    assert json.loads((again / "results.json").read_text())["results"] == doc["results"]
    for name in doc["table_files"].values():
        assert load_table_file(again / name) == load_table_file(out / name)
    assert (again / "crossover.png").is_file()


def test_table_file_round_trips_into_a_mode_table(tmp_path):
    table = ModeTable.uniform(Mode.ALL_GATHER).with_buckets(Mode.GATHER, [0, 1, 2, 9])
    path = save_table_file(tmp_path / "t.yaml", table, {"tp": 4, "vocab": 152064, "dtype": "bfloat16"})
    assert load_table_file(path) == table
    loaded = read_table_file(path)
    assert loaded.meta == {"tp": 4, "vocab": 152064, "dtype": "bfloat16"}
    assert ModeTable.from_labels(json.loads(json.dumps(table.as_labels()))) == table  # the API's form agrees


def test_table_file_missing_buckets_take_the_nearest_listed_one(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("table:\n  1: gather\n  8: all_gather\n  64: gather\n")  # unquoted keys are fine too
    table = load_table_file(path)
    expected = {1: "gather", 2: "gather", 4: "all_gather", 8: "all_gather", 16: "all_gather", 32: "gather",
                64: "gather", 32768: "gather"}
    for rows, mode in expected.items():
        assert table.mode_for_rows(rows).label == mode, rows
    assert len(table.as_labels()) == NUM_BUCKETS


@pytest.mark.parametrize(
    "text, message",
    [
        ("table:\n  '3': gather\n", "table key '3'"),
        ("table:\n  'x': gather\n", "table key 'x'"),
        ("table:\n  '1': scatter\n", "table['1']: unknown mode 'scatter'"),
        ("table:\n  '2': 1\n", "table['2']: mode must be a string"),
        ("table: {}\n", "key 'table' must be a non-empty mapping"),
        ("tp: 2\n", "key 'table' must be a non-empty mapping"),
        ("- 1\n- 2\n", "expected a mapping"),
        ("tp: 0\ntable: {'1': gather}\n", "key 'tp' must be an integer >= 1"),
        ("tp: true\ntable: {'1': gather}\n", "key 'tp' must be an integer >= 1"),
        ("vocab: 2.5\ntable: {'1': gather}\n", "key 'vocab' must be an integer >= 1"),
        ("table: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_table_files_raise_value_error_naming_file_and_key(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as exc:
        load_table_file(path)
    assert str(path) in str(exc.value)
    assert message in str(exc.value)


def test_bucket_labels_in_the_file_are_the_api_labels(tmp_path):
    path = save_table_file(tmp_path / "t.yaml", ModeTable.uniform(Mode.GATHER), {})
    import yaml

    assert list(yaml.safe_load(path.read_text())["table"]) == [bucket_label(b) for b in range(NUM_BUCKETS)]


def test_bench_table_file_is_the_engines_starting_table(tmp_path):
    """engine.initial_table_file (config) loads what the bench writes: the engine starts on the measured table."""
    from gatherwise.bench.report import ModeStats, ShapeResult
    from gatherwise.bench.starting_table import best_table
    from gatherwise.config import EngineSection, GatherwiseConfig
    from gatherwise.engine_hooks.install import initial_table

    def shape(rows: int, ag: float, g: float, wins: float = 1.0) -> ShapeResult:
        st = lambda t: ModeStats(t, t, t, 0.0, 0.0, 0.0, 0.0, 0.0)
        return ShapeResult(32000, "float32", rows, 0, {"all_gather": st(ag), "gather": st(g)},
                           "all_gather" if ag <= g else "gather", 1.0, wins)

    measured = best_table([shape(1, 1.0, 2.0), shape(2, 1.0, 2.0), shape(8, 3.0, 2.0), shape(64, 9.0, 4.0)])
    assert [measured.mode_for_rows(r).label for r in (1, 2, 4, 8, 16, 64, 4096)] == [
        "all_gather", "all_gather", "all_gather", "gather", "gather", "gather", "gather"]
    # a tie (rows 16: all_gather by the median, but only 55% of pairs) takes the nearest decided bucket
    with_tie = best_table([shape(1, 1.0, 2.0), shape(16, 1.0, 1.1, wins=0.55), shape(32, 3.0, 2.0)])
    assert [with_tie.mode_for_rows(r).label for r in (1, 2, 4, 8, 16, 32, 4096)] == [
        "all_gather", "all_gather", "all_gather", "gather", "gather", "gather", "gather"]
    # nothing decided at all: the medians pick
    assert best_table([shape(4, 1.0, 1.1, wins=0.5)]) == ModeTable.uniform(Mode.ALL_GATHER)
    path = save_table_file(tmp_path / "t.yaml", measured, {"tp": 2, "vocab": 32000, "dtype": "float32"})
    config = GatherwiseConfig(engine=EngineSection(initial_table_file=str(path)))
    assert initial_table(config) == measured


def test_crossovers_skip_ties_and_interpolate_log_log():
    from gatherwise.bench.report import ModeStats, ShapeResult, find_crossovers

    def shape(rows: int, ag: float, g: float, wins: float) -> ShapeResult:
        st = lambda t: ModeStats(t, t, t, 0.0, 0.0, 0.0, 0.0, 0.0)
        winner = "all_gather" if ag <= g else "gather"
        return ShapeResult(1000, "float32", rows, 0, {"all_gather": st(ag), "gather": st(g)}, winner,
                           max(ag, g) / min(ag, g), wins)

    shapes = [shape(1, 1.0, 2.0, 0.9), shape(2, 2.0, 1.9, 0.5), shape(4, 4.0, 2.0, 0.95), shape(8, 8.0, 4.0, 1.0)]
    (c,) = find_crossovers(shapes)  # the tie at rows 2 neither counts as a crossing nor hides the real one
    assert (c.before, c.after, c.rows_below, c.rows_above) == ("all_gather", "gather", 1, 4)
    assert c.rows_estimate == pytest.approx(2.0)  # log(t_ag/t_g) goes -log2 -> +log2 over rows 1 -> 4
    assert not shapes[1].clear and shapes[0].clear


def test_bench_table_file_round_trips_through_the_auto_policy(tmp_path):
    """bench table file -> policy.table_file load -> ModePolicy starts from it -> exported -> loads back equal."""
    from gatherwise.sidecar.api.control_models import LearnedTable
    from gatherwise.sidecar.policy.mode_policy import ModePolicy, PolicyParams

    measured = ModeTable.uniform(Mode.GATHER).with_buckets(Mode.ALL_GATHER, [0, 1])
    path = save_table_file(tmp_path / "table_tp2_v32000_float32.yaml", measured,
                           {"tp": 2, "vocab": 32000, "dtype": "float32", "source": "gatherwise bench"})
    policy = ModePolicy(PolicyParams(), ModeTable.uniform(Mode.ALL_GATHER), auto=True)
    decision = policy.adopt_table(load_table_file(path), now=0.0, source=str(path))
    assert decision is not None and decision.reason == "table_file"
    assert policy.learned_table() == measured and policy.desired_table() == measured

    # GET /v1/policy/table returns this model; saved as JSON it is a valid table file again
    exported = LearnedTable(tp=2, vocab=32000, dtype="float32", source="sidecar", policy=policy.policy_label,
                            table=policy.learned_table().as_labels())
    again = tmp_path / "exported.json"
    again.write_text(exported.model_dump_json())
    assert load_table_file(again) == measured


@pytest.mark.timeout(60)
def test_table_file_module_never_imports_torch():
    """The sidecar's policy loads table files: gatherwise.table_file must stay pydantic + yaml."""
    import subprocess
    import sys

    code = ("import sys, gatherwise.table_file, gatherwise.bench.cli\n"
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


@pytest.mark.timeout(120)
def test_sampler_bench_end_to_end(tmp_path, capsys):
    """`gatherwise bench sampler` on a small shape: every gatherwise variant timed, engines that do not import
    here said so (not silently dropped), JSON and PNG written."""
    out = tmp_path / "sampler"
    rc = main(["sampler", "--vocab", "1000", "--batch", "1,3", "--iters", "1", "--warmup", "0", "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    assert (out / "sampler.png").stat().st_size > 0
    assert len(doc["results"]) == 2 * 3 * 2  # logits kinds x samplings x batches
    for engine, state in doc["engines"].items():
        assert state == "measured" or state.startswith("not measured:"), engine
    for shape in doc["results"]:
        assert {"gatherwise/all_gather", "gatherwise/sharded"} <= set(shape["median_ms"])
        measured = {e for e, s in doc["engines"].items() if s == "measured"}
        assert set(shape["median_ms"]) - {"gatherwise/all_gather", "gatherwise/sharded"} == measured
        assert 1 <= shape["nucleus"]["min"] <= shape["nucleus"]["max"] <= 1000
    flat_top_p = [s for s in doc["results"] if s["logits"] == "flat" and s["sampling"] == "top_p"]
    assert all(s["sharded_fallback_rows"] == s["batch"] for s in flat_top_p)  # nuclei of hundreds fall back
    assert "gatherwise/all_gather ms" in capsys.readouterr().out


def test_sampler_bench_refuses_unknown_names(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["sampler", "--sampling", "beam"])
    assert exc.value.code == 2
    assert "unknown sampling 'beam'" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_sampler_bench_on_real_rows_takes_the_models_rows_vocab_and_tp(tmp_path: pathlib.Path) -> None:
    """`--logits real:<model>`: the rows saved for the sampling's temperature, their vocab, the model's engine TP;
    a missing rows file names the command that makes it."""
    import torch

    torch.save(torch.randn(8, 300, generator=torch.Generator().manual_seed(1)) * 4, tmp_path / "rows-smollm2-T1.0.pt")
    out = tmp_path / "sampler"
    argv = ["sampler", "--logits", "real:smollm2", "--rows-dir", str(tmp_path), "--sampling", "top_p_t1", "--batch",
            "1,3", "--iters", "1", "--warmup", "0", "--engines", "vllm", "--out", str(out)]
    assert main(argv) == 0
    doc = json.loads((out / "results.json").read_text())
    assert [(r["logits"], r["vocab"], r["tp"], r["batch"]) for r in doc["results"]] == [
        ("real:smollm2", 300, 3, 1), ("real:smollm2", 300, 3, 3)]
    assert all(r["nucleus"]["temperature"] == 1.0 for r in doc["results"])
    with pytest.raises(SystemExit, match=r"python -m gatherwise\.bench\.real_rows --model smollm2"):
        main([a.replace("top_p_t1", "top_p") for a in argv])  # no rows saved at T 0.8

"""`gatherwise bench serve --nodes/--link-rate`: what the two-node layout needs is refused before anything starts
(no root, no engine, no namespace needed)."""

from __future__ import annotations

import pytest

from gatherwise.bench.serve import cli


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_link_rate_needs_two_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    assert "needs --nodes 2" in _error(capsys, ["--engine", "sglang", "--link-rate", "100mbit"])
    assert "needs --nodes 2" in _error(capsys, ["--engine", "sglang", "--nodes", "1", "--link-rate", "1gbit"])


def test_link_rate_is_a_tc_rate(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    assert "tc rate" in _error(capsys, ["--engine", "sglang", "--nodes", "2", "--link-rate", "fast"])
    assert "tc rate" in _error(capsys, ["--engine", "sglang", "--nodes", "2", "--link-rate", "100"])


def test_two_nodes_need_root(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.os, "geteuid", lambda: 1000)
    assert "needs root" in _error(capsys, ["--engine", "sglang", "--nodes", "2", "--link-rate", "100mbit"])


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_two_nodes_run_either_engine(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    parser = cli.build_parser()
    cli.check_nodes(parser, parser.parse_args(["--engine", engine, "--nodes", "2", "--link-rate", "100mbit"]))


def test_node_counts_are_one_or_two(capsys: pytest.CaptureFixture[str]) -> None:
    assert "invalid choice" in _error(capsys, ["--engine", "sglang", "--nodes", "3"])


@pytest.mark.parametrize("rate", ["100mbit", "1gbit", "10Mbit", "2.5gbit", "500kbit", "125mbps"])
def test_tc_rates_pass(rate: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    parser = cli.build_parser()
    args = parser.parse_args(["--engine", "sglang", "--nodes", "2", "--link-rate", rate])
    cli.check_nodes(parser, args)  # no error


def test_one_node_output_directory_is_unchanged() -> None:
    assert cli._layout_suffix(1, None) == ""
    assert cli._layout_suffix(2, None) == "-2nodes-unlimited"
    assert cli._layout_suffix(2, "10mbit") == "-2nodes-10mbit"

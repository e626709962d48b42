"""`gatherwise mode`: its options are accepted before and after the subcommand, where users put them."""

from __future__ import annotations

import pytest

from gatherwise.sidecar.api.mode_cli import build_parser, main

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens there


@pytest.mark.parametrize(("before", "after"), [
    (["--url", "http://127.0.0.1:1", "--json", "get"], ["get", "--url", "http://127.0.0.1:1", "--json"]),
    (["--url", "http://127.0.0.1:1", "--token", "t", "--wait", "3", "--json", "set", "gather"],
     ["set", "gather", "--url", "http://127.0.0.1:1", "--token", "t", "--wait", "3", "--json"]),
    (["--wait", "3", "set", "auto", "--token", "t"], ["set", "auto", "--token", "t", "--wait", "3"]),
])
def test_an_option_means_the_same_before_and_after_the_subcommand(before: list[str], after: list[str]) -> None:
    assert build_parser().parse_args(before) == build_parser().parse_args(after)


def test_defaults_hold_when_no_option_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GATHERWISE_API_TOKEN", raising=False)
    args = build_parser().parse_args(["set", "gather"])
    assert (args.wait, args.token, args.json) == (5.0, None, False)


@pytest.mark.parametrize("argv", [["get", "--json", "--url", UNREACHABLE], ["--url", UNREACHABLE, "get", "--json"],
                                  ["set", "gather", "--url", UNREACHABLE, "--token", "t", "--json"]])
def test_either_order_reaches_the_sidecar(argv: list[str]) -> None:
    assert main(argv) == 3  # 3: the sidecar is unreachable (an argparse error would be 2)

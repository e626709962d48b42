"""The tests mirror the code: no test module sits flat in tests/, and every folder of tests names the folder of the
code it tests, or is one of the few suites that cut across the code (each named here with why)."""

from __future__ import annotations

from tests._repo import ROOT

TESTS = ROOT / "tests"
# a test folder whose code folder has another name
CODE_FOLDER = {"core": "gatherwise", "bench": "gatherwise_bench"}
ACROSS_THE_CODE = {
    "docs": "the docs kept true against the code they describe",
    "faults": "faults injected from outside: signals, hostile files and clients, killed processes",
    "vllm": "the vLLM adapter inside real vLLM, in vLLM's own environment (make test-vllm)",
    "sglang": "the SGLang adapter inside real SGLang, in SGLang's own environment (make test-sglang)",
    "machine": "checks of a machine as a whole: a GPU, two nodes",
}


def _test_folders() -> list[str]:
    return sorted({str(p.parent.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")})


def test_no_test_module_sits_flat_in_tests():
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []


def test_every_test_folder_names_the_code_folder_it_tests():
    unmatched = []
    for folder in _test_folders():
        top, *rest = folder.split("/")
        if top in ACROSS_THE_CODE:
            continue
        if not ROOT.joinpath(CODE_FOLDER.get(top, top), *rest).is_dir():
            unmatched.append(folder)
    assert unmatched == []

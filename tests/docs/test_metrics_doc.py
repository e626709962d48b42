"""docs/metrics.md's families table (family, type, labels) against what real `gatherwise sidecar` processes export
when scraped, both ways: one sidecar on a single-node engine (rings in every mode, its control block, a hooks-off
notice, a mode switch), one on a node of a two-node engine (the node-local families, the observer role)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from itertools import count
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gatherwise.engine_hooks.control_block import ControlBlockSource
from gatherwise.engine_hooks.recorder import RingRecorder
from gatherwise.modes import Mode, ModeTable
from gatherwise.shm_format.control import control_path
from gatherwise.shm_format.engine_info import RankRoute, write_rank_info
from gatherwise.shm_format.liveness import LivenessLock
from gatherwise.shm_format.node_ranks import write_node_ranks
from gatherwise.shm_format.private_files import ensure_private_dir
from gatherwise.shm_format.ring import engine_dir, ring_path
from tests import _hooks_off
from tests._sidecar import scrape, start_sidecar, wait_for
from tests.docs.markdown import read, table
from tests.sidecar.ingest.test_sidecar_ingest import write_call

DOC = "docs/metrics.md"
TOKEN = "metrics-doc-token"
Family = tuple[str, frozenset[str]]  # (type, label names)


class EngineFiles:
    """One engine directory as its ranks leave it: liveness locks, rings, rank 0's control block where the
    directory holds rank 0, the node file."""

    def __init__(self, shm: Path, engine_id: int, tp: int, ranks: tuple[int, ...], node: int, nodes: int) -> None:
        self.dir = Path(ensure_private_dir(engine_dir(ensure_private_dir(shm), engine_id)))
        self.locks = [LivenessLock(self.dir, r) for r in ranks]
        self.block = (ControlBlockSource(control_path(shm, engine_id), engine_id=engine_id, tp_size=tp,
                                         table=ModeTable.uniform(Mode.ALL_GATHER)) if 0 in ranks else None)
        self.rings = [RingRecorder(ring_path(shm, engine_id, r), engine_id=engine_id, rank=r, tp_size=tp,
                                   vocab=1000, dtype="float32", capacity=256) for r in ranks]
        write_node_ranks(self.dir, tp, ranks, node, nodes)
        for r in ranks:  # what an adapter's rank says of its runner (gatherwise_engine_route_info)
            write_rank_info(self.dir, r, "vLLM", "0.34.0", {}, "a-model", RankRoute(
                "vllm.v1.worker.gpu.model_runner.GPUModelRunner", "vLLM's Model Runner V2",
                "vllm 0.34.0: 23 of 23 points match"))
        self.calls = count()  # call indices, in order across rounds

    def write_calls(self, calls: int) -> None:
        """The next `calls` calls, in every mode (sharded ones with top-p rows, one falling back), in two buckets."""
        now = time.perf_counter_ns()
        for k in range(calls):
            i = next(self.calls)
            mode = (Mode.ALL_GATHER, Mode.GATHER, Mode.SHARDED)[i % 3]
            for ring in self.rings:
                write_call(ring, i, mode, 3 if i % 2 else 8, now + k * 50_000, fallback_rows=1)

    def close(self) -> None:
        for ring in self.rings:
            ring.close()
        if self.block is not None:
            self.block.close()
        for lock in self.locks:
            lock.close()


def _scrape_holding(url: str, needs: tuple[str, ...]) -> str | None:
    text = scrape(url)
    return text if all(need in text for need in needs) else None


def _rounds_until(url: str, engine: EngineFiles, needs: tuple[str, ...]) -> Callable[[], str | None]:
    """A probe for wait_for: each try writes the next 30 calls, then scrapes; the scrape once it holds `needs`."""
    def probe() -> str | None:
        engine.write_calls(30)
        return _scrape_holding(url, needs)

    return probe


def exported(text: str) -> dict[str, Family]:
    """Family name as the docs write it (counters with `_total`) -> its type and label names."""
    out: dict[str, Family] = {}
    for family in text_string_to_metric_families(text):
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = frozenset(k for s in family.samples for k in s.labels if k != "le")
        out[name] = (family.type, labels | out.get(name, ("", frozenset()))[1])
    return out


def documented(text: str) -> dict[str, Family]:
    rows = table(text, "Families", "family", "type", "labels").rows
    return {row["family"].strip("`"): (row["type"], frozenset(filter(None, re.split(r"\s*,\s*", row["labels"]))))
            for row in rows}


def metrics_differences(doc: dict[str, Family], scraped: dict[str, Family]) -> list[str]:
    out = []
    for name in sorted(set(doc) | set(scraped)):
        if name not in scraped:
            out.append(f"{name}: documented, but not exported")
        elif name not in doc:
            out.append(f"{name}: exported, not documented")
        elif doc[name] != scraped[name]:
            out.append(f"{name}: documented {doc[name][0]} {{{','.join(sorted(doc[name][1]))}}}, exported "
                       f"{scraped[name][0]} {{{','.join(sorted(scraped[name][1]))}}}")
    return out


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Family]]:
    root = tmp_path_factory.mktemp("metrics-doc")
    config = root / "sidecar.yaml"
    config.write_text(f"sidecar:\n  api_token: {TOKEN}\n")
    with ExitStack() as stack:
        whole = EngineFiles(root / "single", 0x5EED, 2, (0, 1), 0, 1)
        stack.callback(whole.close)
        node1 = EngineFiles(root / "node1", 0x5EEE, 4, (2, 3), 1, 2)
        stack.callback(node1.close)
        reporter = _hooks_off.start_reporter(str(root / "single"))
        stack.callback(_hooks_off.stop, reporter)
        texts = []
        # what each sidecar shows once it has read enough calls: the policy learns a call's cost from the steps
        # after it, so calls are written in rounds until its estimates are there too
        for engine, shm, needs in ((whole, root / "single", ("gatherwise_step_critical_path_seconds_count",
                                                             "gatherwise_mode_switches_total{",
                                                             "gatherwise_policy_estimate_seconds{")),
                                   (node1, root / "node1", ("gatherwise_node_step_critical_path_seconds_count",))):
            proc, url = start_sidecar(str(shm), config=str(config))
            stack.callback(proc.stop)
            wait_for(_rounds_until(url, engine, ("_count",)), 60, "the sidecar's first histograms")
            if engine is whole:  # a manual switch: a decision, so the switch counter has a series
                answer = httpx.put(f"{url}/v1/mode", params={"wait": 0}, json={"mode": "gather", "buckets": [4]},
                                   headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
                assert answer.status_code in (200, 202), answer.text
            texts.append(wait_for(_rounds_until(url, engine, needs), 60, f"a scrape holding {needs}"))
        scraped: dict[str, Family] = {}
        for text in texts:
            for name, (kind, labels) in exported(text).items():
                scraped[name] = (kind, labels | scraped.get(name, ("", frozenset()))[1])
        yield scraped


def test_the_documented_families_are_what_the_sidecar_exports(scraped: dict[str, Family]) -> None:
    assert metrics_differences(documented(read(DOC)), scraped) == []


def test_a_planted_family_and_label_are_found(scraped: dict[str, Family]) -> None:
    text = read(DOC)
    renamed = text.replace("| `gatherwise_calls_total` | counter | engine, rank, mode |",
                           "| `gatherwise_calls_total` | counter | engine, rank, mode, bucket |")
    assert metrics_differences(documented(renamed), scraped) == [
        "gatherwise_calls_total: documented counter {bucket,engine,mode,rank}, exported counter {engine,mode,rank}"]
    dropped = text.replace("| `gatherwise_engine_up` |", "| `gatherwise_engine_alive` |")
    assert metrics_differences(documented(dropped), scraped) == [
        "gatherwise_engine_alive: documented, but not exported", "gatherwise_engine_up: exported, not documented"]

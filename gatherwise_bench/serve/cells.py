"""What one client run measures: a sampling setting at one concurrency level, with how many requests."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    name: str
    temperature: float
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


SAMPLINGS = {s.name: s for s in (Sampling("greedy", 0.0), Sampling("temperature", 0.8), Sampling("sampled", 0.8, 0.9),
                                  Sampling("sampled-p95", 0.8, 0.95), Sampling("sampled-t1", 1.0, 0.95))}


@dataclass(frozen=True)
class Cell:
    sampling: Sampling
    concurrency: int
    num_prompts: int

    @property
    def key(self) -> str:
        return f"{self.sampling.name}-c{self.concurrency}"


def build_cells(samplings: tuple[str, ...], concurrencies: tuple[int, ...], prompts_per_slot: int,
                min_prompts: int) -> list[Cell]:
    """Every sampling at every concurrency; each run sends `prompts_per_slot` requests per concurrency slot (at
    least `min_prompts`), so the server spends most of the run at the concurrency it is measured at."""
    return [Cell(SAMPLINGS[s], c, max(min_prompts, prompts_per_slot * c)) for s in samplings for c in concurrencies]

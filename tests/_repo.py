"""The checkout's root, for tests that read its files (docs, configs, scripts, the code's own tree)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

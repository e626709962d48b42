"""Measurements run from a checkout (`python -m lab.<name>`), never installed: each writes JSON (and figures) for
docs/BENCHMARKS.md, and tests/lab/test_lab_smoke.py runs every one at tiny size so none rots."""

"""Write the verified fingerprints of one engine release into the package's data: from an installed tree (a
site-packages directory) or a wheel file, read without importing the engine.

    python -m gatherwise.engine_hooks.fingerprints.generate vllm ~/.cache/gatherwise/wheels/vllm-0.34.0-…whl
    python -m gatherwise.engine_hooks.fingerprints.generate sglang .venv-sglang/lib/python3.11/site-packages

Run it only for a release the adapter has been verified against (run-tested, or read against the adapter).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gatherwise.engine_hooks.fingerprints.engines import ENGINES
from gatherwise.engine_hooks.fingerprints.source_tree import open_tree
from gatherwise.engine_hooks.fingerprints.verified import DATA_DIR, write_release


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=sorted(ENGINES))
    parser.add_argument("source", type=Path, help="a site-packages directory or a wheel file")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = parser.parse_args(argv)
    release = ENGINES[args.engine].release(open_tree(args.source))
    path = write_release(release, args.data_dir)
    absent = sorted(p.name for p, fp in release.points.items() if not fp.present)
    print(f"{path}: {len(release.points)} points, {len(absent)} absent{': ' if absent else ''}{', '.join(absent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

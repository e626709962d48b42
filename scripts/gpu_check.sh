#!/usr/bin/env bash
# The prepared GPU check: scripts/gpu_check.sh OUTDIR [--cpu] [--only a,b]
#
# Runs from a plain checkout on a machine with torch (CUDA build), pyyaml and prometheus-client; needs no
# network and installs nothing. Writes OUTDIR/gpu_check.json and OUTDIR/summary.txt in under 8 minutes.
# If a C compiler is there it first builds the compiled ring record writer in place (as `pip install` would);
# otherwise the pure-Python writer runs and the report says so. --cpu runs the CPU-only parts (make test does).
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 OUTDIR [--cpu] [--only check1,check2]" >&2
  exit 2
fi
mkdir -p "$1"
outdir=$(cd "$1" && pwd)  # absolute: the checks run from another directory
shift
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
cd "$root"
# Uninstalled, the checkout's floors are laid out as the one installed `gatherwise` package (symlinks).
tree=$("$python" scripts/package_tree.py "$root/build/package-tree")
# The rest runs from inside the tree: `python -c` and `python -m` put the current directory first on sys.path, and
# from the checkout's root its gatherwise/ folder (the core alone) would hide the tree's whole package. The root
# comes after the tree, for `tests`: the checks are the module tests.machine.gpu_checks.
export PYTHONPATH="$tree:$root${PYTHONPATH:+:$PYTHONPATH}"
cd "$tree"
if ! "$python" -c "import gatherwise.engine_hooks._ring_writer" 2>/dev/null && command -v cc >/dev/null; then
  suffix=$("$python" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
  include=$("$python" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
  cc -O2 -shared -fPIC -I"$include" "$root/engine_hooks/_ring_writer.c" -o "$root/engine_hooks/_ring_writer$suffix" \
    2>"$outdir/build_ring_writer.log" || echo "compiled record writer not built (see build_ring_writer.log)"
fi
exec timeout 480 "$python" -m tests.machine.gpu_checks "$outdir" "$@"

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
outdir=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
mkdir -p "$outdir"
cd "$root"
if ! "$python" -c "import gatherwise.engine_hooks._ring_writer" 2>/dev/null && command -v cc >/dev/null; then
  suffix=$("$python" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
  include=$("$python" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
  cc -O2 -shared -fPIC -I"$include" engine_hooks/_ring_writer.c -o "engine_hooks/_ring_writer$suffix" \
    2>"$outdir/build_ring_writer.log" || echo "compiled record writer not built (see build_ring_writer.log)"
fi
# Uninstalled, the checkout's floors are laid out as the one installed `gatherwise` package (symlinks).
tree=$("$python" scripts/package_tree.py "$root/build/package-tree")
export PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 480 "$python" scripts/gpu_check.py "$outdir" "$@"

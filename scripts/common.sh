# The preamble of every GPU script here: sourced, never run. It moves to the repository root, sets OUT (where
# results and logs go; default /tmp/gmlake-out), records the machine in $OUT/machine.txt and installs this checkout
# in editable mode (GMLAKE=1 needs the installed gmlake_autoload.pth), unless SKIP_BUILD=1.
#   . "$(dirname "$0")/common.sh"
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0               # NVLink multicast stays off on shared machines
OUT=${OUT:-/tmp/gmlake-out}
mkdir -p "$OUT"
# PACK_OUT=1: when the script ends, everything under $OUT becomes one file, $OUT/results.tgz (for a machine that
# hands back only a few files; a suite writes one per run)
if [ "${PACK_OUT:-0}" = 1 ]; then
  trap 'tar czf /tmp/gmlake-results.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete &&
        mv /tmp/gmlake-results.tgz "$OUT/results.tgz"' EXIT
fi
START=$SECONDS
stamp() { echo "[$((SECONDS - START)) s] $*"; }
{ date -u +%FT%TZ
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)' 2>&1
  git log --oneline -1 2>/dev/null || echo "not a git checkout"
} | tee "$OUT/machine.txt"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  if ! python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"; exit 1
  fi
  stamp "built and installed (log: $OUT/build.log)"
fi

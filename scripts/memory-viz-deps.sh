#!/usr/bin/env bash
# What tests/test_memory_viz.py's browser tests need, on a Debian machine as root (CI runs it):
#   - Chromium and node-d3 (d3 5, which PyTorch's viewer imports), from Debian;
#   - PyTorch's viewer itself, torch/utils/viz/MemoryViz.js. No torch wheel ships it, so it is taken from Debian's
#     pytorch source package (trixie) through apt, which checks the download against Debian's signed index, into
#     .cache/memory_viz/MemoryViz.js, where the tests look when $GMLAKE_MEMORY_VIZ_JS is unset;
#   - torch in .venv (torch.cuda._memory_viz writes the HTML), where .venv exists and has none.
# Nothing here is vendored into the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=.cache/memory_viz
missing=()
command -v chromium >/dev/null || missing+=(chromium)
[ -f /usr/share/nodejs/d3/dist/d3.min.js ] || missing+=(node-d3)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ! -s "$CACHE/MemoryViz.js" ]; then
  sources=/etc/apt/sources.list.d/debian.sources
  [ -f "$sources" ] || { echo "memory-viz-deps: no $sources to find Debian's archive in" >&2; exit 2; }
  work=$(mktemp -d)
  chmod 755 "$work"                     # apt downloads as its own user, _apt
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/lists/partial"
  printf 'Types: deb-src\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: %s\n' \
    "$(awk '/^URIs:/ {print $2; exit}' "$sources")" /usr/share/keyrings/debian-archive-keyring.gpg >"$work/src.sources"
  # A private source list and index: the machine's own apt configuration stays as it is.
  apt_private=(-o "Dir::Etc::SourceList=$work/src.sources" -o Dir::Etc::SourceParts=/nonexistent
               -o "Dir::State::Lists=$work/lists")
  apt-get -qq "${apt_private[@]}" update
  (cd "$work" && apt-get -qq "${apt_private[@]}" source --download-only pytorch 2>/dev/null)
  tar -xJf "$work"/pytorch_*.orig.tar.xz -C "$work" --wildcards '*/torch/utils/viz/MemoryViz.js'
  mkdir -p "$CACHE"
  cp "$work"/*/torch/utils/viz/MemoryViz.js "$CACHE/MemoryViz.js"
  echo "memory-viz-deps: $CACHE/MemoryViz.js from $(basename "$work"/pytorch_*.orig.tar.xz)"
fi
if [ -x .venv/bin/python ] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install --quiet torch==2.13.0
fi

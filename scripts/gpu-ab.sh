#!/usr/bin/env bash
# Did a change make the core faster? Two revisions of gmlake side by side on one GPU machine (about 4 minutes):
# builds each in its own git worktree (in parallel), then alternates them on the same host, so that the machine's
# drift falls on both: the core's cache hits (`python -m bench micro --cache-hits`, A B B A ...) and torch.empty +
# del through torch (`bench latency`'s timed loop, pinned to one CPU: native, A, B, then B, A, native, ...).
#   ROUNDS=3 scripts/gpu-ab.sh REV_A REV_B
# A revision of "." is the working tree as it is (tracked and untracked files git does not ignore), for a change
# not yet committed. Each side is timed by its own revision's code; the latency loop is this checkout's.
# DRIVER=sim LATENCY=0 runs the same on a machine without a GPU (the sim driver's cache hits only).
# Results in $OUT: ab.json (every run), ab.txt (medians and B / A), build-{A,B}.log, machine.txt.
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: scripts/gpu-ab.sh REV_A REV_B" >&2; exit 2; }
git rev-parse --git-dir >/dev/null 2>&1 \
  || { echo "gpu-ab.sh: run it in a git checkout of gmlake: it builds the two revisions in worktrees" >&2; exit 2; }
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gmlake-out}
ROUNDS=${ROUNDS:-3}
DRIVER=${DRIVER:-cuda}
LATENCY=${LATENCY:-1}
ROOT=$PWD
mkdir -p "$OUT"
START=$SECONDS
declare -A TREE=([A]=/tmp/gmlake-ab-A [B]=/tmp/gmlake-ab-B)
SCRATCH=$(mktemp -d)     # the latency runs start here: neither tree's folders shadow the modules they import
trap 'for t in "${TREE[@]}"; do git worktree remove --force "$t" 2>/dev/null || rm -rf "$t"; done; rm -rf "$SCRATCH"' EXIT
for side in A B; do
  rev=$([ $side = A ] && echo "$1" || echo "$2")
  [ "$rev" = . ] || git rev-parse --verify -q "$rev^{commit}" >/dev/null \
    || { echo "gpu-ab.sh: no such revision: $rev" >&2; exit 2; }
  rm -rf "${TREE[$side]}"; git worktree prune
  if [ "$rev" = . ]; then
    mkdir -p "${TREE[$side]}" \
      && git ls-files -co --exclude-standard -z | tar -c --null --ignore-failed-read -T - 2>/dev/null | tar -x -C "${TREE[$side]}" || exit 1
  else
    git worktree add -q --detach "${TREE[$side]}" "$rev" || exit 1
  fi
done
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  for side in A B; do
    echo "$side: $([ "$(git -C "${TREE[$side]}" rev-parse --show-toplevel 2>/dev/null)" = "${TREE[$side]}" ] \
      && git -C "${TREE[$side]}" log --oneline -1 || echo "the working tree, $(git log --oneline -1) + changes")"
  done; } | tee "$OUT/machine.txt"
for side in A B; do
  (cd "${TREE[$side]}" && python3 setup.py build_ext --inplace -j 8 >"$OUT/build-$side.log" 2>&1) &
done
wait
for side in A B; do
  ls "${TREE[$side]}"/gmlake/_allocator*.so >/dev/null 2>&1 || { tail -30 "$OUT/build-$side.log"; exit 1; }
done
echo "built in $((SECONDS - START)) s"
CPU=$(python3 -c "import os; print(max(os.sched_getaffinity(0)))")
micro() {    # $1 = side: the core's cache hits, ns per malloc+free pair, best of 3 per case
  if [ -f "${TREE[$1]}/bench/__main__.py" ]; then
    (cd "${TREE[$1]}" && taskset -c "$CPU" python3 -m bench micro --driver "$DRIVER" --cache-hits --iterations 300000 \
      | tail -1)
  else         # a revision from before bench/ became one tool: its micro.py, imported from its folder
    (cd "${TREE[$1]}" && PYTHONPATH=$PWD taskset -c "$CPU" python3 -c "
import json, sys; sys.path.insert(0, 'bench')
from micro import cache_hits, make_driver
print(json.dumps(cache_hits(make_driver('$DRIVER'), 300_000)))" | tail -1)
  fi
}
latency() {  # $1 = native | A | B: torch.empty + del, µs per request; the side's gmlake, this checkout's bench
  local tree=${TREE[A]} run=()
  [ "$1" = native ] || { tree=${TREE[$1]}; run=(-m gmlake run); }
  (cd "$SCRATCH" && PYTHONPATH="$tree:$ROOT" python3 "${run[@]}" -m bench latency --inner --cpu "$CPU" | tail -1)
}
record() {   # $1 = kind, $2 = side, $3 = the run's last line (JSON): one line of runs.jsonl, or stop at a failed run
  python3 -c 'import json, sys; json.loads(sys.argv[1])' "$3" 2>/dev/null \
    || { echo "gpu-ab.sh: the $1 run of $2 failed (its output is above)" >&2; exit 1; }
  echo "{\"kind\": \"$1\", \"side\": \"$2\", \"$([ "$1" = micro ] && echo ns || echo us)\": $3}" >>"$OUT/runs.jsonl"
}
: >"$OUT/runs.jsonl"
for ((r = 0; r < ROUNDS; r++)); do
  if ((r % 2 == 0)); then sides="A B"; names="native A B"; else sides="B A"; names="B A native"; fi
  for s in $sides; do record micro "$s" "$(micro "$s")"; done
  if [ "$LATENCY" = 1 ]; then for n in $names; do record latency "$n" "$(latency "$n")"; done; fi
  echo "round $r done at $((SECONDS - START)) s"
done
PYTHONPATH="$ROOT" python3 - "$OUT" <<'PY' | tee "$OUT/ab.txt"
import json, statistics, sys
from bench.torch_latency import summarize, verdict_lines
out = sys.argv[1]
runs = [json.loads(line) for line in open(f"{out}/runs.jsonl")]
json.dump(runs, open(f"{out}/ab.json", "w"), indent=1)
for kind, key in (("micro", "ns"), ("latency", "us")):
    rows = [r for r in runs if r["kind"] == kind]
    if not rows:
        continue
    for label in rows[0][key]:
        sides = dict.fromkeys(r["side"] for r in rows)
        med = {s: statistics.median(r[key][label] for r in rows if r["side"] == s) for s in sides}
        each = {s: [round(r[key][label], 3) for r in rows if r["side"] == s] for s in med}
        print(f"{kind:8} {label:16} " + "  ".join(f"{s} {med[s]:.3f} {each[s]}" for s in med)
              + f"  B/A {med['B'] / med['A']:.3f}")
    if kind == "latency":    # each build against native, judged as `bench latency` judges one
        for side in "AB":
            as_runs = [{"allocator": "gmlake" if r["side"] == side else "native", "us_per_empty_del": r["us"]}
                       for r in rows if r["side"] in (side, "native")]
            for line in verdict_lines(summarize(as_runs), 1.1):
                print(f"{side} against native, {line}")
PY
echo "done at $((SECONDS - START)) s"

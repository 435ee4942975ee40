#!/usr/bin/env bash
# Before / after bench for a refactor (issue 73): `edgespec bench` on the default pair from a
# detached worktree of the start commit and from this checkout, alternating, N rounds each, on
# one machine in one session. Prints the default's and plain's tokens/s per run; the figures go
# to docs/measurements/ by hand.
#
#   git worktree add --detach /tmp/house-before 4545a61
#   bash research/measure/house_bench.sh /tmp/house-before 2 /tmp/house-bench
set -euo pipefail
before=${1:?usage: house_bench.sh BEFORE_WORKTREE [ROUNDS] [OUT]}
rounds=${2:-2}
out=${3:-/tmp/house-bench}
after=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
summary='
import json, sys
doc = json.load(open(sys.argv[1]))
cells = [m["label"] + ": " + format(m["overall"]["tokens_per_s"], ".1f") for m in doc["methods"]]
print(sys.argv[2], "|", " | ".join(sorted(cells)))
'
args=(bench --limit 2 --max-tokens 96 --temp 0,0.7 --methods plain,adaptive-hybrid --quiet)
for i in $(seq 1 "$rounds"); do
  for side in before after; do
    tree=$before; [ "$side" = after ] && tree=$after
    dir="$out/$side-$i"
    (cd "$tree" && PYTHONPATH="$tree" python -m edgespec "${args[@]}" --out "$dir" >"$dir.log" 2>&1)
    python -c "$summary" "$dir/results.json" "$side-$i"
  done
done

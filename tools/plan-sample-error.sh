#!/usr/bin/env bash
# The sampled planner's error, measured: one full `kvtrace plan` of a trace and sampled plans
# of the same sizes for several seeds, each sampled curve's mean absolute and worst error
# against the full one, with wall time and peak RSS, then the mean over the seeds and, per
# size, the mean signed error (the bias the seeds share) (docs/commands/plan.md, "Sampled
# curves").
#
#   tools/plan-sample-error.sh [TRACE.lct]
#
# Without a trace it writes kvtrace's Mooncake twin (the conversation trace walked 10 times,
# 721,620 records, 1.3 GB) from ../shared. Environment: KVTRACE (binary; default
# target/release/kvtrace), SHARE (0.01), SEEDS ("0 1 2 3 4"), FLAGS (the plan's sizes;
# default the 17 sizes of the documented table), WORK (scratch directory).
set -euo pipefail
cd "$(dirname "$0")/.."

KVTRACE=${KVTRACE:-target/release/kvtrace}
SHARE=${SHARE:-0.01}
SEEDS=${SEEDS:-0 1 2 3 4}
FLAGS=${FLAGS:---size-gb 100 --min-gb 4 --max-gb 3000 --grid 16}
WORK=${WORK:-$(mktemp -d)}
[ -x "$KVTRACE" ] || cargo build --release --quiet

trace=${1:-}
if [ -z "$trace" ]; then
    requests=../shared/traces/mooncake/conversation_trace.jsonl
    [ -f "$requests" ] || { echo "no trace given and no $requests" >&2; exit 2; }
    trace=$WORK/mooncake_10x.lct
    "$KVTRACE" generate "$trace" --from-mooncake "$requests" --loops 10
fi

run() { # NAME ARGS...: one plan, its JSON in WORK/NAME.json, its time and peak RSS printed
    local name=$1
    shift
    /usr/bin/time -f "$name: %e s, %M KiB" "$KVTRACE" plan "$trace" $FLAGS -q \
        --json="$WORK/$name.json" "$@"
}

run full
for seed in $SEEDS; do
    run "seed$seed" --sample "$SHARE" --sample-seed "$seed"
done

python3 - "$WORK" $SEEDS <<'EOF'
import json, sys
work, seeds = sys.argv[1], sys.argv[2:]
full = {p["l1_size_gb"]: p["hit_rate"] for p in json.load(open(f"{work}/full.json"))["curve"]}
signed, means = {}, []
for seed in seeds:
    plan = json.load(open(f"{work}/seed{seed}.json"))
    errors = []
    for p in plan["curve"]:
        if p["l1_size_gb"] in full:
            error = p["hit_rate"] - full[p["l1_size_gb"]]
            errors.append(error)
            signed.setdefault(p["l1_size_gb"], []).append(error)
    sample = plan["sample"]
    mean = sum(map(abs, errors)) / len(errors)
    means.append(mean)
    print(f"seed {seed}: {sample['prefix_trees_kept']} of {sample['prefix_trees']} trees, "
          f"{len(errors)} sizes, mean absolute error {100 * mean:.2f} pp, "
          f"worst {100 * max(map(abs, errors)):.2f} pp")
print(f"over {len(seeds)} seeds: mean absolute error {100 * sum(means) / len(means):.3f} pp")
# A bias the seeds share shows as a signed error of one sign at a size; noise averages out.
print("size (GiB)  full hit rate  mean signed error over the seeds")
for gib in sorted(signed):
    errors = signed[gib]
    print(f"{gib:10.2f}  {100 * full[gib]:12.2f} %  {100 * sum(errors) / len(errors):+8.2f} pp")
EOF

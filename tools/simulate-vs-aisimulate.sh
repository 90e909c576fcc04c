#!/usr/bin/env bash
# Differential run of `kvtrace simulate` against AISimulate's own engine (crate aisimulate-core
# 0.13.0, through tools/aisim-harness) over a matrix of configurations: prints, for each, every
# report key the two share whose values differ (1e-9 relative), and the keys one of them lacks.
# Timing keys (wall time and what divides by it) are skipped. kvtrace runs with the engine
# argument "engine_version": "aisimulate-0.13" (the harness ignores it).
#
# Each side's whole process is also timed, the best of $RUNS runs (default 3, interleaved), and
# the line ends with both times and their ratio: the speed row of issue 36. Beside it, the
# best of the reports' own `wall_time_ms`: each engine's simulation alone, in process (trace
# reading, start-up and the written report excluded on both sides; AISimulate's includes
# its collector's final summary, kvtrace's does not), which is what the small samples compare
# once process start-up is taken away.
#
# usage: tools/simulate-vs-aisimulate.sh [CONFIGURATION...]
#
# The harness is built on first use (cargo build --release --manifest-path
# tools/aisim-harness/Cargo.toml; minutes: it compiles AISimulate's engine and its
# dependencies) into $AISIM_TARGET (default ../aisim-target). Exit status: 0 when every
# configuration agrees, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
kvtrace=${KVTRACE:-target/release/kvtrace}
[ -x "$kvtrace" ] || cargo build --release --quiet
target=${AISIM_TARGET:-../aisim-target}
harness=$target/release/aisim-harness
[ -x "$harness" ] || CARGO_TARGET_DIR=$target cargo build --release --quiet \
    --manifest-path tools/aisim-harness/Cargo.toml
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

slice=testdata/mooncake/conversation_head300.jsonl
t=testdata/traces
v='"engine_version":"aisimulate-0.13"'
block16="{\"block_size\":16,$v}"

# Sets `args` for one configuration.
configure() {
    case $1 in
    conversation-agg) args=(../shared/traces/mooncake/conversation_trace.jsonl --num-workers 4 --extra-engine-args "{\"block_size\":512,$v}") ;;
    slice-agg) args=("$slice" --num-workers 4 --extra-engine-args "{\"block_size\":512,$v}") ;;
    slice-pressure) args=("$slice" --num-workers 2 --extra-engine-args "{\"block_size\":64,\"num_gpu_blocks\":2000,$v}") ;;
    slice-sglang) args=("$slice" --num-workers 4 --extra-engine-args "{\"block_size\":64,\"engine_type\":\"sglang\",$v}") ;;
    delta-agg) args=("$t/mooncake_delta.jsonl" --trace-format mooncake-delta --trace-block-size 64 --num-workers 2 --extra-engine-args "$block16") ;;
    delta-sglang) args=("$t/mooncake_delta.jsonl" --trace-format mooncake-delta --trace-block-size 64 --num-workers 2 --extra-engine-args "{\"block_size\":16,\"engine_type\":\"sglang\",$v}") ;;
    agentic-legacy) args=("$t/agentic_legacy.jsonl" --trace-format agentic_mooncake --trace-block-size 64 --num-workers 2 --extra-engine-args "$block16") ;;
    agentic-v2) args=("$t/agentic_v2.jsonl" --trace-format agentic_mooncake --num-workers 2 --extra-engine-args "$block16") ;;
    weka) args=("$t/weka_sample.jsonl" --trace-format weka --num-workers 2 --extra-engine-args "$block16") ;;
    dynamo-shards) args=("$t/dynamo_trace.part0.jsonl" "$t/dynamo_trace.part1.jsonl.gz" --trace-format dynamo --num-workers 2 --extra-engine-args "{\"block_size\":64,$v}") ;;
    *) echo "unknown configuration $1" >&2; exit 2 ;;
    esac
}

matrix=(conversation-agg slice-agg slice-pressure slice-sglang delta-agg delta-sglang agentic-legacy agentic-v2 weka dynamo-shards)
[ $# -gt 0 ] && matrix=("$@")
status=0
for name in "${matrix[@]}"; do
    configure "$name"
    best_k= best_a=
    for run in $(seq "${RUNS:-3}"); do
        t0=$(date +%s%N)
        "$kvtrace" simulate "${args[@]}" --router-mode round_robin -q --report-json "$work/$name.kvtrace.$run.json"
        t1=$(date +%s%N)
        "$harness" "${args[@]}" --report-json "$work/$name.aisim.$run.json"
        t2=$(date +%s%N)
        k=$(( (t1 - t0) / 1000000 )) a=$(( (t2 - t1) / 1000000 ))
        [ -z "$best_k" ] || [ "$k" -lt "$best_k" ] && best_k=$k
        [ -z "$best_a" ] || [ "$a" -lt "$best_a" ] && best_a=$a
    done
    python3 - "$name" "$work/$name" "${RUNS:-3}" "$best_k" "$best_a" <<'PY' || status=1
import json, sys
name, stem, runs = sys.argv[1], sys.argv[2], range(1, int(sys.argv[3]) + 1)
ours_all = [json.load(open(f"{stem}.kvtrace.{r}.json")) for r in runs]
theirs_all = [json.load(open(f"{stem}.aisim.{r}.json")) for r in runs]
ours, theirs = ours_all[-1], theirs_all[-1]
ours_ms, theirs_ms = int(sys.argv[4]), int(sys.argv[5])
ours_in = min(r["wall_time_ms"] for r in ours_all)
theirs_in = min(r["wall_time_ms"] for r in theirs_all)
live = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}
differ = []
for key in sorted(set(ours) & set(theirs) - live):
    a, b = ours[key], theirs[key]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if a != b and abs(a - b) > 1e-9 * max(abs(a), abs(b)):
            differ.append(f"  {key}: kvtrace {a}, aisimulate {b}")
    elif a != b:
        differ.append(f"  {key}: kvtrace {a!r}, aisimulate {b!r}")
only = sorted(set(ours) - set(theirs))
shared = len(set(ours) & set(theirs) - live)
print(f"{name}: {shared - len(differ)}/{shared} shared keys equal"
      + (f"; only in kvtrace: {', '.join(only)}" if only else "")
      + f"; whole process kvtrace {ours_ms} ms, aisimulate-core {theirs_ms} ms,"
      + f" {theirs_ms / max(ours_ms, 1):.1f}x"
      + f"; in process {ours_in:.2f} ms, {theirs_in:.2f} ms, {theirs_in / ours_in:.1f}x")
print("\n".join(differ)) if differ else None
sys.exit(1 if differ else 0)
PY
done
exit $status

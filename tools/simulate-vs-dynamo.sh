#!/usr/bin/env bash
# Differential run of `kvtrace simulate` against NVIDIA Dynamo 1.4.2's `python -m dynamo.replay`
# over a matrix of configurations; prints every report key that differs.
#
# usage: DYNAMO_VENV=/path/to/venv tools/simulate-vs-dynamo.sh [quick|full|CONFIGURATION...]
#
# The venv holds `ai-dynamo==1.4.2 ai-dynamo-runtime==1.4.2` (installed with --no-deps) plus
# pydantic, uvloop, msgspec, typing-extensions, transformers, zstandard, prometheus-client and
# pyzmq; see docs/commands/simulate.md. round_robin is deterministic in Dynamo, so every key but the
# wall-time ones must match to 1e-9 relative. kv_router draws ties at random in Dynamo (and in
# kvtrace, by --seed): each tool runs KV_RUNS times (kvtrace with seeds 1..KV_RUNS) and the
# ranges of the two must overlap, Dynamo's widened by 2 %. (kv_router configurations replay
# trace files: a synthetic workload would draw its prefix groups from --seed too.)
# `quick` runs the 300-request slice and synthetic workloads only (CI-sized); `full` (the
# default) adds the whole Mooncake conversation and synthetic traces.
# Exit status: 0 when every configuration agrees, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${DYNAMO_VENV:?set DYNAMO_VENV to a venv with ai-dynamo 1.4.2}"
scope=${1:-full}
KV_RUNS=${KV_RUNS:-3}
kvtrace=${KVTRACE:-target/release/kvtrace}
[ -x "$kvtrace" ] || cargo build --release --quiet
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

slice=testdata/mooncake/conversation_head300.jsonl
conv=../shared/traces/mooncake/conversation_trace.jsonl
synth=../shared/traces/mooncake/synthetic_trace.jsonl
block='{"block_size":512}'

# Sets `args` and `router` for one configuration of the matrix.
configure() {
    local disagg=(--num-prefill-workers 2 --num-decode-workers 2
        --prefill-engine-args '{"block_size":512,"worker_type":"prefill"}'
        --decode-engine-args '{"block_size":512,"worker_type":"decode"}')
    local sglang_disagg=(--num-prefill-workers 2 --num-decode-workers 2
        --prefill-engine-args '{"block_size":64,"worker_type":"prefill","engine_type":"sglang"}'
        --decode-engine-args '{"block_size":64,"worker_type":"decode","engine_type":"sglang"}')
    local synthetic=(--input-tokens 3000 --output-tokens 300 --request-count 400 --request-rate 20)
    router=round_robin
    case $1 in
    slice-agg-rr) args=("$slice" --num-workers 4 --extra-engine-args "$block") ;;
    slice-disagg-rr) args=("$slice" "${disagg[@]}") ;;
    slice-sglang-rr) args=("$slice" --num-workers 4 --extra-engine-args '{"block_size":64,"engine_type":"sglang"}') ;;
    synthetic-sessions-rr) args=("${synthetic[@]}" --num-workers 2 --turns-per-session 3 --extra-engine-args "$block") ;;
    synthetic-prefix-rr) args=("${synthetic[@]}" --num-workers 2 --shared-prefix-ratio 0.5 --num-prefix-groups 4 --extra-engine-args "$block") ;;
    synthetic-closed-rr) args=(--input-tokens 5000 --output-tokens 500 --request-count 1000 --replay-concurrency 100 --num-workers 1 --extra-engine-args "$block") ;;
    synthetic-interval-rr) args=(--input-tokens 3000 --output-tokens 300 --request-count 300 --arrival-interval-ms 37.3 --num-workers 2 --extra-engine-args "$block") ;;
    synthetic-closed-sessions-rr) args=(--input-tokens 2000 --output-tokens 200 --request-count 200 --replay-concurrency 20 --turns-per-session 3 --inter-turn-delay-ms 250 --shared-prefix-ratio 0.3 --num-prefix-groups 5 --num-workers 3 --extra-engine-args "$block") ;;
    slice-agg-pressure-rr) args=("$slice" --num-workers 2 --extra-engine-args '{"block_size":64,"num_gpu_blocks":2000}') ;;
    slice-disagg-transfer-rr) args=("$slice" --num-prefill-workers 2 --num-decode-workers 2
        --prefill-engine-args '{"block_size":64,"worker_type":"prefill","kv_transfer_bandwidth":2.0,"kv_bytes_per_token":131072}'
        --decode-engine-args '{"block_size":64,"worker_type":"decode","num_gpu_blocks":3000}') ;;
    slice-sglang-lpm-pressure-rr) args=("$slice" --num-workers 2 --extra-engine-args '{"block_size":64,"num_gpu_blocks":4000,"engine_type":"sglang","sglang":{"schedule_policy":"lpm"}}') ;;
    slice-sglang-disagg-rr) args=("$slice" "${sglang_disagg[@]}") ;;
    synthetic-disagg-rr) args=("${synthetic[@]}" --num-prefill-workers 1 --num-decode-workers 2
        --prefill-engine-args '{"block_size":512,"worker_type":"prefill"}'
        --decode-engine-args '{"block_size":512,"worker_type":"decode"}') ;;
    slice-disagg-kv) args=("$slice" "${disagg[@]}"); router=kv_router ;;
    slice-sglang-disagg-kv) args=("$slice" "${sglang_disagg[@]}"); router=kv_router ;;
    slice-agg-kv) args=("$slice" --num-workers 4 --extra-engine-args "$block"); router=kv_router ;;
    conversation-agg-rr) args=("$conv" --num-workers 4 --extra-engine-args "$block") ;;
    conversation-disagg-rr) args=("$conv" "${disagg[@]}") ;;
    synthetic-trace-agg-rr) args=("$synth" --num-workers 4 --extra-engine-args "$block") ;;
    conversation-agg-kv) args=("$conv" --num-workers 4 --extra-engine-args "$block"); router=kv_router ;;
    *) echo "unknown configuration $1" >&2; exit 2 ;;
    esac
}

matrix=(slice-agg-rr slice-agg-pressure-rr slice-disagg-rr slice-disagg-transfer-rr slice-sglang-rr
    slice-sglang-lpm-pressure-rr slice-sglang-disagg-rr synthetic-sessions-rr synthetic-prefix-rr
    synthetic-closed-rr synthetic-interval-rr synthetic-closed-sessions-rr synthetic-disagg-rr
    slice-agg-kv)
if [ "$scope" = full ]; then
    matrix+=(conversation-agg-rr conversation-disagg-rr synthetic-trace-agg-rr conversation-agg-kv
        slice-disagg-kv slice-sglang-disagg-kv)
fi
if [ "$scope" != quick ] && [ "$scope" != full ]; then
    matrix=("$@")
fi

compare() { # router, runs, kvtrace reports (runs of them), dynamo reports (runs of them)
    python3 - "$@" <<'PY'
import json, sys
router, runs = sys.argv[1], int(sys.argv[2])
load = lambda paths: [json.load(open(p)) for p in paths]
ours, theirs = load(sys.argv[3:3 + runs]), load(sys.argv[3 + runs:])
live = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}
bad = []
for key in sorted(set(ours[0]) | set(theirs[0])):
    if key in live:
        continue
    xs = [o.get(key) for o in ours]
    ys = [t.get(key) for t in theirs]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in [*xs, *ys])
    if not numeric:
        if any(x != y for x in xs for y in ys):
            bad.append(f"{key}: kvtrace {xs[0]!r}, dynamo {ys[0]!r}")
        continue
    if router == "round_robin":
        x, y = xs[0], ys[0]
        if x != y and abs(x - y) > 1e-9 * max(abs(x), abs(y)):
            bad.append(f"{key}: kvtrace {x!r}, dynamo {y!r}")
    else:
        # Both tools break routing ties at random (kvtrace by --seed): the ranges of the
        # runs must overlap, Dynamo's widened by 2 %.
        lo, hi = min(ys), max(ys)
        slack = 0.02 * max(abs(lo), abs(hi)) + 1e-9
        if max(xs) < lo - slack or min(xs) > hi + slack:
            bad.append(f"{key}: kvtrace {min(xs)!r}..{max(xs)!r}, dynamo {lo!r}..{hi!r}")
for line in bad:
    print("    " + line)
print(f"  {len(bad)} key(s) differ")
sys.exit(1 if bad else 0)
PY
}

status=0
for name in "${matrix[@]}"; do
    configure "$name"
    set -- "${args[@]}"
    echo "== $name ($router)"
    runs=1
    [ "$router" = kv_router ] && runs=$KV_RUNS
    reports=()
    for n in $(seq 1 "$runs"); do
        DYN_LOG=warn "$DYNAMO_VENV/bin/python" -m dynamo.replay "$@" --router-mode "$router" \
            --report-json "$work/$name.dynamo.$n.json" >"$work/$name.dynamo.log" 2>&1 || {
            echo "  dynamo failed: $(tail -1 "$work/$name.dynamo.log")"
            status=1
            continue 2
        }
        reports+=("$work/$name.dynamo.$n.json")
    done
    ours=()
    for n in $(seq 1 "$runs"); do
        seed=()
        [ "$router" = kv_router ] && seed=(--seed "$n")
        "$kvtrace" simulate "$@" --router-mode "$router" "${seed[@]}" \
            --report-json "$work/$name.kvtrace.$n.json" -q >/dev/null 2>"$work/$name.kvtrace.log" || {
            echo "  kvtrace failed: $(tail -1 "$work/$name.kvtrace.log")"
            status=1
            continue 2
        }
        ours+=("$work/$name.kvtrace.$n.json")
    done
    compare "$router" "$runs" "${ours[@]}" "${reports[@]}" || status=1
done
exit $status

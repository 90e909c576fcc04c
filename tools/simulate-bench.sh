#!/usr/bin/env bash
# Whole-process wall time and peak RSS of `kvtrace simulate` on the full Mooncake FAST'25
# conversation trace (12,031 requests, 4 workers, 512-token blocks), round_robin and
# kv_router, plus the 1000-request synthetic closed loop; three runs each.
# Usage: tools/simulate-bench.sh [path/to/conversation_trace.jsonl]
set -euo pipefail
cd "$(dirname "$0")/.."
trace="${1:-../shared/traces/mooncake/conversation_trace.jsonl}"
[ -f "$trace" ] || { echo "trace not found: $trace (pass its path)" >&2; exit 2; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r)"
cargo build --release --quiet
bin=target/release/kvtrace

measure() { # label, command...
    local label="$1"; shift
    for run in 1 2 3; do
        /usr/bin/time -f "%e %M" -o "$tmp/time" "$@" --report-json "$tmp/r.json" -q 2>"$tmp/err" \
            || { cat "$tmp/err"; exit 1; }
        read -r secs kib <"$tmp/time"
        sim=$(python3 -c "import json;print(round(json.load(open('$tmp/r.json'))['wall_time_ms']))" 2>/dev/null || echo "?")
        printf '%-40s run %d: %6.2f s process, %5s ms simulation, %7.1f MiB peak RSS\n' \
            "$label" "$run" "$secs" "$sim" "$(echo "$kib / 1024" | bc -l)"
    done
}

engine='{"block_size":512}'
measure "conversation, 4 workers, round_robin" "$bin" simulate "$trace" --num-workers 4 --extra-engine-args "$engine"
measure "conversation, 4 workers, kv_router" "$bin" simulate "$trace" --num-workers 4 --router-mode kv_router --extra-engine-args "$engine"
measure "synthetic 1000 x 5000/500, conc 100" "$bin" simulate --input-tokens 5000 --output-tokens 500 --request-count 1000 --replay-concurrency 100 --extra-engine-args "$engine"
measure "conversation, 2P+2D disaggregated, kv_router" "$bin" simulate "$trace" --router-mode kv_router \
    --prefill-engine-args '{"worker_type":"prefill","block_size":512}' \
    --decode-engine-args '{"worker_type":"decode","block_size":512}' \
    --num-prefill-workers 2 --num-decode-workers 2
measure "conversation, kv_router, 64 GiB offload + record" "$bin" simulate "$trace" --num-workers 4 \
    --router-mode kv_router --extra-engine-args "$engine" --l1-size-gb 64 --record "$tmp/rec.lct"
echo "recorded trace: $(du -h "$tmp/rec.lct" | cut -f1)"

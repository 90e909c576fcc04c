#!/usr/bin/env bash
# Reproduces the figures in docs/performance.md on this machine:
#   - criterion benchmarks (decode/encode of a generated 1M-record trace; recorder costs)
#   - whole-command figures: generating a 1M-record trace, and `kvtrace info` over it, with
#     wall time and peak RSS from /usr/bin/time.
# Usage: tools/bench.sh [records]   (default 1000000). Writes into a temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
records="${1:-1000000}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r)"
cargo build --release --quiet
bin=target/release/kvtrace

measure() { # label, command...
    local label="$1"; shift
    /usr/bin/time -f "%e %M" -o "$tmp/time" "$@" >/dev/null 2>"$tmp/err" || { cat "$tmp/err"; exit 1; }
    read -r secs kib <"$tmp/time"
    printf '%-44s %8.2f s  %8.1f MiB peak RSS\n' "$label" "$secs" "$(echo "$kib / 1024" | bc -l)"
}

measure "generate $records records (.lct)" "$bin" generate "$tmp/t.lct" --records "$records"
measure "info over $records records" "$bin" info "$tmp/t.lct"
measure "dump (JSONL) over $records records" "$bin" dump "$tmp/t.lct"
measure "replay, afap, L1 64 GiB accounting-only" "$bin" replay "$tmp/t.lct" -q --no-csv --l1-size-gb 64 --l1-accounting-only
measure "replay, afap, ARC 2 GiB immediate" "$bin" replay "$tmp/t.lct" -q --no-csv --l1-size-gb 2 --l1-accounting-only --eviction-policy ARC --eviction-timing immediate
measure "convert .lct -> .lct.zst" "$bin" convert "$tmp/t.lct" "$tmp/t.lct.zst"
measure "info over the .lct.zst" "$bin" info "$tmp/t.lct.zst"
for users in 200 1000; do # the per-user cost of bench: RSS grows by about 66 KiB a user
    measure "bench tiny-1b, $users users, 10 s" "$bin" bench --model tiny-1b --num-users "$users" \
        --duration 10 --cache-dir "$tmp" --output "$tmp/bench.json" -q
done
ls -l "$tmp/t.lct" "$tmp/t.lct.zst" | awk '{printf "%-12s %14d bytes\n", $NF ~ /zst$/ ? "zstd" : "plain", $5}'

rm -f "$tmp"/t.lct "$tmp"/t.lct.zst
sync # let the kernel finish writing back the files above before timing the CPU-bound benches
echo
echo "criterion (cargo bench --bench lmct --bench recorder --bench replay):"
cargo bench --quiet --bench lmct --bench recorder --bench replay 2>/dev/null | grep -E "^[a-z]|time:|thrpt:"

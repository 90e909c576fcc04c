#!/usr/bin/env bash
# kvtrace's whole-process times beside `cat FILE > /dev/null` and, when LMCACHE_VENV names a
# virtual environment with LMCache 0.5.6 (and torch) installed, beside `lmcache trace info` and
# `lmcache trace replay` — all in one run, on the traces of docs/performance.md:
#   mc10.lct  `kvtrace generate --from-mooncake conversation_trace.jsonl --loops 10` (721,620
#             records, 1.32 GB)
#   mc1.lct   the same with --loops 1 (72,162 records), for replay
# Each figure is the best of RUNS (default 3) runs, warm page cache (every file is read once
# first), with peak RSS from /usr/bin/time. Ratios are what to compare: the machines are shared.
# Usage: [LMCACHE_VENV=/path/to/venv] [RUNS=3] tools/perf-vs-cat.sh [MOONCAKE_TRACE]
#        (default ../shared/traces/mooncake/conversation_trace.jsonl); files go to a temporary
#        directory under $TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/.."
mooncake="${1:-../shared/traces/mooncake/conversation_trace.jsonl}"
runs="${RUNS:-3}"
[ -f "$mooncake" ] || { echo "no Mooncake trace at $mooncake" >&2; exit 2; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r)"
cargo build --release --quiet
bin=target/release/kvtrace
"$bin" generate "$tmp/mc10.lct" --from-mooncake "$mooncake" --loops 10 2>/dev/null
"$bin" generate "$tmp/mc1.lct" --from-mooncake "$mooncake" --loops 1 2>/dev/null
"$bin" convert "$tmp/mc10.lct" "$tmp/mc10.lct.zst" 2>/dev/null
ls -l "$tmp"/mc*.lct* | awk '{printf "%-14s %14d bytes\n", $NF, $5}' | sed "s|$tmp/||"
cat "$tmp"/mc*.lct* >/dev/null

# best LABEL COMMAND...: the fastest of $runs runs, wall seconds and peak RSS; a failed run
# (any exit status but 0) is shown with its status, as LMCache's replay exits 1 on misses.
best() {
    local label="$1"; shift
    local best_s="" best_kib="" status=0
    for _ in $(seq "$runs"); do
        status=0
        /usr/bin/time -f "%e %M" -o "$tmp/time" "$@" >/dev/null 2>"$tmp/err" || status=$?
        read -r secs kib <"$tmp/time"
        if [ -z "$best_s" ] || [ "$(echo "$secs < $best_s" | bc -l)" = 1 ]; then
            best_s="$secs"; best_kib="$kib"
        fi
    done
    local note=""
    [ "$status" = 0 ] || note="  (exit $status)"
    printf '%-58s %8.2f s  %8.1f MiB%s\n' "$label" "$best_s" "$(echo "$best_kib / 1024" | bc -l)" "$note"
    echo "$best_s" >"$tmp/last"
}
ratio() { echo "scale=1; $1 / $2" | bc -l; }

echo
best "cat mc10.lct > /dev/null" sh -c "cat '$tmp/mc10.lct' > /dev/null"; cat_s="$(cat "$tmp/last")"
best "kvtrace info mc10.lct" "$bin" info "$tmp/mc10.lct"; info_s="$(cat "$tmp/last")"
best "kvtrace info mc10.lct.zst" "$bin" info "$tmp/mc10.lct.zst"
best "kvtrace dump mc10.lct > /dev/null" "$bin" dump "$tmp/mc10.lct"
best "kvtrace convert mc10.lct -> .jsonl" "$bin" convert "$tmp/mc10.lct" "$tmp/mc10.jsonl"
rm -f "$tmp/mc10.jsonl"
sync # the JSONL's write-back would otherwise compete with the replays below for the CPU
replay=(replay "$tmp/mc1.lct" --pace afap -q --no-csv --l1-size-gb 2 --eviction-policy LRU)
best "kvtrace replay mc1.lct afap, L1 2 GiB LRU, buffers" "$bin" "${replay[@]}"; replay_s="$(cat "$tmp/last")"
best "kvtrace replay ... --l1-touch-pages" "$bin" "${replay[@]}" --l1-touch-pages
best "kvtrace replay ... --l1-accounting-only" "$bin" "${replay[@]}" --l1-accounting-only; accounting_s="$(cat "$tmp/last")"
best "kvtrace replay ... --eviction-timing immediate" "$bin" "${replay[@]}" --eviction-timing immediate
best "kvtrace replay ... immediate, accounting-only" "$bin" "${replay[@]}" --eviction-timing immediate --l1-accounting-only
echo "kvtrace info: $(ratio "$info_s" "$cat_s")x cat"

if [ -n "${LMCACHE_VENV:-}" ]; then
    lmcache=("$LMCACHE_VENV/bin/lmcache")
    export LMCACHE_TRACK_USAGE=false
    best "lmcache trace info mc10.lct" "${lmcache[@]}" trace info "$tmp/mc10.lct"; lmc_info="$(cat "$tmp/last")"
    best "lmcache trace replay mc1.lct, L1 2 GiB LRU (whole process)" "${lmcache[@]}" trace replay \
        "$tmp/mc1.lct" -q --no-csv --output-dir "$tmp" --l1-size-gb 2 --eviction-policy LRU \
        --disable-metrics; lmc_replay="$(cat "$tmp/last")"
    echo "info: kvtrace $(ratio "$lmc_info" "$info_s")x faster than lmcache trace info"
    echo "replay: kvtrace $(ratio "$lmc_replay" "$replay_s")x faster than lmcache trace replay with buffers, $(ratio "$lmc_replay" "$accounting_s")x accounting-only"
fi

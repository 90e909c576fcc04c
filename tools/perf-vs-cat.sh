#!/usr/bin/env bash
# kvtrace's whole-process times on the traces users have, beside `cat FILE > /dev/null` and
# the peers, all in one run:
#   big_10x.lct  the Mooncake conversation trace walked 10 times, written by LMCache 0.5.6's own
#                recorder (../shared/lmcache/scripts/make_big.py: 721,620 records, 1.29 GB)
#   big_1x.lct   the same with --loops 1 (72,162 records), for replay and sweep
# LMCACHE_VENV names a virtual environment with LMCache 0.5.6 and torch: it writes the two traces
# and runs `lmcache trace info` and `lmcache trace replay` beside kvtrace. Without it, kvtrace's
# own twins (`kvtrace generate --from-mooncake`) stand in, and the peer rows are left out.
# One such venv (2026-12-07; PyPI's torch wheel, as download.pytorch.org may be unreachable):
#   python3 -m venv V && V/bin/pip install torch==2.13.0 && V/bin/pip install --no-deps lmcache==0.5.6
#   V/bin/pip install aiofile aiofiles blake3 aiohttp cryptography fastapi httpx msgspec msgpack \
#     'numpy<=2.2.6' numba nvtx 'opentelemetry-api<=1.40.0' opentelemetry-sdk \
#     'prometheus_client<=0.24.1' psutil py-cpuinfo pyyaml pyzmq redis requests safetensors \
#     'setuptools<81,>=77.0.3' sortedcontainers uvicorn httptools cachetools
# DYNAMO_VENV names one with ai-dynamo 1.6.1 (../shared/dynamo/README.md): `simulate` runs
# beside its replay API (../shared/dynamo/run161.py), whole process.
# Each figure is the best of RUNS (default 3) runs, warm page cache, with peak RSS from
# /usr/bin/time. Ratios are what to compare: the machines are shared.
# Usage: [LMCACHE_VENV=…] [DYNAMO_VENV=…] [RUNS=3] tools/perf-vs-cat.sh [MOONCAKE_TRACE]
#        (default ../shared/traces/mooncake/conversation_trace.jsonl); files go to a temporary
#        directory under $TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/.."
mooncake="${1:-../shared/traces/mooncake/conversation_trace.jsonl}"
runs="${RUNS:-3}"
[ -f "$mooncake" ] || { echo "no Mooncake trace at $mooncake" >&2; exit 2; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 LMCACHE_DISABLE_BANNER=1

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r)"
cargo build --release --quiet
bin=target/release/kvtrace
big10="$tmp/big_10x.lct" big1="$tmp/big_1x.lct"
if [ -n "${LMCACHE_VENV:-}" ]; then
    echo "traces: written by LMCache's recorder (make_big.py)"
    for loops in 10 1; do
        "$LMCACHE_VENV/bin/python" ../shared/lmcache/scripts/make_big.py --trace "$mooncake" \
            --loops "$loops" --out "$tmp/big_${loops}x.lct" >/dev/null 2>&1
    done
else
    echo "traces: kvtrace's twins (name LMCACHE_VENV for LMCache-written ones and the peer rows)"
    "$bin" generate "$big10" --from-mooncake "$mooncake" --loops 10 2>/dev/null
    "$bin" generate "$big1" --from-mooncake "$mooncake" --loops 1 2>/dev/null
fi
"$bin" convert "$big10" "$big10.zst" 2>/dev/null
ls -l "$tmp"/big_*.lct* | awk '{printf "%-18s %14d bytes\n", $NF, $5}' | sed "s|$tmp/||"
cat "$tmp"/big_*.lct* >/dev/null
mkdir -p "$tmp/out"

# best LABEL COMMAND...: the fastest of $runs runs, wall seconds to the millisecond (several
# rows take a tenth of a second, where /usr/bin/time's hundredths would decide a ratio),
# and that run's peak RSS as /usr/bin/time reads it (the command's own: a child of Python
# would count Python's pages, which it holds until it execs); the wall time includes
# /usr/bin/time's start, about a millisecond. A failed run (any exit status but 0) is shown
# with its status, as LMCache's replay exits 1 on misses.
best() {
    local label="$1"; shift
    python3 - "$tmp" "$runs" "$label" "$@" <<'PY'
import os, subprocess, sys, time
tmp, runs, label, cmd = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
best, status = None, 0
for _ in range(runs):
    with open(os.devnull, "wb") as out, open(f"{tmp}/err", "wb") as err:
        began = time.perf_counter()
        status = subprocess.call(
            ["/usr/bin/time", "-f", "%M", "-o", f"{tmp}/time", *cmd], stdout=out, stderr=err
        )
        secs = time.perf_counter() - began
    kib = int(open(f"{tmp}/time").read().split()[-1])
    if best is None or secs < best[0]:
        best = (secs, kib)
note = "" if status == 0 else f"  (exit {status})"
print(f"{label:<66} {best[0]:8.3f} s  {best[1] / 1024:8.1f} MiB{note}")
with open(f"{tmp}/last", "w") as last:
    print(f"{best[0]:.4f}", file=last)
PY
}
ratio() { echo "scale=1; $1 / $2" | bc -l; }
last() { cat "$tmp/last"; }

echo
best "cat big_10x.lct > /dev/null" sh -c "cat '$big10' > /dev/null"; cat_s=$(last)
best "kvtrace info big_10x.lct" "$bin" info "$big10"; info_s=$(last)
for threads in 1 2 $( [ "$(nproc)" -gt 2 ] && nproc ); do
    best "kvtrace info big_10x.lct --threads $threads" "$bin" info --threads "$threads" "$big10"
done
best "kvtrace info big_10x.lct.zst" "$bin" info "$big10.zst"
best "kvtrace dump big_10x.lct > /dev/null" "$bin" dump "$big10"
best "kvtrace convert big_10x.lct -> .jsonl" "$bin" convert "$big10" "$tmp/big_10x.jsonl"
best "kvtrace convert big_10x.jsonl -> .lct (back)" "$bin" convert "$tmp/big_10x.jsonl" \
    "$tmp/back.lct"
cmp -s "$big10" "$tmp/back.lct" || echo "the .jsonl did not convert back to the same bytes" >&2
rm -f "$tmp/big_10x.jsonl" "$tmp/back.lct"
sync # the JSONL's write-back would otherwise compete with the replays below for the CPU
replay=(replay "$big1" --pace afap -q --output-dir "$tmp/out" --l1-size-gb 2 --eviction-policy LRU)
best "kvtrace replay big_1x.lct afap, L1 2 GiB LRU (defaults otherwise)" "$bin" "${replay[@]}"; replay_s=$(last)
best "kvtrace replay ... --eviction-phase 0" "$bin" "${replay[@]}" --eviction-phase 0; pinned_s=$(last)
sizes=$(awk 'BEGIN { for (i = 0; i < 64; i++) printf "%s%g", (i ? "," : ""), 0.25 + i * 0.0625 }')
best "kvtrace sweep replay big_1x.lct, 64 L1 sizes 0.25-4.19 GiB, LRU" "$bin" sweep replay "$big1" \
    --pace afap -q --eviction-policy LRU --l1-size-gb "$sizes"; sweep_s=$(last)
echo "info: $(ratio "$info_s" "$cat_s")x cat; replay: default $(ratio "$replay_s" "$pinned_s")x the pinned phase; sweep of 64: $(ratio "$sweep_s" "$replay_s")x one replay"

if [ -n "${LMCACHE_VENV:-}" ]; then
    lmcache=("$LMCACHE_VENV/bin/lmcache")
    best "lmcache trace info big_10x.lct" "${lmcache[@]}" trace info "$big10"; lmc_info=$(last)
    best "lmcache trace replay big_1x.lct, L1 2 GiB LRU (whole process)" "${lmcache[@]}" trace replay \
        "$big1" -q --no-csv --output-dir "$tmp/out" --l1-size-gb 2 --eviction-policy LRU \
        --disable-metrics; lmc_replay=$(last)
    echo "info: kvtrace $(ratio "$lmc_info" "$info_s")x faster than lmcache trace info"
    echo "replay: kvtrace $(ratio "$lmc_replay" "$replay_s")x faster than lmcache trace replay"
fi

echo
engine='{"block_size":512}'
for router in round_robin kv_router; do
    best "kvtrace simulate conversation, 4 workers, $router" "$bin" simulate "$mooncake" \
        --num-workers 4 --router-mode "$router" --extra-engine-args "$engine" \
        --report-json "$tmp/sim.json" -q; sim_s=$(last)
    if [ -n "${DYNAMO_VENV:-}" ]; then
        best "Dynamo 1.6.1 replay API, the same (whole process)" "$DYNAMO_VENV/bin/python" \
            ../shared/dynamo/run161.py "$mooncake:$router" "$tmp/dyn.json"
        echo "simulate $router: kvtrace $(ratio "$(last)" "$sim_s")x faster than Dynamo 1.6.1"
    fi
done

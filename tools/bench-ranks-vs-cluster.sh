#!/bin/bash
# Usage: tools/bench-ranks-vs-cluster.sh [SECONDS] — kvtrace bench with 1, 2 and 4 mpirun ranks
# whose storage tier is the Redis Cluster on 127.0.0.1:7100-7102 (each master capped at 3 GB,
# allkeys-lru, flushed between runs), then kvtrace aggregate; prints ranks, requests, window,
# tok/s over the window, storage GiB/s, hit rate, cross-rank hits, the storage read/write p95
# (ms), then MLPerf Storage v3.0's aggregate of the trial (Rules.md §6.3.4): storage read
# GB/s and storage tok/s summed over the ranks, device read P95 (ms) of the worst rank.
cd "$(dirname "$0")/.."
S=${1:-15}
OUT=${OUT:-/tmp}
TIER='{"type":"resp-cluster","nodes":["redis://127.0.0.1:7100"],"prefix":"bench"}'
for p in 7100 7101 7102; do
  redis-cli -p $p config set maxmemory 3gb >/dev/null
  redis-cli -p $p config set maxmemory-policy allkeys-lru >/dev/null
done
for np in 1 2 4; do
  for p in 7100 7101 7102; do redis-cli -p $p flushall >/dev/null; done
  rm -rf "$OUT/b$np" && mkdir -p "$OUT/b$np"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np $np --oversubscribe \
    ./target/release/kvtrace bench -q --model tiny-1b --num-users 4 --duration "$S" \
    --cpu-mem-gb 0 --generation-mode none --output "$OUT/b$np/bench.json" --storage-tier "$TIER" \
    || echo "bench with $np ranks failed"
  ./target/release/kvtrace aggregate "$OUT"/b$np/bench.rank-*.json -q --json="$OUT/b$np/agg.json"
  python3 -c "
import json;d=json.load(open('$OUT/b$np/agg.json'));o=d['ops'];m=d['mlperf']
print($np, d['requests_completed'], round(d['window_s'],2), round(d['tokens_per_s'],1), round(d['storage_io_gib_per_s'],3), round(d['cache_hit_rate'],3), d['cross_rank_hits'], round(o['storage_read']['p95_ms'],1), round(o['storage_write']['p95_ms'],1), round(m['aggregated_read_bandwidth_gbps'],3), round(m['aggregated_storage_throughput_tokens_per_sec'],1), round(m['aggregated_device_read_p95_ms'],1))"
done

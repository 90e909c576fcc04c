#!/bin/bash
# Usage: tools/ranks-vs-cluster.sh TRACE.lct — replays with 1, 2 and 4 mpirun ranks (by-request shard)
# against a Redis Cluster whose masters listen on 127.0.0.1:7100-7102, flushing it between runs,
# and prints ranks, calls, window, calls/s, mean rank calls/s, hit rate, cross-rank hits, p95s.
# ranks vs aggregate throughput against the loopback 3-master cluster on 7100-7102
cd "$(dirname "$0")/.."
T=${1:?usage: tools/ranks-vs-cluster.sh TRACE.lct (a cluster on 127.0.0.1:7100-7102)}
for np in 1 2 4; do
  for p in 7100 7101 7102; do redis-cli -p $p flushall >/dev/null; done
  rm -rf ${OUT:-/tmp}/m$np
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np $np --oversubscribe ./target/release/kvtrace replay $T -q --json --shard by-request --l1-size-gb 0.05 --eviction-timing immediate --output-dir ${OUT:-/tmp}/m$np --l2-adapter '{"type":"resp-cluster","nodes":["redis://127.0.0.1:7100"]}' || echo fail
  ./target/release/kvtrace aggregate ${OUT:-/tmp}/m$np/rank-* -q --json=${OUT:-/tmp}/m$np/agg.json
  python3 -c "
import json;d=json.load(open('${OUT:-/tmp}/m$np/agg.json'));print($np, d['replayed'], round(d['window_s'],3), round(d['calls_per_s']), round(d['mean_rank_calls_per_s']), d['hits']['hit_rate'], sum(r['cross_rank_hits'] for r in d['ranks']), d['ops']['lmcache.v1.distributed.storage_manager.StorageManager.submit_prefetch_task']['p95_ms'], d['ops']['lmcache.v1.distributed.storage_manager.StorageManager.finish_write']['p95_ms'])"
done

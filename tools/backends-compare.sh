#!/usr/bin/env bash
# Usage: tools/backends-compare.sh [TRACE ...] — replays each LMCache-written trace against one
# L2 tier of each backend (fs with O_DIRECT, Redis, a 3-node Redis Cluster, S3 on s3s-fs), with
# synchronous and with asynchronous tier I/O (default depth and workers), every server started
# here on loopback, and prints one Markdown row per run: wall time, hit rate, and the tier's
# calls — queue wait, service and end-to-end p50/p99, drain, MiB/s over the tier's busy span.
#
# Needs redis-server and redis-cli (Debian's), s3s-fs (`cargo install s3s-fs --version 0.14.1
# --features binary --locked`), python3, and a release build (KVTRACE, default
# target/release/kvtrace). Default traces: ../shared/lmcache/churn_lru.lct and
# /work/big/big_1x.lct (written by ../shared/lmcache/make_big.py); big_1x stores 2 GiB into the
# tier, so the fs and S3 directories ($TMPDIR) need that much free. REPLAY_FLAGS adds flags to
# every replay (e.g. "--pace realtime" for the rate the recording had, where the default as
# fast as possible saturates each tier). Then `kvtrace bench` against the storage tiers it
# takes (files with O_DIRECT, the Redis Cluster, S3), synchronous and asynchronous, for
# BENCH_SECONDS (default 10) each with BENCH_FLAGS (default: 8 users of llama3.1-8b, no CPU
# tier, no generation time, seed 42) and BENCH_ASYNC_FLAGS on the asynchronous runs (e.g.
# "--storage-io-workers 8"); BENCH_ONLY=1 skips the replays. Not a test: a
# measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
KVTRACE=${KVTRACE:-target/release/kvtrace}
if [ $# -eq 0 ]; then
  set -- ../shared/lmcache/churn_lru.lct /work/big/big_1x.lct
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvtrace-backends.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# A free port whose Redis Cluster bus port (port + 10000) is free and below 65536 too.
port() {
  python3 - <<'PY'
import random, socket
while True:
    p = random.randint(20000, 50000)
    try:
        for q in (p, p + 10000):
            socket.socket().bind(("127.0.0.1", q))
    except OSError:
        continue
    print(p)
    break
PY
}
wait_for() { for _ in $(seq 100); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "not ready: $*" >&2; cat "$WORK"/*.log >&2; exit 1; }

REDIS=$(port)
redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >"$WORK/redis.log" &
PIDS+=($!)
wait_for redis-cli -p "$REDIS" ping

NODES=()
for i in 0 1 2; do
  p=$(port)
  mkdir -p "$WORK/node$i"
  redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes --save '' --appendonly no \
    --cluster-config-file "nodes-$p.conf" --dir "$WORK/node$i" >/dev/null &
  PIDS+=($!)
  NODES+=("$p")
done
for p in "${NODES[@]}"; do wait_for redis-cli -p "$p" ping; done
redis-cli --cluster create "${NODES[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >/dev/null
for p in "${NODES[@]}"; do
  for _ in $(seq 200); do redis-cli -p "$p" cluster info | grep -q cluster_state:ok && break; sleep 0.1; done
done

S3=$(port)
mkdir -p "$WORK/s3/kvcache"
export AWS_ACCESS_KEY_ID=kvtrace-compare AWS_SECRET_ACCESS_KEY=kvtrace-compare-secret
s3s-fs --host 127.0.0.1 --port "$S3" --access-key "$AWS_ACCESS_KEY_ID" \
  --secret-key "$AWS_SECRET_ACCESS_KEY" "$WORK/s3" >/dev/null 2>&1 &
PIDS+=($!)
wait_for python3 -c "import socket; socket.create_connection(('127.0.0.1', $S3))"

flush() {
  redis-cli -p "$REDIS" flushall >/dev/null
  for p in "${NODES[@]}"; do redis-cli -p "$p" flushall >/dev/null; done
  rm -rf "$WORK/fs" "$WORK/s3/kvcache"/* "$WORK/out"
  sync
}

declare -A TIER=(
  [fs-direct]="{\"type\":\"fs\",\"path\":\"$WORK/fs\",\"direct\":true}"
  [redis]="{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:$REDIS/0\"}"
  [redis-cluster]="{\"type\":\"resp-cluster\",\"nodes\":[\"redis://127.0.0.1:${NODES[0]}\"]}"
  [s3]="{\"type\":\"s3\",\"endpoint\":\"http://127.0.0.1:$S3\",\"bucket\":\"kvcache\"}"
)

if [ "${BENCH_ONLY:-0}" = 1 ]; then set --; fi
echo "| trace | L2 tier | I/O | wall | hit rate | L2 writes / reads | queue wait p50 / p99 | service p50 / p99 | end to end p50 / p99 | schedule lag p50 / p99 | drain | MiB/s |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for trace in "$@"; do
  for backend in fs-direct redis redis-cluster s3; do
    for io in synchronous asynchronous; do
      flush
      # shellcheck disable=SC2086
      "$KVTRACE" replay "$trace" -q --no-csv --l2-adapter "${TIER[$backend]}" --l2-io "$io" ${REPLAY_FLAGS:-} \
        --output-dir "$WORK/out" --json="$WORK/r.json" 2>"$WORK/stderr" || { echo "$backend $io: $(tail -1 "$WORK/stderr")" >&2; exit 1; }
      python3 - "$WORK/r.json" "$(basename "$trace")" "$backend" "$io" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))["kvtrace"]
io = doc["tier_io"][-1]["calls"]
tier = doc["tiers"][-1]
ms = lambda p: f"{p['p50_ms']:.2f} / {p['p99_ms']:.2f} ms"
errors = tier["write_errors"] + tier["read_errors"] + tier["delete_errors"]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {json.load(open(sys.argv[1]))['duration_s']:.2f} s"
      f" | {100 * doc['hits']['hit_rate']:.2f} % | {io['writes']} / {io['reads']}"
      f" | {ms(io['queue_wait_ms'])} | {ms(io['service_ms'])} | {ms(io['end_to_end_ms'])}"
      f" | {ms(io['schedule_lag_ms']) if io['schedule_lag_ms'] else '–'}"
      f" | {io['drain_s']:.2f} s | {io['mib_per_s']:.0f}"
      + (f" ({errors} errors)" if errors else "") + " |")
EOF
    done
  done
done

BENCH_FLAGS=${BENCH_FLAGS:---model llama3.1-8b --num-users 8 --cpu-mem-gb 0 --generation-mode none --seed 42}
declare -A STORAGE=(
  [fs-direct]="--cache-dir $WORK/fs --direct-io"
  [redis-cluster]="--storage-tier {\"type\":\"resp-cluster\",\"nodes\":[\"redis://127.0.0.1:${NODES[0]}\"]}"
  [s3]="--storage-tier {\"type\":\"s3\",\"endpoint\":\"http://127.0.0.1:$S3\",\"bucket\":\"kvcache\"}"
)
echo
echo "| bench storage tier | I/O | requests | tok/s | storage GiB/s | request storage read p95 | cached tok/s | queue wait p50 / p99 | service p50 / p99 | end to end p99 | queue-room wait | drain | MiB/s |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for backend in fs-direct redis-cluster s3; do
  for io in synchronous asynchronous; do
    flush
    mkdir -p "$WORK/fs"
    # shellcheck disable=SC2086
    "$KVTRACE" bench -q $BENCH_FLAGS --duration "${BENCH_SECONDS:-10}" ${STORAGE[$backend]} \
      --storage-io "$io" $([ "$io" = asynchronous ] && echo "${BENCH_ASYNC_FLAGS:-}") --output "$WORK/b.json" 2>"$WORK/stderr" || { echo "bench $backend $io: $(tail -1 "$WORK/stderr")" >&2; exit 1; }
    python3 - "$WORK/b.json" "$backend" "$io" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
s, k = doc["summary"], doc["kvtrace"]
io = k["storage_io"]
ms = lambda p: f"{p['p50_ms']:.1f} / {p['p99_ms']:.1f} ms"
errors = k["io_errors"]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {s['total_requests']} | {s['avg_throughput_tokens_per_sec']:.0f}"
      f" | {k['storage_io_throughput_gib_per_s']:.2f} | {s['cache_stats'].get('storage_read_p95_ms', 0):.0f} ms"
      f" | {k['cached_tokens_per_sec']:.0f} | {ms(io['queue_wait_ms'])} | {ms(io['service_ms'])}"
      f" | {io['end_to_end_ms']['p99_ms']:.1f} ms | {io['submit_stall_s']:.2f} s | {io['drain_s']:.2f} s"
      f" | {io['mib_per_s']:.0f}" + (f" ({errors} errors)" if errors else "") + " |")
EOF
  done
done

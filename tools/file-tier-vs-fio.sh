#!/usr/bin/env bash
# The file tier's write and read bandwidth against fio's on the same disk, in the same run.
#
# kvtrace replays a generated trace of 4 MiB objects through an accounting-only L1 of 16 MiB
# into a file tier with O_DIRECT, so nearly every store and every load is disk I/O; its report
# gives the bandwidth over the time the tier spent in writes and in reads. fio then writes and
# reads 4 MiB blocks with O_DIRECT, one at a time (psync, QD1: how the tier issues them), in
# the same directory. The script prints both and their ratio.
#
# Usage: tools/file-tier-vs-fio.sh [DIR] [RECORDS]
#   DIR must be on the disk under test (not tmpfs); default: a new directory under /var/tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v fio >/dev/null || { apt-get install -y fio >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y fio >/dev/null; }; }
dir="${1:-$(mktemp -d -p /var/tmp kvtrace-fio.XXXXXX)}"
records="${2:-3000}"
mkdir -p "$dir"
trap 'rm -rf "$dir/tier" "$dir/fio.dat" "$dir/t.lct" "$dir/report"' EXIT

cargo build --release --quiet
bin=target/release/kvtrace
# 2 (K, V) x 32 layers x 32 tokens x 1024 x 2 bytes = 4 MiB per object.
"$bin" generate "$dir/t.lct" --records "$records" --chunk-tokens 32 2>/dev/null
"$bin" replay "$dir/t.lct" -q --no-csv --json --output-dir "$dir/report" \
    --l1-size-gb 0.015625 --l1-accounting-only --eviction-timing immediate \
    --l2-adapter "{\"type\":\"fs\",\"path\":\"$dir/tier\",\"direct\":true}" || true
read -r kv_write kv_read kv_gib_w kv_gib_r < <(python3 - "$dir/report/trace_replay_summary.json" <<'PY'
import json, sys
k = json.load(open(sys.argv[1]))["kvtrace"]
io, t = k["tier_io"][0], k["tiers"][1]
print(io["write_mib_per_s"], io["read_mib_per_s"], t["bytes_written"] / 2**30, t["bytes_read"] / 2**30)
PY
)
sync
size=$(python3 -c "print(max(1, round(max($kv_gib_w, $kv_gib_r))))")g
fio_bw() { # rw -> MiB/s
    fio --name=kvtrace-"$1" --filename="$dir/fio.dat" --size="$size" --rw="$1" --bs=4m --direct=1 \
        --ioengine=psync --iodepth=1 --numjobs=1 --output-format=json 2>/dev/null |
        python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print(max(j['write']['bw'], j['read']['bw']) / 1024)"
}
fio_write=$(fio_bw write)
fio_read=$(fio_bw read)
printf 'moved by kvtrace: %.2f GiB written, %.2f GiB read (4 MiB objects, O_DIRECT)\n' "$kv_gib_w" "$kv_gib_r"
printf '%-6s %12s %12s %8s\n' "" "kvtrace" "fio" "ratio"
python3 - "$kv_write" "$fio_write" "$kv_read" "$fio_read" <<'PY'
import sys
kw, fw, kr, fr = map(float, sys.argv[1:])
for name, k, f in (("write", kw, fw), ("read", kr, fr)):
    print(f"{name:<6} {k:9.0f} MiB/s {f:7.0f} MiB/s {k / f * 100 if f else 0:7.1f} %")
PY

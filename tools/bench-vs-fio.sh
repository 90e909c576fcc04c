#!/usr/bin/env bash
# kvtrace bench's storage-only scenario against fio on the same disk, in the same run.
#
# kvtrace bench runs with no CPU or GPU tier (--cpu-mem-gb 0), no generation time and
# O_DIRECT storage I/O, so every byte it moves is disk I/O; its report gives the read and
# write bandwidth over the run. fio then runs the same mix on the same directory: 4 MiB
# O_DIRECT blocks, one synchronous stream per kvtrace worker, the read share kvtrace had, for
# as long. The script prints both bandwidths and their ratio, kvtrace's CPU seconds per GiB
# moved, and its peak RSS.
#
# Usage: tools/bench-vs-fio.sh [DIR] [USERS] [SECONDS]
#   DIR must be on the disk under test (not tmpfs); default: a new directory under /var/tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v fio >/dev/null || { apt-get install -y fio >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y fio >/dev/null; }; }
dir="${1:-$(mktemp -d -p /var/tmp kvtrace-bench-fio.XXXXXX)}"
users="${2:-8}"
secs="${3:-30}"
mkdir -p "$dir"
trap 'rm -rf "$dir/fio.dat" "$dir/r.json" "$dir/time"' EXIT

cargo build --release --quiet
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); dir: $dir"
/usr/bin/time -f "%e %U %S %M" -o "$dir/time" target/release/kvtrace bench --model llama3.1-8b \
    --num-users "$users" --duration "$secs" --cpu-mem-gb 0 --generation-mode none --direct-io \
    --no-fsync --storage-capacity-gb 16 --cache-dir "$dir" --seed 1 --output "$dir/r.json" -q
read -r wall user sys rss_kib <"$dir/time"
read -r kv_read kv_write read_pct gib < <(python3 - "$dir/r.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
c, t = s["cache_stats"], s["elapsed_time"]
r, w = c["tier_storage_kv_bytes_read_gb"], c["tier_storage_kv_bytes_written_gb"]
print(r * 1024 / t, w * 1024 / t, round(100 * r / (r + w)) if r + w else 50, r + w)
PY
)
sync
read -r fio_read fio_write < <(fio --name=kvtrace-mix --directory="$dir" --filename=fio.dat --size=4g \
    --rw=rw --rwmixread="$read_pct" --bs=4m --direct=1 --ioengine=psync --iodepth=1 \
    --numjobs="$users" --group_reporting --time_based --runtime="$secs" --output-format=json 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print(j['read']['bw']/1024, j['write']['bw']/1024)")
printf 'kvtrace moved %.1f GiB in %s s (%s%% reads), %s users; fio: same mix, %s streams of 4 MiB O_DIRECT\n' \
    "$gib" "$secs" "$read_pct" "$users" "$users"
printf '%-6s %12s %12s %8s\n' "" "kvtrace" "fio" "ratio"
python3 - "$kv_read" "$fio_read" "$kv_write" "$fio_write" <<'PY'
import sys
kr, fr, kw, fw = map(float, sys.argv[1:])
for name, k, f in (("read", kr, fr), ("write", kw, fw)):
    print(f"{name:<6} {k:9.0f} MiB/s {f:7.0f} MiB/s {k / f * 100 if f else 0:7.1f} %")
PY
python3 -c "print(f'CPU {($user + $sys):.1f} s for {$gib:.1f} GiB = {($user + $sys) / max($gib, 1e-9):.2f} CPU-s/GiB; peak RSS {$rss_kib / 1024:.0f} MiB; wall {$wall} s')"

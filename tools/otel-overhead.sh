#!/usr/bin/env bash
# What exporting spans costs a replay: the same AFAP replay of the 72k-record trace README's
# Performance section uses (`kvtrace generate --from-mooncake ... --loops 1`), without export,
# with --otlp-file, and with --otlp-endpoint to a local OTLP/HTTP collector (a Python
# http.server that answers every POST 200), in RUNS rounds (default 5) that run the three in
# turn, so the machine's drift hits them alike. Per mode: the best and median replay loop
# (`duration_s` of the summary, what the export could slow) and the best whole process (which
# also waits for the last batch).
# Usage: [RUNS=5] tools/otel-overhead.sh [MOONCAKE_TRACE]
set -euo pipefail
cd "$(dirname "$0")/.."
mooncake="${1:-../shared/traces/mooncake/conversation_trace.jsonl}"
runs="${RUNS:-5}"
[ -f "$mooncake" ] || { echo "no Mooncake trace at $mooncake" >&2; exit 2; }
tmp="$(mktemp -d)"
collector=""
trap '[ -n "$collector" ] && kill "$collector" 2>/dev/null; rm -rf "$tmp"' EXIT

cargo build --release --quiet
bin=target/release/kvtrace
"$bin" generate "$tmp/mc1.lct" --from-mooncake "$mooncake" --loops 1 2>/dev/null

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$tmp/collector.py" <<'PY'
import http.server, sys
class Collector(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Collector).serve_forever()
PY
# Niced, as a collector on another machine would not take the replay's cores.
nice -n 19 python3 "$tmp/collector.py" "$port" &
collector=$!
sleep 1

# one MODE: one replay in that mode; prints "loop whole" seconds.
one() {
    local flags=()
    case "$1" in
        file) flags=(--otlp-file "$tmp/spans.jsonl") ;;
        endpoint) flags=(--otlp-endpoint "http://127.0.0.1:$port" --otlp-protocol http-protobuf) ;;
    esac
    rm -rf "$tmp/out"
    /usr/bin/time -f "%e" -o "$tmp/time" "$bin" replay "$tmp/mc1.lct" -q --json \
        --l1-size-gb 2 --eviction-policy LRU --output-dir "$tmp/out" "${flags[@]}" 2>"$tmp/err" ||
        { cat "$tmp/err" >&2; exit 1; }
    echo "$(python3 -c "import json;print(json.load(open('$tmp/out/trace_replay_summary.json'))['duration_s'])") $(cat "$tmp/time")"
}

echo "machine: $(nproc) cores; $("$bin" info "$tmp/mc1.lct" | awk '/total_records/ {print $2}') records; $runs rounds, the modes in turn within each"
modes=(none file endpoint)
for _ in $(seq "$runs"); do
    for m in "${modes[@]}"; do
        echo "$m $(one "$m")" >>"$tmp/results"
    done
done
# Per mode: the best and the median replay loop, and the best whole process.
python3 - "$tmp/results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
base = None
for mode, label in [("none", "no export"), ("file", "--otlp-file"),
                    ("endpoint", "--otlp-endpoint (http/protobuf)")]:
    loop = sorted(float(r[1]) for r in rows if r[0] == mode)
    whole = min(float(r[2]) for r in rows if r[0] == mode)
    best, median = loop[0], statistics.median(loop)
    if base is None:
        base = (best, median)
        extra = ""
    else:
        extra = f"  ({best / base[0] - 1:+.0%} best, {median / base[1] - 1:+.0%} median)"
    print(f"{label:<34} replay loop best {best:.3f} s, median {median:.3f} s; whole process {whole:.2f} s{extra}")
PY
echo "spans file: $(wc -l <"$tmp/spans.jsonl") export requests, $(stat -c %s "$tmp/spans.jsonl") bytes"

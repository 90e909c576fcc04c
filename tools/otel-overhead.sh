#!/usr/bin/env bash
# What exporting spans costs a replay: the same AFAP replay of the 72k-record trace README's
# Performance section uses (`kvtrace generate --from-mooncake ... --loops 1`), without export,
# with --otlp-file, and with --otlp-endpoint to a local OTLP/HTTP collector (a Python
# http.server that answers every POST 200 and counts the bytes), in one run. Each figure is
# the best of RUNS (default 3): the replay loop's own seconds (`duration_s` of the summary,
# what the export could slow) and the whole process (which also waits for the last batch).
# Usage: [RUNS=3] tools/otel-overhead.sh [MOONCAKE_TRACE]
set -euo pipefail
cd "$(dirname "$0")/.."
mooncake="${1:-../shared/traces/mooncake/conversation_trace.jsonl}"
runs="${RUNS:-3}"
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
python3 "$tmp/collector.py" "$port" &
collector=$!
sleep 1

# run LABEL FLAGS...: best replay-loop and whole-process seconds of $runs runs.
run() {
    local label="$1"; shift
    local loop="" whole=""
    for _ in $(seq "$runs"); do
        rm -rf "$tmp/out"
        /usr/bin/time -f "%e" -o "$tmp/time" "$bin" replay "$tmp/mc1.lct" -q --json \
            --l1-size-gb 2 --eviction-policy LRU --output-dir "$tmp/out" "$@" 2>"$tmp/err" ||
            { cat "$tmp/err" >&2; exit 1; }
        local l w
        l=$(python3 -c "import json;print(json.load(open('$tmp/out/trace_replay_summary.json'))['duration_s'])")
        w=$(cat "$tmp/time")
        if [ -z "$loop" ] || [ "$(echo "$l < $loop" | bc -l)" = 1 ]; then loop="$l"; fi
        if [ -z "$whole" ] || [ "$(echo "$w < $whole" | bc -l)" = 1 ]; then whole="$w"; fi
    done
    printf "%-34s replay loop %8.3f s   whole process %7.2f s\n" "$label" "$loop" "$whole"
}

echo "machine: $(nproc) cores; $("$bin" info "$tmp/mc1.lct" | awk '/total_records/ {print $2}') records"
run "no export"
run "--otlp-file" --otlp-file "$tmp/spans.jsonl"
run "--otlp-endpoint (http/protobuf)" --otlp-endpoint "http://127.0.0.1:$port" --otlp-protocol http-protobuf
echo "spans file: $(wc -l <"$tmp/spans.jsonl") export requests, $(stat -c %s "$tmp/spans.jsonl") bytes"

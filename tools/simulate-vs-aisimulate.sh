#!/usr/bin/env bash
# Differential run of `kvtrace simulate` against AISimulate's own engine (crate aisimulate-core
# 0.13.0, through tools/aisim-harness) over the configurations of testdata/aisimulate/cases.json:
# prints, for each, every report key the two share whose values differ (1e-9 relative), and
# the keys either one lacks. Timing keys (wall time and what divides by it) are skipped. Every
# case runs kvtrace with the engine argument "engine_version": "aisimulate-0.13" (the harness
# ignores it). In the cases' arguments {slice} is testdata/mooncake/conversation_head300.jsonl,
# {testdata} testdata and {shared} ../shared.
#
# Each side's whole process is also timed, the best of $RUNS runs (default 3, interleaved), and
# the line ends with both times and their ratio: the speed row of issue 36. Beside it, the
# best of the reports' own `wall_time_ms`: each engine's simulation alone, in process (trace
# reading, start-up and the written report excluded on both sides; AISimulate's includes
# its collector's final summary, kvtrace's does not), which is what the small samples compare
# once process start-up is taken away.
#
# Then, in one more run of each side outside the timing, every request's line: kvtrace's
# `--report-jsonl` against the harness's `--requests-jsonl`, on the fields of REQUEST_FIELDS
# below, as multisets (the two name a Mooncake trace's sessions differently).
#
# With REFERENCE=1 the harness's report of each case run is also written to
# testdata/aisimulate/<name>.report.json, and for a case marked "requests": true its lines,
# cut to those fields, to <name>.requests.jsonl: the references
# tests/simulate/reference_reports.rs holds kvtrace to without the harness.
#
# usage: tools/simulate-vs-aisimulate.sh [CASE...]
#
# The harness is built on first use (cargo build --release --manifest-path
# tools/aisim-harness/Cargo.toml; minutes: it compiles AISimulate's engine and its
# dependencies) into $AISIM_TARGET (default ../aisim-target). Exit status: 0 when every
# case agrees, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
kvtrace=${KVTRACE:-target/release/kvtrace}
[ -x "$kvtrace" ] || cargo build --release --quiet
target=${AISIM_TARGET:-../aisim-target}
harness=$target/release/aisim-harness
[ -x "$harness" ] || CARGO_TARGET_DIR=$target cargo build --release --quiet \
    --manifest-path tools/aisim-harness/Cargo.toml
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cases=testdata/aisimulate/cases.json

# Sets `args` for one case, its placeholders filled in.
configure() {
    mapfile -d '' -t args < <(python3 - "$cases" "$1" <<'PY'
import json, sys
case = next((c for c in json.load(open(sys.argv[1])) if c["name"] == sys.argv[2]), None)
if case is None:
    sys.exit(f"no case {sys.argv[2]} in {sys.argv[1]}")
for a in case["args"]:
    a = a.replace("{slice}", "testdata/mooncake/conversation_head300.jsonl")
    a = a.replace("{testdata}", "testdata").replace("{shared}", "../shared")
    sys.stdout.write(a + "\0")
PY
    )
    [ ${#args[@]} -gt 0 ] || exit 2
}

mapfile -t matrix < <(python3 -c 'import json, sys; [print(c["name"]) for c in json.load(open(sys.argv[1]))]' "$cases")
[ $# -gt 0 ] && matrix=("$@")
status=0
for name in "${matrix[@]}"; do
    configure "$name"
    best_k= best_a=
    for run in $(seq "${RUNS:-3}"); do
        t0=$(date +%s%N)
        "$kvtrace" simulate "${args[@]}" --router-mode round_robin -q --report-json "$work/$name.kvtrace.$run.json"
        t1=$(date +%s%N)
        "$harness" "${args[@]}" --report-json "$work/$name.aisim.$run.json"
        t2=$(date +%s%N)
        k=$(( (t1 - t0) / 1000000 )) a=$(( (t2 - t1) / 1000000 ))
        [ -z "$best_k" ] || [ "$k" -lt "$best_k" ] && best_k=$k
        [ -z "$best_a" ] || [ "$a" -lt "$best_a" ] && best_a=$a
    done
    [ "${REFERENCE:-0}" = 1 ] && cp "$work/$name.aisim.${RUNS:-3}.json" "testdata/aisimulate/$name.report.json"
    "$kvtrace" simulate "${args[@]}" --router-mode round_robin -q --report-json "$work/$name.kvtrace.lines.json" \
        --report-jsonl "$work/$name.kvtrace.jsonl"
    "$harness" "${args[@]}" --report-json "$work/$name.aisim.lines.json" --requests-jsonl "$work/$name.aisim.jsonl"
    python3 - "$name" "$work/$name" "$cases" "${REFERENCE:-0}" <<'PY' || status=1
import json, sys
# The fields compared request by request (and kept in a case's reference lines).
REQUEST_FIELDS = ["turn_index", "arrival_time_ms", "input_length", "output_length",
                  "first_admit_ms", "first_token_ms", "last_token_ms", "reused_input_tokens",
                  "decode_reused_input_tokens", "prefill_worker_idx", "decode_worker_idx",
                  "terminal_status"]
name, stem, cases, reference = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
def rows(path):
    return [{f: json.loads(line).get(f) for f in REQUEST_FIELDS} for line in open(path)]
def key(row):
    return [(v is None, v) for v in row.values()]
ours, theirs = sorted(rows(f"{stem}.kvtrace.jsonl"), key=key), sorted(rows(f"{stem}.aisim.jsonl"), key=key)
def same(a, b):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b))
    return a == b
differ = sum(1 for a, b in zip(ours, theirs) if not all(same(a[f], b[f]) for f in REQUEST_FIELDS))
differ += abs(len(ours) - len(theirs))
print(f"{name}: per request, {len(theirs) - differ}/{len(theirs)} lines equal on {len(REQUEST_FIELDS)} fields")
case = next(c for c in json.load(open(cases)) if c["name"] == name)
if reference and case.get("requests"):
    with open(f"testdata/aisimulate/{name}.requests.jsonl", "w") as out:
        for row in theirs:
            out.write(json.dumps(row, separators=(",", ":")) + "\n")
sys.exit(1 if differ else 0)
PY
    python3 - "$name" "$work/$name" "${RUNS:-3}" "$best_k" "$best_a" <<'PY' || status=1
import json, sys
name, stem, runs = sys.argv[1], sys.argv[2], range(1, int(sys.argv[3]) + 1)
ours_all = [json.load(open(f"{stem}.kvtrace.{r}.json")) for r in runs]
theirs_all = [json.load(open(f"{stem}.aisim.{r}.json")) for r in runs]
ours, theirs = ours_all[-1], theirs_all[-1]
ours_ms, theirs_ms = int(sys.argv[4]), int(sys.argv[5])
ours_in = min(r["wall_time_ms"] for r in ours_all)
theirs_in = min(r["wall_time_ms"] for r in theirs_all)
live = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}
differ = []
def same(a, b):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b
for key in sorted(set(ours) & set(theirs) - live):
    a, b = ours[key], theirs[key]
    if not same(a, b):
        differ.append(f"  {key}: kvtrace {a!r}, aisimulate {b!r}")
only = sorted(set(ours) - set(theirs))
unwritten = sorted(set(theirs) - set(ours))
shared = len(set(ours) & set(theirs) - live)
print(f"{name}: {shared - len(differ)}/{shared} shared keys equal"
      + (f"; only in kvtrace: {', '.join(only)}" if only else "")
      + (f"; only in aisimulate: {', '.join(unwritten)}" if unwritten else "")
      + f"; whole process kvtrace {ours_ms} ms, aisimulate-core {theirs_ms} ms,"
      + f" {theirs_ms / max(ours_ms, 1):.1f}x"
      + f"; in process {ours_in:.2f} ms, {theirs_in:.2f} ms, {theirs_in / ours_in:.1f}x")
print("\n".join(differ)) if differ else None
sys.exit(1 if differ else 0)
PY
done
exit $status

#!/usr/bin/env bash
# Regenerates testdata/dynamo/<name>.report.json: what NVIDIA Dynamo 1.4.2's
# `python -m dynamo.replay` reports for each case of testdata/dynamo/cases.json
# (round_robin only: it is deterministic in Dynamo, so tests/simulate/reference_reports.rs can demand
# every key but the wall-time ones to 1e-9 relative).
#
# usage: DYNAMO_VENV=/path/to/venv tools/dynamo-reference.sh
set -euo pipefail
cd "$(dirname "$0")/.."
: "${DYNAMO_VENV:?set DYNAMO_VENV to a venv with ai-dynamo 1.4.2}"
"$DYNAMO_VENV/bin/python" - <<'PY'
import json, os, subprocess, sys
cases = json.load(open("testdata/dynamo/cases.json"))
for case in cases:
    args = [a.replace("{slice}", "testdata/mooncake/conversation_head300.jsonl").replace("{testdata}", "testdata")
            for a in case["args"]]
    out = f"testdata/dynamo/{case['name']}.report.json"
    cmd = [sys.executable, "-m", "dynamo.replay", *args, "--router-mode", "round_robin", "--report-json", out]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "DYN_LOG": "warn"})
    print(f"{case['name']}: {out}")
PY

#!/usr/bin/env bash
# Runs the mutation fuzz targets of tests/cli/fuzz.rs (LMCT reader, JSONL -> LCT, the Mooncake
# loader and simulation, ShareGPT, BurstGPT, the TOML tier file, the adapter JSON, aggregate's
# rank reports, sweep lists and grids, rank-mode environments, events traces, the OTLP file)
# for MINUTES each, in release mode, from SEED (default: the time, so each run explores anew).
# A panicking input is saved under target/fuzz-failures/ and named in the failure.
#
# usage: tools/fuzz.sh [MINUTES] [SEED]        (default 5 minutes per target)
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-5}
seed=${2:-$(date +%s)}
echo "fuzzing each target for $minutes min from seed $seed"
KVTRACE_FUZZ_SECONDS=$((minutes * 60)) KVTRACE_FUZZ_SEED=$seed \
    cargo test --release --test integration -- cli::fuzz:: --nocapture --test-threads 1 2>&1 | grep -E "^fuzz |panicked|test result"

#!/usr/bin/env bash
# Builds the kvtrace wheel: the Python module (crates/kvtrace-py, PyO3, abi3 for CPython 3.9+)
# and the kvtrace command in the wheel's scripts. Needs maturin (pip install maturin).
#   tools/build-wheel.sh [OUT_DIR]       # default: target/wheels
# Prints the wheel's path, its size and the build time.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/wheels}
maturin=${MATURIN:-maturin}
start=$(date +%s)
cargo build --release --locked --bin kvtrace
scripts=crates/kvtrace-py/python/kvtrace.data/scripts
rm -rf crates/kvtrace-py/python/kvtrace.data
mkdir -p "$scripts"
cp target/release/kvtrace "$scripts/kvtrace"
"$maturin" build --release --locked --manifest-path crates/kvtrace-py/Cargo.toml --out "$out" --quiet >&2
rm -rf crates/kvtrace-py/python/kvtrace.data
wheel=$(ls -t "$out"/kvtrace-*.whl | head -1)
echo "$wheel"
echo "wheel $(du -h "$wheel" | cut -f1), built in $(( $(date +%s) - start )) s" >&2

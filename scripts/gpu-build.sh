#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs, with the `cuda` feature, into DEST (default .gpu/bin):
# the tidal binary, the CUDA kernel and forward-pass test binaries and the kernel benchmark,
# stripped (they travel to the GPU machine). No CUDA toolkit is needed here.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-.gpu/bin}"
mkdir -p "$DEST"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/tidal-target}"
# The path of the test binary cargo just built for the given arguments.
test_binary() {
    cargo test "$@" --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])' | tail -1
}
cargo build --features cuda --bin tidal
cargo build -p tidal-kernels --features cuda --example cuda_bench
cp "$CARGO_TARGET_DIR/debug/tidal" "$CARGO_TARGET_DIR/debug/examples/cuda_bench" "$DEST/"
cp "$(test_binary -p tidal-kernels --features cuda --lib)" "$DEST/kernels-tests"
cp "$(test_binary -p tidal-runtime --features cuda --test cuda_model)" "$DEST/cuda-model-tests"
strip "$DEST"/*
ls -la "$DEST"

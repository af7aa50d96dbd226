#!/usr/bin/env bash
# Prints the path of a `schemathesis` executable (PyPI, pinned: its checks and data generation
# change between releases, and the gateway's property test must be reproducible), creating its
# virtual environment only when missing: idempotent, safe to run before every test.
# TIDAL_SCHEMATHESIS_VENV overrides the location (default /var/tmp/schemathesis-venv). Exits
# non-zero, with the reason on stderr, when Python or pip cannot provide it.
set -euo pipefail
version=4.32.5
venv="${TIDAL_SCHEMATHESIS_VENV:-/var/tmp/schemathesis-venv}"
st="$venv/bin/schemathesis"
if [ -x "$st" ] && [ "$("$st" --version 2>/dev/null)" = "schemathesis, version $version" ]; then
    echo "$st"
    exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" >&2
fi
"$venv/bin/python" -m pip install --quiet "schemathesis==$version" >&2
"$st" --version >&2
echo "$st"

#!/usr/bin/env bash
# Prints the path of a Python virtual environment with the official `openai` client, creating
# it (or installing the package) only when missing: idempotent, safe to run before every test.
# TIDAL_VENV overrides the location (default /var/tmp/tidal-venv). Exits non-zero, with the
# reason on stderr, when Python or pip cannot provide it.
set -euo pipefail
venv="${TIDAL_VENV:-/var/tmp/tidal-venv}"
py="$venv/bin/python"
if [ -x "$py" ] && "$py" -c 'import openai' >/dev/null 2>&1; then
    echo "$venv"
    exit 0
fi
if [ ! -x "$py" ]; then
    python3 -m venv "$venv" >&2
fi
"$py" -m pip install --quiet 'openai>=1.40,<3' >&2
"$py" -c 'import openai' >&2
echo "$venv"

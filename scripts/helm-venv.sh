#!/usr/bin/env bash
# Prints the path of a Python interpreter that can render the Helm chart (PyPI package
# `helm-python-sdk`: Helm's Go SDK behind a C ABI), creating its virtual environment only when
# missing: idempotent. The chart tests use it when no `helm` binary is on PATH.
# TIDAL_HELM_VENV overrides the location (default /var/tmp/helm-venv).
set -euo pipefail
venv="${TIDAL_HELM_VENV:-/var/tmp/helm-venv}"
py="$venv/bin/python"
if [ -x "$py" ] && "$py" -c 'import helm_python' >/dev/null 2>&1; then
    echo "$py"
    exit 0
fi
if [ ! -x "$py" ]; then
    python3 -m venv "$venv" >&2
fi
"$py" -m pip install --quiet 'helm-python-sdk==0.2.2' >&2
"$py" -c 'import helm_python' >&2
echo "$py"

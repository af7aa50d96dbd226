#!/usr/bin/env bash
# A real Kubernetes control plane on loopback for the tests: etcd, kube-apiserver and
# kube-controller-manager (no scheduler, no kubelet; tests/cluster binds pods and sets their
# status, as kwok does). Nothing outside this machine is needed.
#
#   eval "$(bash scripts/cluster.sh up)"   # starts one, prints `export KUBECONFIG=...` lines
#   bash scripts/cluster.sh env [DIR]      # prints those lines again
#   bash scripts/cluster.sh down [DIR]     # stops it by pid and removes its directory
#
# Each cluster lives in its own directory (`mktemp -d /tmp/tidal-cluster.XXXX`): PKI, etcd data,
# the admin kubeconfig, the three logs and `state` (pids and ports). `up` exports
# TIDAL_CLUSTER_DIR so that `down` finds it. Several clusters may run side by side (other
# checkouts, other test runs), so `down` and `env` act only on the one named by DIR or
# TIDAL_CLUSTER_DIR, never on a guess; `down` with none named, or none up, does nothing.
#
# Binaries: $TIDAL_K8S_BIN (a directory with etcd, kube-apiserver, kube-controller-manager),
# else ../shared/k8s/*.xz unpacked once into $TIDAL_K8S_CACHE (default /var/tmp/tidal-k8s),
# in a directory named after the archives' sha256 so that new versions replace old ones.
# Exit status 2: no binaries (the Kubernetes tests then skip); 1: the cluster did not start
# (the tail of the failing log is printed).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${TIDAL_K8S_CACHE:-/var/tmp/tidal-k8s}"
# Seconds `up` waits for each component before giving up.
timeout_s="${TIDAL_CLUSTER_TIMEOUT:-60}"

say() { echo "cluster.sh: $*" >&2; }

now_ms() { date +%s%3N; }

# Prints the directory holding the three binaries, unpacking them when needed.
binaries() {
    local names=(etcd kube-apiserver kube-controller-manager) n
    if [ -n "${TIDAL_K8S_BIN:-}" ]; then
        for n in "${names[@]}"; do
            [ -x "$TIDAL_K8S_BIN/$n" ] || { say "TIDAL_K8S_BIN=$TIDAL_K8S_BIN has no executable $n"; return 2; }
        done
        echo "$TIDAL_K8S_BIN"
        return 0
    fi
    local src="$root/../shared/k8s" missing=()
    for n in "${names[@]}"; do
        [ -r "$src/$n.xz" ] || missing+=("$src/$n.xz")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        say "no Kubernetes binaries: set TIDAL_K8S_BIN to a directory with ${names[*]}, or provide ${missing[*]}"
        return 2
    fi
    command -v xz >/dev/null || { say "xz is needed to unpack $src/*.xz"; return 2; }
    local key
    key="$(cd "$src" && sha256sum etcd.xz kube-apiserver.xz kube-controller-manager.xz | sha256sum | cut -c1-16)"
    local dir="$cache/bin-$key"
    if [ ! -x "$dir/kube-controller-manager" ]; then
        mkdir -p "$cache"
        # Unpacked beside the final name and renamed: a concurrent `up` never sees half a binary.
        local tmp
        tmp="$(mktemp -d "$cache/.unpack.XXXXXX")"
        for n in "${names[@]}"; do
            xz -dc "$src/$n.xz" >"$tmp/$n"
            chmod +x "$tmp/$n"
        done
        if ! mv -T "$tmp" "$dir" 2>/dev/null; then
            rm -rf "$tmp"   # another `up` unpacked the same version first
        fi
        # Versions other than this one are stale.
        find "$cache" -maxdepth 1 -name 'bin-*' ! -name "bin-$key" -exec rm -rf {} + 2>/dev/null || true
        say "unpacked the Kubernetes binaries into $dir"
    fi
    echo "$dir"
}

# Prints N free loopback ports (bound at once, so distinct).
free_ports() {
    python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# The PKI of one cluster, in $1. EC keys for the certificates (fast to make); the
# service-account signing key is RSA, which every token consumer accepts.
make_pki() {
    local d="$1"
    (
        cd "$d"
        ec() { openssl ecparam -name prime256v1 -genkey -noout -out "$1.key" 2>/dev/null; }
        ca() {
            ec "$1"
            openssl req -x509 -new -key "$1.key" -subj "/CN=$2" -days 3650 -out "$1.crt" \
                -addext "basicConstraints=critical,CA:TRUE" \
                -addext "keyUsage=critical,digitalSignature,keyCertSign,cRLSign" 2>/dev/null
        }
        # leaf NAME CA SUBJECT EXTENSIONS
        leaf() {
            ec "$1"
            openssl req -new -key "$1.key" -subj "$3" 2>/dev/null |
                openssl x509 -req -CA "$2.crt" -CAkey "$2.key" -CAcreateserial -days 3650 \
                    -out "$1.crt" -extfile <(printf '%b' "$4") 2>/dev/null
        }
        local client='basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n'
        ca ca tidal-test-ca
        leaf apiserver ca /CN=kube-apiserver \
            'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:10.96.0.1\n'
        leaf admin ca /O=system:masters/CN=kubernetes-admin "$client"
        leaf controller-manager ca /CN=system:kube-controller-manager "$client"
        ca front-proxy-ca tidal-test-front-proxy-ca
        leaf front-proxy-client front-proxy-ca /CN=front-proxy-client "$client"
        openssl genrsa -out sa.key 2048 2>/dev/null
        openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    )
}

# kubeconfig FILE SERVER CERT-NAME USER
kubeconfig() {
    local d b64
    d="$(dirname "$1")"
    b64() { base64 -w0 <"$1"; }
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: tidal-test
  cluster:
    server: $2
    certificate-authority-data: $(b64 "$d/pki/ca.crt")
users:
- name: $4
  user:
    client-certificate-data: $(b64 "$d/pki/$3.crt")
    client-key-data: $(b64 "$d/pki/$3.key")
contexts:
- name: tidal-test
  context:
    cluster: tidal-test
    user: $4
current-context: tidal-test
EOF
    chmod 600 "$1"
}

# The cluster directory named by $1 or $TIDAL_CLUSTER_DIR, if it holds a cluster.
cluster_dir() {
    local d="${1:-${TIDAL_CLUSTER_DIR:-}}"
    if [ -n "$d" ] && [ -r "$d/state" ]; then
        echo "$d"
    fi
}

print_env() {
    echo "export TIDAL_CLUSTER_DIR='$1'"
    echo "export KUBECONFIG='$1/admin.kubeconfig'"
}

# Stops the processes of cluster $1 (TERM, then KILL after 10 s) and removes its directory.
stop_cluster() {
    local d="$1" pid pids=() i
    # shellcheck disable=SC1091
    pids=($(. "$d/state" && echo "${KCM_PID:-} ${APISERVER_PID:-} ${ETCD_PID:-}"))
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for i in $(seq 100); do
        local alive=0
        for pid in "${pids[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        [ "$alive" -eq 0 ] && break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do
        kill -9 "$pid" 2>/dev/null || true
    done
    rm -rf "$d"
}

# wait_for WHAT LOG CMD...: runs CMD until it succeeds; on timeout (or when the process of
# LOG's component died) prints LOG's tail and fails.
wait_for() {
    local what="$1" log="$2" pid="$3"
    shift 3
    local deadline=$(($(date +%s) + timeout_s))
    until "$@" >/dev/null 2>&1; do
        if ! kill -0 "$pid" 2>/dev/null; then
            say "$what: the process exited; last lines of $log:"
            tail -n 30 "$log" >&2
            return 1
        fi
        if [ "$(date +%s)" -ge "$deadline" ]; then
            say "$what: not ready after ${timeout_s}s; last lines of $log:"
            tail -n 30 "$log" >&2
            return 1
        fi
        sleep 0.2
    done
}

up() {
    local bin
    bin="$(binaries)" || return $?
    command -v openssl >/dev/null || { say "openssl is needed for the cluster's certificates"; return 2; }
    command -v curl >/dev/null || { say "curl is needed to probe the cluster"; return 2; }
    local t0 d
    t0="$(now_ms)"
    d="$(mktemp -d /tmp/tidal-cluster.XXXX)"
    mkdir -p "$d/pki" "$d/etcd" "$d/kcm-certs"
    local etcd_port peer_port api_port kcm_port
    read -r etcd_port peer_port api_port kcm_port <<<"$(free_ports 4)"
    {
        echo "DIR='$d'"
        echo "API_PORT=$api_port"
        echo "ETCD_PORT=$etcd_port"
        echo "KCM_PORT=$kcm_port"
    } >"$d/state"
    # From here a failure stops what started and removes the directory.
    fail() { stop_cluster "$d"; return 1; }

    make_pki "$d/pki" || { say "openssl could not make the certificates"; fail; }
    local t_pki p
    t_pki="$(now_ms)"
    p="$d/pki"

    "$bin/etcd" --data-dir "$d/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
        --listen-peer-urls "http://127.0.0.1:$peer_port" --unsafe-no-fsync --log-level warn \
        </dev/null >"$d/etcd.log" 2>&1 &
    echo "ETCD_PID=$!" >>"$d/state"
    local etcd_pid=$!

    # Admission: the API server's default plugins, which are those a managed cluster (GKE,
    # EKS, AKS) runs for pods: NamespaceLifecycle, LimitRanger, ServiceAccount (hence the wait
    # for the `default` ServiceAccount), TaintNodesByCondition (new nodes start tainted
    # not-ready until their Ready condition holds), PodSecurity, Priority,
    # DefaultTolerationSeconds, ResourceQuota, the webhook and admission-policy plugins.
    # NodeRestriction (also on in managed clusters) stays off: it only restricts what
    # kubelets may write, and there are no kubelets here (tests/cluster writes as admin).
    "$bin/kube-apiserver" \
        --etcd-servers "http://127.0.0.1:$etcd_port" \
        --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
        --cert-dir "$d/pki" \
        --tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" \
        --client-ca-file "$p/ca.crt" \
        --requestheader-client-ca-file "$p/front-proxy-ca.crt" \
        --requestheader-allowed-names front-proxy-client \
        --requestheader-username-headers X-Remote-User \
        --requestheader-group-headers X-Remote-Group \
        --requestheader-extra-headers-prefix X-Remote-Extra- \
        --proxy-client-cert-file "$p/front-proxy-client.crt" \
        --proxy-client-key-file "$p/front-proxy-client.key" \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-account-key-file "$p/sa.pub" \
        --service-account-signing-key-file "$p/sa.key" \
        --service-cluster-ip-range 10.96.0.0/24 \
        --authorization-mode RBAC \
        --allow-privileged=true \
        --endpoint-reconciler-type none \
        --profiling=false \
        </dev/null >"$d/kube-apiserver.log" 2>&1 &
    echo "APISERVER_PID=$!" >>"$d/state"
    local api_pid=$!

    kubeconfig "$d/admin.kubeconfig" "https://127.0.0.1:$api_port" admin kubernetes-admin
    kubeconfig "$d/controller-manager.kubeconfig" "https://127.0.0.1:$api_port" \
        controller-manager system:kube-controller-manager

    wait_for etcd "$d/etcd.log" "$etcd_pid" curl -sf "http://127.0.0.1:$etcd_port/health" || fail
    local t_etcd t_api
    t_etcd="$(now_ms)"
    local api=(curl -sf --cacert "$p/ca.crt" --cert "$p/admin.crt" --key "$p/admin.key")
    wait_for kube-apiserver "$d/kube-apiserver.log" "$api_pid" \
        "${api[@]}" "https://127.0.0.1:$api_port/readyz" || fail
    t_api="$(now_ms)"

    # Controllers: the default set (Deployments, ReplicaSets, garbage collection, namespaces,
    # service accounts and their tokens, node lifecycle, pod GC, ...). Each controller gets
    # its own service account, as kubeadm and the managed clusters run it.
    "$bin/kube-controller-manager" \
        --kubeconfig "$d/controller-manager.kubeconfig" \
        --authentication-kubeconfig "$d/controller-manager.kubeconfig" \
        --authorization-kubeconfig "$d/controller-manager.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "$kcm_port" --cert-dir "$d/kcm-certs" \
        --service-account-private-key-file "$p/sa.key" --root-ca-file "$p/ca.crt" \
        --cluster-signing-cert-file "$p/ca.crt" --cluster-signing-key-file "$p/ca.key" \
        --use-service-account-credentials=true --leader-elect=false \
        --controllers '*' --profiling=false \
        </dev/null >"$d/kube-controller-manager.log" 2>&1 &
    echo "KCM_PID=$!" >>"$d/state"
    local kcm_pid=$!

    wait_for kube-controller-manager "$d/kube-controller-manager.log" "$kcm_pid" \
        curl -skf "https://127.0.0.1:$kcm_port/healthz" || fail
    local t_kcm t_sa
    t_kcm="$(now_ms)"
    wait_for "the default ServiceAccount" "$d/kube-controller-manager.log" "$kcm_pid" \
        "${api[@]}" "https://127.0.0.1:$api_port/api/v1/namespaces/default/serviceaccounts/default" || fail
    t_sa="$(now_ms)"

    say "$(awk -v t0="$t0" -v pki="$t_pki" -v etcd="$t_etcd" -v api="$t_api" -v kcm="$t_kcm" \
        -v sa="$t_sa" -v port="$api_port" -v d="$d" 'BEGIN {
        printf "up in %.1fs (pki %.1fs, etcd %.1fs, apiserver ready %.1fs, controller-manager %.1fs, default ServiceAccount %.1fs) at https://127.0.0.1:%s, in %s",
            (sa - t0) / 1000, (pki - t0) / 1000, (etcd - pki) / 1000, (api - etcd) / 1000,
            (kcm - api) / 1000, (sa - kcm) / 1000, port, d }')"
    print_env "$d"
}

cmd="${1:-}"
case "$cmd" in
    up)
        up
        ;;
    env)
        d="$(cluster_dir "${2:-}")"
        [ -n "$d" ] || { say "no cluster named: pass its directory or set TIDAL_CLUSTER_DIR"; exit 1; }
        print_env "$d"
        ;;
    down)
        d="$(cluster_dir "${2:-}")"
        if [ -z "$d" ]; then
            say "no cluster to stop (none named by DIR or TIDAL_CLUSTER_DIR, or it is gone)"
            exit 0
        fi
        stop_cluster "$d"
        say "stopped the cluster in $d"
        ;;
    *)
        echo "usage: $0 up|env [DIR]|down [DIR]" >&2
        exit 64
        ;;
esac

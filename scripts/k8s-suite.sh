#!/usr/bin/env bash
# A single-node Kubernetes on this host, as users run one, and the project's Kubernetes
# suite (tests/k8s/cases.sh) against it: every case with RuntimeClass `runc` and `kata`.
#
#   KATA_KERNEL=... KATA_INITRD=... KATA_SHIM_DIR=... KATA_IMAGE=... KATA_PAUSE_IMAGE=... \
#       scripts/k8s-suite.sh            (`make k8s` sets these as `make test` does)
#
# The node, all on this host, every process started here and ended by its pid:
#   - Kubernetes $K8S_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler,
#     kubelet, kube-proxy, kubectl), etcd and CoreDNS built from the Go module proxy by
#     scripts/k8s-build.sh (cached in /var/cache/kata-k8s/<version>/bin);
#   - a private containerd 2.3 (scripts/containerd-private.sh) with its CRI, the kata
#     runtimes appended from deploy/containerd/kata-containerd-2.x.toml as the README tells
#     users ($KATA_CONF_FILE in containerd's environment names a configuration with our
#     kernel, initrd and kata-vsock; the snippet has no options table), Debian's
#     CNI plugins (a bridge on a private /24 whose gateway address is the node's IP), the
#     images of scripts/critest-images.sh and scripts/k8s-images.sh served by a loopback
#     registry that registry.k8s.io, docker.io, gcr.io and quay.io resolve to;
#   - the control plane authenticating its clients by a static token (system:masters),
#     RBAC and Node authorization, RuntimeClass admission; kubelet with cgroupfs on this
#     cgroup v1 host (failCgroupV1: false) under a cgroup root of its own; kube-proxy in
#     iptables mode (masquerading service traffic: no br_netfilter needed); CoreDNS as a
#     Deployment with its Service, as kubeadm installs it (no forwarding: only cluster
#     names resolve, nothing leaves the host);
#   - the RuntimeClasses of deploy/kubernetes/runtimeclass.yaml, applied as users do, and
#     `runc`.
# Then the cases run, K8S_JOBS at a time, each in a namespace of its own per RuntimeClass;
# the node-wide ones (kubelet and containerd restarts) alone at the end, then the Helm
# chart's install, upgrade and uninstall on the node made one without our runtime
# (tests/k8s/helm.sh). The summary is a
# table case x runc x kata; the run fails when a case fails with kata that passes with runc
# and tests/k8s-kata-expected-failures.txt does not list it with its reason, or when a case
# fails with runc (a broken case). Everything is undone at the end, also on failure, and
# what would be left behind (processes, mounts, network namespaces, sandboxes) is checked.
#
# Env:
#   K8S_VERSION etc.     see scripts/k8s-build.sh
#   K8S_CONTAINERD_BIN   containerd, ctr, containerd-shim-runc-v2 (default
#                        /var/cache/kata-containerd/2.3/usr/bin)
#   K8S_JOBS             cases at once (default 3)
#   K8S_CASES            space-separated case names to run (default: all)
#   K8S_RUNTIMES         default "runc kata"
#   K8S_LOG_DIR          logs of the last run (default /var/tmp/kata-k8s)
#   K8S_HOLD=1           bring the node up, print how to reach it, wait until interrupted
#   K8S_EXPECTED_FAILURES  the allow-list (default tests/k8s-kata-expected-failures.txt)
set -euo pipefail

prog=k8s-suite
here=$(dirname -- "$(realpath -- "$0")")
repo=$(dirname -- "$here")
die() { echo "$prog: $*" >&2; exit 1; }
log() { echo "$prog: $(date +%T) $*" >&2; }

CONTAINERD_BIN=${K8S_CONTAINERD_BIN:-/var/cache/kata-containerd/2.3/usr/bin}
JOBS=${K8S_JOBS:-3}
RUNTIMES=${K8S_RUNTIMES:-"runc kata"}
LOG_DIR=${K8S_LOG_DIR:-/var/tmp/kata-k8s}
EXPECTED=${K8S_EXPECTED_FAILURES:-$repo/tests/k8s-kata-expected-failures.txt}
NODE=kata-node

CRI_LIB_CACHE=/var/cache/kata-critest
# shellcheck source=cri-lib.sh
. "$here/cri-lib.sh"
check_node_inputs k8s "$CONTAINERD_BIN"
[ -f "$EXPECTED" ] || die "the allow-list $EXPECTED is missing"
for tool in jq curl ip ss openssl iptables losetup flock "${CC:-gcc}"; do
    command -v "$tool" >/dev/null || die "'$tool' not found in PATH (scripts/setup-host.sh installs it)"
done

mkdir -p "$LOG_DIR"
rm -rf "${LOG_DIR:?}"/*

# ---- the binaries ----
t0=$SECONDS
K8S_BIN=$(bash "$here/k8s-build.sh") || die "building Kubernetes failed"
T_BUILD=$((SECONDS - t0))
export PATH="$K8S_BIN:$CONTAINERD_BIN:$KATA_SHIM_DIR:$PATH"

# ---- run-time state, all undone by cleanup ----
WORK=/tmp/kk8s-$$
mkdir -p "$WORK"
chmod 0755 "$WORK"
CD_DIR=$WORK/cd
BRIDGE=kk8s$(($$ % 100000))
NETNAME=kata-k8s-$$
SUBNET=
NODE_IP=
SOCK=
REGISTRY_PID=
STARTED_CONTAINERD=0
CGROUP_ROOT=kata-k8s-$$
KUBELET_VAR_CREATED=0
[ -e /var/lib/kubelet ] || KUBELET_VAR_CREATED=1
SBS_BEFORE=$(ls /run/vc/sbs 2>/dev/null | sort || true)
NETNS_BEFORE=$(ls /var/run/netns 2>/dev/null | sort || true)
KUBE_CHAINS_BEFORE=
running=()  # the cases running (tests/k8s/cases.sh)

export KUBECONFIG=$WORK/admin.kubeconfig
k() { kubectl --request-timeout=60s "$@"; }
# crictl (built by scripts/critest.sh) removes what kubelet could not, when it is there.
CRICTL=$(ls /var/cache/kata-critest/*/crictl 2>/dev/null | tail -n 1 || true)
crictl_() { [ -n "$CRICTL" ] || return 1; "$CRICTL" --runtime-endpoint "unix://$SOCK" --image-endpoint "unix://$SOCK" --timeout 60s "$@"; }

# The node's processes: each started in a session of its own, its pid in $WORK/pids/NAME
# (a file, so that a case restarting kubelet or containerd in a subshell records the new
# pid where the clean-up finds it), its log $LOG_DIR/NAME.log.
# PID and every process below it (by parent pid), parents first.
tree_of() { # PID
    local c
    echo "$1"
    for c in $(pgrep -P "$1" 2>/dev/null); do tree_of "$c"; done
}
# Ends each PID and its descendants (a kubectl, a k8s-pty and its session): SIGTERM, then
# SIGKILL 5 s later to those still there.
kill_tree() { # PID...
    local pids=() p alive
    for p in "$@"; do mapfile -t -O "${#pids[@]}" pids < <(tree_of "$p"); done
    [ ${#pids[@]} -gt 0 ] || return 0
    kill -TERM "${pids[@]}" 2>/dev/null
    for _ in $(seq 50); do
        alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 1 ] || return 0
        sleep 0.1
    done
    kill -KILL "${pids[@]}" 2>/dev/null
    return 0
}
pid_of() { cat "$WORK/pids/$1" 2>/dev/null || true; }
start_proc() { # NAME CMD...
    local name=$1
    shift
    mkdir -p "$WORK/pids"
    setsid "$@" </dev/null >>"$LOG_DIR/$name.log" 2>&1 &
    echo $! >"$WORK/pids/$name"
}
# Ends process NAME: SIGTERM, then SIGKILL after SECONDS (default 10).
stop_proc() { # NAME [SECONDS]
    local pid i
    pid=$(pid_of "$1")
    [ -n "$pid" ] || return 0
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
        for i in $(seq $((${2:-10} * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    fi
    wait "$pid" 2>/dev/null || true
    rm -f "$WORK/pids/$1"
}

cleanup() {
    local status=$? ids=() id root m ns
    trap - EXIT INT TERM
    set +e
    log "cleaning up"
    # Cases still running (an interrupted run), with everything they started.
    local p
    # shellcheck disable=SC2046
    kill_tree "${running[@]}" $(cat "$WORK"/case-pids/* 2>/dev/null)
    if [ -n "$(pid_of kube-apiserver)" ] && [ -n "$(pid_of kubelet)" ]; then
        # As a user would: namespaces deleted, kubelet stops and removes their pods.
        for ns in $(k get ns -o name 2>/dev/null | sed -n 's#^namespace/\(t-.*\)#\1#p'); do
            k delete ns "$ns" --wait=false >/dev/null 2>&1
        done
        k -n kube-system delete deploy coredns --wait=false >/dev/null 2>&1
        # A DaemonSet left by a failed case (the Helm chart's installer) would recreate its pods.
        k delete daemonsets --all -A --wait=false >/dev/null 2>&1
        k delete pods --all -A --wait=false >/dev/null 2>&1
        # kubelet stops each pod's containers and its sandbox (a kata pod's VM with it).
        for _ in $(seq 90); do
            [ -z "$(k get pods -A --no-headers 2>/dev/null)" ] && break
            sleep 1
        done
    fi
    for p in kube-proxy kubelet kube-scheduler kube-controller-manager; do stop_proc "$p"; done
    if [ "$STARTED_CONTAINERD" = 1 ]; then
        mapfile -t ids < <(crictl_ pods -q 2>/dev/null)
        [ ${#ids[@]} -eq 0 ] || { log "removing ${#ids[@]} pods kubelet left"; crictl_ rmp -f "${ids[@]}" >/dev/null 2>&1; }
        mapfile -t ids < <(ls "$CD_DIR/state/io.containerd.runtime.v2.task/k8s.io" 2>/dev/null)
        cp -f "$CD_DIR/containerd.log" "$LOG_DIR/containerd.log" 2>/dev/null
        bash "$here/containerd-private.sh" stop "$CD_DIR" >/dev/null 2>&1 ||
            log "warning: stopping containerd failed (log: $LOG_DIR/containerd.log)"
        for id in "${ids[@]}"; do
            for root in /run/vc/sbs /run/vc/vm /run/kata-containers/shared/sandboxes; do
                [ -e "$root/$id" ] || continue
                log "removing $root/$id, left by a sandbox"
                awk -v d="$root/$id/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | tac |
                    while read -r m; do umount -l "$m"; done
                rm -rf --one-file-system "${root:?}/$id"
            done
        done
    fi
    stop_proc kube-apiserver
    stop_proc etcd
    stop_registry
    # kube-proxy's rules (its own clean-up mode), kubelet's chains, then what CNI left of
    # pods that could not be removed.
    kube-proxy --cleanup >/dev/null 2>&1
    remove_new_kube_chains
    cni_leftovers "$NETNAME" "$SUBNET"
    [ -e "/sys/class/net/$BRIDGE" ] && ip link del "$BRIDGE"
    # Loop devices of the block volume cases.
    losetup -a 2>/dev/null | grep -F "$WORK/" | cut -d: -f1 | xargs -r -n1 losetup -d
    # kubelet's mounts (volumes, its pods' dirs) under the work dir.
    awk -v d="$WORK/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r |
        while read -r m; do umount -l "$m" 2>/dev/null; done
    # kubelet's cgroups: the root of its own, deepest first.
    find /sys/fs/cgroup/*/"$CGROUP_ROOT" -depth -type d -exec rmdir {} + 2>/dev/null
    [ "$KUBELET_VAR_CREATED" = 1 ] && rm -rf --one-file-system /var/lib/kubelet
    rm -rf --one-file-system "$WORK"
    leftovers || [ "$status" != 0 ] || status=1
    exit "$status"
}

# The KUBE-* iptables chains of each table, "CMD TABLE CHAIN" per line: kubelet makes its
# own (KUBE-FIREWALL, KUBE-KUBELET-CANARY), which kube-proxy --cleanup leaves.
kube_chains() {
    local cmd t
    for cmd in iptables ip6tables; do
        command -v "$cmd" >/dev/null || continue
        for t in filter nat mangle; do
            "$cmd" -t "$t" -S 2>/dev/null | awk -v c="$cmd" -v t="$t" '/^-N KUBE-/ { print c, t, $2 }'
        done
    done
}
# Removes the KUBE-* chains this run made (and the rules that jump to them).
remove_new_kube_chains() {
    local cmd t chain rule
    kube_chains | while read -r cmd t chain; do
        grep -qxF "$cmd $t $chain" <<<"$KUBE_CHAINS_BEFORE" && continue
        "$cmd" -t "$t" -S 2>/dev/null | grep -E -- "-j $chain( |\$)" | while IFS= read -r rule; do
            eval "$cmd -t $t ${rule/#-A /-D }"
        done
        "$cmd" -t "$t" -F "$chain" 2>/dev/null
    done
    kube_chains | while read -r cmd t chain; do
        grep -qxF "$cmd $t $chain" <<<"$KUBE_CHAINS_BEFORE" || "$cmd" -t "$t" -X "$chain" 2>/dev/null
    done
}

# What a run must not leave: processes of ours, mounts, network namespaces, sandboxes.
leftovers() {
    local left=() p
    for p in /proc/[0-9]*; do
        tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -qF -- "$WORK" && left+=("process ${p#/proc/}: $(tr '\0' ' ' <"$p/cmdline" | cut -c1-120)")
    done
    grep -F "$WORK" /proc/self/mountinfo >/dev/null && left+=("mounts under $WORK")
    [ "$(ls /run/vc/sbs 2>/dev/null | sort)" = "$SBS_BEFORE" ] || left+=("/run/vc/sbs: $(ls /run/vc/sbs | tr '\n' ' ')")
    [ "$(ls /var/run/netns 2>/dev/null | sort)" = "$NETNS_BEFORE" ] || left+=("network namespaces: $(ls /var/run/netns | tr '\n' ' ')")
    local chains
    chains=$(kube_chains | grep -vxF -f <(printf '%s\n' "$KUBE_CHAINS_BEFORE") || true)
    [ -z "$chains" ] || left+=("iptables chains: $(tr '\n' ' ' <<<"$chains")")
    ip link show "$BRIDGE" >/dev/null 2>&1 && left+=("the bridge $BRIDGE")
    if [ ${#left[@]} -gt 0 ]; then
        echo "$prog: LEFT BEHIND:" >&2
        printf '  - %s\n' "${left[@]}" >&2
        return 1
    fi
    echo "$prog: nothing left behind (processes, mounts, network namespaces, sandboxes, iptables chains, the bridge)" >&2
}
KUBE_CHAINS_BEFORE=$(kube_chains)
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# The exec -it case's terminal (scripts/k8s-pty.c).
"${CC:-gcc}" -O2 -Wall -Wextra -Werror -o "$WORK/k8s-pty" "$here/k8s-pty.c" || die "compiling k8s-pty.c failed"

# ---- images and registry ----
t0=$SECONDS
export COREDNS_BIN=$K8S_BIN/coredns
CRI_LIB_IMAGE_INPUTS="$K8S_BIN/coredns $here/k8s-usock.c $here/k8s-inotify.c" build_images "$here/k8s-images.sh"
port=$(free_port 5200)
start_registry "$port"
registry=http://127.0.0.1:$port
push_images "$registry"
registry_hosts "$WORK/hosts" "$registry" registry.k8s.io docker.io gcr.io k8s.gcr.io quay.io
T_IMAGES=$((SECONDS - t0))

# ---- the network: a bridge whose gateway address is the node's ----
choose_subnet() {
    local routes n
    routes=$(ip -4 route show; ip -4 addr show)
    for n in $(seq $(($$ % 200 + 10)) 250) $(seq 10 $(($$ % 200 + 10))); do
        grep -q "10\.78\.$n\." <<<"$routes" || { echo "10.78.$n"; return 0; }
    done
    die "no free 10.78.N.0/24"
}
SUBNET=$(choose_subnet)
NODE_IP=$SUBNET.1
POD_CIDR=$SUBNET.0/24
SERVICE_CIDR=10.79.$((${SUBNET##*.})).0/24
SERVICE_PREFIX=${SERVICE_CIDR%.0/24}
DNS_IP=$SERVICE_PREFIX.10
ip link add "$BRIDGE" type bridge
ip addr add "$NODE_IP/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
mkdir -p "$WORK/cni/net.d"
cni_conflist "$WORK/cni/net.d/10-kata-k8s.conflist" "$NETNAME" "$BRIDGE" "$SUBNET"

# ---- containerd with the CRI and our runtimes as the README tells users ----
t0=$SECONDS
kata_config=$WORK/configuration.toml
# The shipped snippet has no options table; $KATA_CONF_FILE names the test's configuration.
export KATA_CONF_FILE=$kata_config
kata_test_config "$kata_config"
cfgver=$(containerd_config_version containerd)
[ "$cfgver" -ge 3 ] || die "the suite runs on containerd 2.x; $CONTAINERD_BIN has $(containerd --version)"
kata_snippet "$cfgver" >"$WORK/kata-runtimes.toml"
# `kata-pool`: the kata runtime with a VM pool (case vm-pool, which runs its factory).
# Its own configuration by ConfigPath: $KATA_CONF_FILE would name the other one.
POOL_CONFIG=$WORK/configuration-pool.toml
kata_test_config "$POOL_CONFIG"
printf '[factory]\nvm_cache_number = 1\nvm_cache_dir = "%s"\n' "$WORK/pool" >>"$POOL_CONFIG"
pool_runtime="[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.kata-pool]
  runtime_type = \"io.containerd.kata.v2\"
  privileged_without_host_devices = true
[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.kata-pool.options]
  ConfigPath = \"$POOL_CONFIG\""
# `kata-resize`: the kata runtime whose VMs may grow past their boot size by one vCPU and
# 1280 MiB (case resize).
RESIZE_CONFIG=$WORK/configuration-resize.toml
kata_test_config "$RESIZE_CONFIG"
printf 'pod_resize_vcpus = 1\npod_resize_memory = 1280\n' >>"$RESIZE_CONFIG"
pool_runtime="$pool_runtime
[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.kata-resize]
  runtime_type = \"io.containerd.kata.v2\"
  privileged_without_host_devices = true
[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.kata-resize.options]
  ConfigPath = \"$RESIZE_CONFIG\""
extra="[plugins.\"io.containerd.cri.v1.images\".registry]
  config_path = \"$WORK/hosts\""
capeff=$(awk '/^CapEff:/ { print $2 }' /proc/self/status)
if (( (16#$capeff >> 24 & 1) == 0 )); then
    extra="$extra
[plugins.\"io.containerd.cri.v1.runtime\"]
  restrict_oom_score_adj = true"
fi
STARTED_CONTAINERD=1
# Env: KATA_SNIPPET=none (no kata runtime), CONTAINERD_KEEP_CONFIG=1 (the config as it is:
# the Helm chart's installer has changed it), see containerd-private.sh.
start_containerd() {
    local toml=$extra
    [ "${KATA_SNIPPET:-}" = none ] || toml="$toml
$pool_runtime"
    SOCK=$(CONTAINERD_ENABLE_CRI=1 CONTAINERD_SANDBOX_IMAGE=localhost/kata-e2e-pause:latest \
        CONTAINERD_CNI_CONF_DIR="$WORK/cni/net.d" CONTAINERD_EXTRA_TOML="$toml" \
        CONTAINERD_KATA_SNIPPET="${KATA_SNIPPET:-$WORK/kata-runtimes.toml}" \
        bash "$here/containerd-private.sh" start "$CD_DIR")
}
start_containerd
ctr -a "$SOCK" -n k8s.io images import "$KATA_PAUSE_IMAGE" >/dev/null 2>"$LOG_DIR/ctr-import.log" ||
    { cat "$LOG_DIR/ctr-import.log" >&2; die "importing $KATA_PAUSE_IMAGE failed"; }
log "$(containerd --version | awk '{print $1, $3}') at $SOCK"

# ---- certificates, keys, tokens ----
PKI=$WORK/pki
mkdir -p "$PKI"
TOKEN=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
(
    cd "$PKI"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 \
        -subj /CN=kata-k8s-ca 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr \
        -subj /CN=kube-apiserver 2>/dev/null
    printf 'subjectAltName=IP:%s,IP:%s,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n' \
        "$SERVICE_PREFIX.1" "$NODE_IP" >ext.cnf
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
        -out apiserver.crt -days 2 -extfile ext.cnf 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    echo "$TOKEN,kata-k8s-admin,kata-k8s-admin,system:masters" >tokens.csv
    chmod 0600 ./*.key tokens.csv
) || die "making the node's certificates failed"

# ---- etcd and the control plane ----
ETCD_PORT=$(free_port 2479)
ETCD_PEER=$(free_port $((ETCD_PORT + 1)))
API_PORT=$(free_port 6443)
start_proc etcd etcd --name kata-k8s --data-dir "$WORK/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
    --initial-cluster "kata-k8s=http://127.0.0.1:$ETCD_PEER" --unsafe-no-fsync \
    --listen-metrics-urls "" --log-level warn
start_proc kube-apiserver kube-apiserver --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port "$API_PORT" \
    --service-cluster-ip-range "$SERVICE_CIDR" --cert-dir "$PKI" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" --token-auth-file "$PKI/tokens.csv" \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --authorization-mode Node,RBAC --allow-privileged=true \
    --kubelet-preferred-address-types InternalIP --profiling=false --v=1
cat >"$KUBECONFIG" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kata-k8s
  cluster:
    server: https://$NODE_IP:$API_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: admin
  user:
    token: $TOKEN
contexts:
- name: kata-k8s
  context: {cluster: kata-k8s, user: admin}
current-context: kata-k8s
EOF
chmod 0600 "$KUBECONFIG"
ok=0
for _ in $(seq 600); do
    if curl -fsS --cacert "$PKI/ca.crt" -H "Authorization: Bearer $TOKEN" \
        "https://$NODE_IP:$API_PORT/readyz" >/dev/null 2>&1; then
        ok=1
        break
    fi
    kill -0 "$(pid_of kube-apiserver)" 2>/dev/null || break
    sleep 0.2
done
[ $ok = 1 ] || { tail -n 30 "$LOG_DIR/kube-apiserver.log" "$LOG_DIR/etcd.log" >&2; die "kube-apiserver did not become ready"; }
start_proc kube-controller-manager kube-controller-manager --kubeconfig "$KUBECONFIG" \
    --authentication-kubeconfig "$KUBECONFIG" --authorization-kubeconfig "$KUBECONFIG" \
    --bind-address 127.0.0.1 --secure-port "$(free_port 10357)" --leader-elect=false \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --use-service-account-credentials=true --service-cluster-ip-range "$SERVICE_CIDR" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" --v=1
start_proc kube-scheduler kube-scheduler --kubeconfig "$KUBECONFIG" \
    --authentication-kubeconfig "$KUBECONFIG" --authorization-kubeconfig "$KUBECONFIG" \
    --bind-address 127.0.0.1 --secure-port "$(free_port 10359)" --leader-elect=false --v=1

# ---- kubelet and kube-proxy ----
for c in /sys/fs/cgroup/*/; do
    [ -d "$c" ] && [ ! -L "${c%/}" ] && mkdir -p "$c$CGROUP_ROOT" 2>/dev/null
done
printf 'nameserver 127.0.0.1\n' >"$WORK/resolv.conf"
KUBELET_PORT=$(free_port 10250)
cat >"$WORK/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
failSwapOn: false
containerRuntimeEndpoint: unix://$SOCK
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $(free_port 10248)
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
resolvConf: $WORK/resolv.conf
podLogsDir: $WORK/pod-logs
syncFrequency: 10s
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
rotateCertificates: false
shutdownGracePeriod: 0s
containerLogMaxSize: 10Mi
EOF
start_kubelet() {
    start_proc kubelet kubelet --config "$WORK/kubelet.yaml" --kubeconfig "$KUBECONFIG" \
        --root-dir "$WORK/kubelet" --hostname-override "$NODE" --node-ip "$NODE_IP" --v=1
}
start_kubelet
cat >"$WORK/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $KUBECONFIG}
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:$(free_port 10256)
metricsBindAddress: 127.0.0.1:$(free_port 10249)
iptables: {masqueradeAll: true}
conntrack: {maxPerCore: 0}
nodePortAddresses: ["$NODE_IP/32"]
EOF
start_proc kube-proxy kube-proxy --config "$WORK/kube-proxy.yaml" --v=1
ok=0
for _ in $(seq 120); do
    k wait "node/$NODE" --for=condition=Ready --timeout=1s >/dev/null 2>&1 && { ok=1; break; }
    kill -0 "$(pid_of kubelet)" 2>/dev/null || break
    sleep 1
done
[ $ok = 1 ] || { tail -n 40 "$LOG_DIR/kubelet.log" >&2; die "the node did not become Ready (log: $LOG_DIR/kubelet.log)"; }

# ---- cluster add-ons: CoreDNS as kubeadm installs it, the RuntimeClasses ----
k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        cache 30
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      containers:
      - name: coredns
        image: registry.k8s.io/coredns/coredns:v1.14.7
        args: [-conf, /etc/coredns/Corefile]
        resources: {requests: {cpu: 50m, memory: 32Mi}, limits: {memory: 170Mi}}
        volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
        ports:
        - {containerPort: 53, name: dns, protocol: UDP}
        - {containerPort: 53, name: dns-tcp, protocol: TCP}
        readinessProbe: {httpGet: {path: /ready, port: 8181}, periodSeconds: 2}
        livenessProbe: {httpGet: {path: /health, port: 8080}, periodSeconds: 10}
      volumes:
      - name: config
        configMap: {name: coredns, items: [{key: Corefile, path: Corefile}]}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: $DNS_IP
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: runc}
handler: runc
EOF
k apply -f "$repo/deploy/kubernetes/runtimeclass.yaml" >/dev/null
for rc in kata-pool kata-resize; do
    sed -e "s/^  name: kata\$/  name: $rc/" -e "s/^handler: kata\$/handler: $rc/" \
        "$repo/deploy/kubernetes/runtimeclass.yaml" | awk '/^---/ { n++ } n == 0' | k apply -f - >/dev/null
done
k -n kube-system rollout status deploy/coredns --timeout=180s >/dev/null ||
    { k -n kube-system describe pods >&2; die "CoreDNS did not become ready"; }
T_NODE=$((SECONDS - t0))
log "node $NODE ($NODE_IP) Ready with CoreDNS ($DNS_IP): Kubernetes $(kubelet --version | awk '{print $2}'); build/cache ${T_BUILD}s, images ${T_IMAGES}s, node ${T_NODE}s"

if [ "${K8S_HOLD:-0}" = 1 ]; then
    log "holding (K8S_HOLD=1) until interrupted: export KUBECONFIG=$KUBECONFIG PATH=$K8S_BIN:\$PATH"
    sleep infinity &
    wait $! || true
    exit 0
fi

# ---- the suite ----
export NODE NODE_IP WORK LOG_DIR SOCK K8S_BIN CD_DIR
# shellcheck source=../tests/k8s/cases.sh
. "$repo/tests/k8s/cases.sh"
# shellcheck source=../tests/k8s/helm.sh
. "$repo/tests/k8s/helm.sh"
run_suite

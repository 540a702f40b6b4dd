#!/usr/bin/env bash
# Builds the single-node Kubernetes of the Kubernetes suite (issue 39) from the Go module
# proxy, pinned, into a cache outside the repo:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl
#   (k8s.io/kubernetes), etcd (go.etcd.io/etcd/server/v3), coredns, helm.
#
#   scripts/k8s-build.sh        -> builds what is missing, prints the bin dir
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces its staging modules with
# ./staging/... paths. We build it from a wrapper module of our own that requires it and
# replaces each staging module with its published v0.<minor>.<patch> twin. etcd's main
# package has the same kind of go.mod, and gets the same treatment.
#
# Layout: $KATA_K8S_CACHE/<k8s version>/bin/<tool> and a STAMP file naming every pinned
# version; a directory whose STAMP matches is left alone (delete it to build again).
#
# Env:
#   KATA_K8S_CACHE   default /var/cache/kata-k8s
#   K8S_VERSION      default v1.37.2 (the newest patch of the newest minor the proxy served)
#   ETCD_VERSION     default v3.6.16; COREDNS_VERSION default v1.14.7; HELM_VERSION v4.3.1
#   GO               the go command (default: go in PATH, else /usr/local/go/bin/go)
set -euo pipefail

prog=k8s-build
die() { echo "$prog: $*" >&2; exit 1; }
log() { echo "$prog: $*" >&2; }
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=find-go.sh
. "$here/find-go.sh"

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
COREDNS_VERSION=${COREDNS_VERSION:-v1.14.7}
HELM_VERSION=${HELM_VERSION:-v4.3.1}
CACHE=${KATA_K8S_CACHE:-/var/cache/kata-k8s}
DIR=$CACHE/$K8S_VERSION
BIN=$DIR/bin
STAMP="kubernetes=$K8S_VERSION etcd=$ETCD_VERSION coredns=$COREDNS_VERSION helm=$HELM_VERSION"
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
ALL=("${K8S_CMDS[@]}" etcd coredns helm)

mkdir -p -- "$BIN" 2>/dev/null || die "cannot create $BIN (run as root, or set KATA_K8S_CACHE)"
exec 9>"$CACHE/.lock"
flock 9 || die "cannot lock $CACHE/.lock"

complete() {
    [ -f "$DIR/STAMP" ] && [ "$(cat "$DIR/STAMP")" = "$STAMP" ] || return 1
    local b
    for b in "${ALL[@]}"; do [ -x "$BIN/$b" ] || return 1; done
}
if complete; then
    log "present in $BIN ($STAMP)"
    echo "$BIN"
    exit 0
fi
rm -f "$DIR/STAMP"

GO=$(find_go "building Kubernetes")
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

# wrapper DIR MODULE VERSION STAGING_PREFIX STAGING_VERSION: a module in DIR that requires
# MODULE@VERSION and replaces every `X => ./staging/...` of MODULE's go.mod (or every
# `X => ../X`, etcd's form) with X@STAGING_VERSION.
wrapper() {
    local dir=$1 module=$2 version=$3 staging_version=$4 gomod
    mkdir -p "$dir"
    gomod=$("$GO" mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
    [ -f "$gomod" ] || die "go mod download $module@$version gave no go.mod"
    {
        echo "module kata.local/build-$(basename "$dir")"
        echo
        grep -m1 -E '^go [0-9.]+' "$gomod"
        echo
        echo "require $module $version"
        echo
        # `X => ./staging/src/X` and `X => ../X` lines of MODULE's replace block.
        sed -n -E 's#^[[:space:]]*([^ ]+) => \.{1,2}/[^ ]*$#\1#p' "$gomod" | while read -r m; do
            [ "$m" = "$module" ] && continue
            if [ "$staging_version" = same ]; then
                echo "replace $m => $m $version"
            else
                echo "replace $m => $m $staging_version"
            fi
        done
    } >"$dir/go.mod"
}

if ! [ -x "$BIN/kubelet" ] || ! [ -f "$DIR/k8s.done" ] || [ "$(cat "$DIR/k8s.done")" != "$K8S_VERSION" ]; then
    log "building Kubernetes $K8S_VERSION (${K8S_CMDS[*]}): about 15-20 minutes on 2 cores from empty Go caches"
    minor=${K8S_VERSION#v1.}
    wrapper "$DIR/src/kubernetes" k8s.io/kubernetes "$K8S_VERSION" "v0.$minor"
    major=1 minor_n=${minor%%.*}
    ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
-X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$minor_n \
-X k8s.io/component-base/version.gitTreeState=clean \
-X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION \
-X k8s.io/client-go/pkg/version.gitMajor=$major -X k8s.io/client-go/pkg/version.gitMinor=$minor_n"
    pkgs=()
    for c in "${K8S_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
    (cd "$DIR/src/kubernetes" && "$GO" build -trimpath -ldflags "$ldflags" -o "$BIN/" "${pkgs[@]}") ||
        die "building Kubernetes $K8S_VERSION failed (output above)"
    echo "$K8S_VERSION" >"$DIR/k8s.done"
fi

if ! [ -x "$BIN/etcd" ] || ! "$BIN/etcd" --version 2>/dev/null | grep -q "${ETCD_VERSION#v}"; then
    log "building etcd $ETCD_VERSION"
    wrapper "$DIR/src/etcd" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" same
    (cd "$DIR/src/etcd" && "$GO" build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3) ||
        die "building etcd $ETCD_VERSION failed (output above)"
fi

if ! [ -x "$BIN/coredns" ] || ! "$BIN/coredns" -version 2>/dev/null | grep -q "${COREDNS_VERSION#v}"; then
    log "building CoreDNS $COREDNS_VERSION"
    GOBIN=$BIN "$GO" install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION" ||
        die "building CoreDNS $COREDNS_VERSION failed (output above)"
fi

if ! [ -x "$BIN/helm" ] || ! "$BIN/helm" version --short 2>/dev/null | grep -q "$HELM_VERSION"; then
    log "building Helm $HELM_VERSION"
    GOBIN=$BIN "$GO" install -trimpath \
        -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
        "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" ||
        die "building Helm $HELM_VERSION failed (output above)"
fi

echo "$STAMP" >"$DIR/STAMP"
complete || die "after the build, $BIN lacks one of: ${ALL[*]}"
log "built into $BIN ($STAMP)"
echo "$BIN"

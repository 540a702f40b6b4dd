#!/usr/bin/env bash
# The CRI conformance suite (cri-tools' critest) against containerd's CRI, first with the
# runc handler, then with our kata handler, on one private containerd; fails when a spec
# passes with runc and fails with kata, unless tests/critest-kata-expected-failures.txt
# lists it (with the reason a VM sandbox cannot pass it, or the open issue that covers it).
#
#   KATA_KERNEL=... KATA_INITRD=... KATA_SHIM_DIR=... KATA_PAUSE_IMAGE=... KATA_IMAGE=... \
#       scripts/critest.sh          (`make critest` sets these as `make test` does)
#
# What it puts together, all on this host and its loopback:
#   - critest (and crictl, for clean-up, and ginkgo's CLI, which critest --parallel runs)
#     built from the Go module proxy, pinned at sigs.k8s.io/cri-tools $CRITEST_VERSION
#     (`go test -c` of its cmd/critest), cached in $KATA_CRITEST_CACHE/<version>/;
#   - a registry on 127.0.0.1 (Debian's docker-registry, unpacked from its package into the
#     cache, never installed) holding the images critest pulls, built by
#     scripts/critest-images.sh from the project's busybox image (and Debian's dynamically
#     linked busybox as the default image's /bin/sh, unpacked the same way); containerd's hosts.toml
#     sends gcr.io, registry.k8s.io and k8s.gcr.io there, so critest runs with its own image
#     names (no --registry-prefix: critest compares repo tags with its unprefixed names);
#   - containerd from $CRITEST_CONTAINERD_BIN (2.3 by default) through
#     scripts/containerd-private.sh, with the CRI on, Debian's CNI plugins (bridge +
#     host-local on a private /24, portmap, loopback), the project's pause image as the
#     sandbox image, and the kata runtime as deploy/containerd's snippet for its config
#     version declares it (no options table); $KATA_CONF_FILE, exported to containerd and
#     so to the shim, names a configuration with our kernel, initrd and kata-vsock (as the
#     end-to-end tests configure them).
# Prints, per handler, critest's summary line, the run's duration and its failed specs; then
# the kata-only failures, the expected ones with their reasons, and allow-list entries that
# no longer fail. Everything it started is ended by pid, also on failure or interrupt.
#
# Env:
#   CRITEST_VERSION        cri-tools module version (default v1.37.0, the newest the proxy
#                          served when this was written)
#   KATA_CRITEST_CACHE     default /var/cache/kata-critest
#   CRITEST_CONTAINERD_BIN containerd, ctr and containerd-shim-runc-v2 to run (default
#                          /var/cache/kata-containerd/2.3/usr/bin)
#   CRITEST_HANDLERS       default "runc kata"
#   CRITEST_PARALLEL       critest --parallel: ginkgo processes running specs at once
#                          (default 2, this machine's cores: the kata run takes about half
#                          the time of a serial one, with the same results; critest keeps
#                          its Serial specs, the image ones, to themselves); 1 runs serially
#                          without ginkgo's CLI
#   CRITEST_FOCUS          a regexp: run only the specs it matches (for development)
#   CRITEST_SKIP           a regexp: skip the specs it matches as well (for development)
#   CRITEST_EXPECTED_FAILURES  the allow-list (default tests/critest-kata-expected-failures.txt)
#   CRITEST_LOG_DIR        logs and reports of the last run (default /var/tmp/kata-critest)
#   CRITEST_TIMEOUT        per-run limit (default 40m)
#   CRITEST_HOLD=1         set everything up, then wait until interrupted instead of
#                          running critest (for development: crictl against $SOCK)
#   GO                     the go command (default: go in PATH, else /usr/local/go/bin/go)
set -euo pipefail

prog=critest
here=$(dirname -- "$(realpath -- "$0")")
repo=$(dirname -- "$here")
die() { echo "$prog: $*" >&2; exit 1; }
log() { echo "$prog: $*" >&2; }

CRITEST_VERSION=${CRITEST_VERSION:-v1.37.0}
CRI_TOOLS=sigs.k8s.io/cri-tools
CACHE=${KATA_CRITEST_CACHE:-/var/cache/kata-critest}
CONTAINERD_BIN=${CRITEST_CONTAINERD_BIN:-/var/cache/kata-containerd/2.3/usr/bin}
HANDLERS=${CRITEST_HANDLERS:-"runc kata"}
PARALLEL=${CRITEST_PARALLEL:-2}
EXPECTED=${CRITEST_EXPECTED_FAILURES:-$repo/tests/critest-kata-expected-failures.txt}
LOG_DIR=${CRITEST_LOG_DIR:-/var/tmp/kata-critest}
TIMEOUT=${CRITEST_TIMEOUT:-40m}

# Specs skipped with critest's own flag, each because it needs what cannot exist here:
#   - "public image with digest": pulls upstream's test image by its digest; an image the
#     project builds cannot have that digest, and nothing can be pulled from outside.
SKIP_SPECS=(
    'public image with digest should be pulled and removed'
)

# shellcheck source=cri-lib.sh
CRI_LIB_CACHE=$CACHE
. "$here/cri-lib.sh"
check_node_inputs critest "$CONTAINERD_BIN"
[ -f "$EXPECTED" ] || die "the allow-list $EXPECTED is missing"
for tool in jq curl ip ss dpkg-deb apt-get flock; do
    command -v "$tool" >/dev/null || die "'$tool' not found in PATH (scripts/setup-host.sh installs it)"
done

mkdir -p -- "$CACHE" "$LOG_DIR"

# shellcheck source=find-go.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/find-go.sh"

# ---- critest, crictl (and ginkgo for --parallel) from the Go module proxy, cached ----
TOOLS=$CACHE/$CRITEST_VERSION
build_tools() {
    local need=() go_cmd src ginkgo_version start
    [ -x "$TOOLS/critest" ] || need+=(critest)
    [ -x "$TOOLS/crictl" ] || need+=(crictl)
    [ "$PARALLEL" -le 1 ] || [ -x "$TOOLS/ginkgo" ] || need+=(ginkgo)
    [ ${#need[@]} -gt 0 ] || return 0
    go_cmd=$(find_go "critest is built with Go")
    mkdir -p "$TOOLS"
    exec 8>"$CACHE/.lock"
    flock 8 || die "cannot lock $CACHE/.lock"
    # Local toolchain only, no workspace, no VCS stamping (the module cache has no .git).
    export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-buildvcs=false
    log "downloading $CRI_TOOLS@$CRITEST_VERSION (GOPROXY $("$go_cmd" env GOPROXY))"
    src=$("$go_cmd" mod download -json "$CRI_TOOLS@$CRITEST_VERSION" | jq -r .Dir) ||
        die "go mod download $CRI_TOOLS@$CRITEST_VERSION failed"
    [ -d "$src/cmd/critest" ] || die "$src/cmd/critest missing"
    start=$SECONDS
    local ldflags="-s -w -X $CRI_TOOLS/pkg/version.Version=$CRITEST_VERSION"
    for t in "${need[@]}"; do
        log "building $t from $CRI_TOOLS $CRITEST_VERSION (minutes the first time on 2 cores; log: $TOOLS/build-$t.log)"
        case $t in
        critest)
            (cd "$src" && "$go_cmd" test -c -ldflags "$ldflags" -o "$TOOLS/.critest.tmp" ./cmd/critest) \
                >"$TOOLS/build-$t.log" 2>&1 || { tail -n 30 "$TOOLS/build-$t.log" >&2; die "building critest failed"; }
            ;;
        crictl)
            (cd "$src" && CGO_ENABLED=0 "$go_cmd" build -ldflags "$ldflags" -o "$TOOLS/.crictl.tmp" ./cmd/crictl) \
                >"$TOOLS/build-$t.log" 2>&1 || { tail -n 30 "$TOOLS/build-$t.log" >&2; die "building crictl failed"; }
            ;;
        ginkgo)
            # The ginkgo CLI critest --parallel runs, at the version cri-tools requires.
            ginkgo_version=$(cd "$src" && "$go_cmd" list -m -f '{{.Version}}' github.com/onsi/ginkgo/v2)
            (cd "$src" && "$go_cmd" build -o "$TOOLS/.ginkgo.tmp" github.com/onsi/ginkgo/v2/ginkgo) \
                >"$TOOLS/build-$t.log" 2>&1 || { tail -n 30 "$TOOLS/build-$t.log" >&2; die "building ginkgo $ginkgo_version failed"; }
            ;;
        esac
        mv -f "$TOOLS/.$t.tmp" "$TOOLS/$t"
    done
    log "built ${need[*]} in $((SECONDS - start)) s"
    flock -u 8
}

# ---- run-time state, all undone by cleanup ----
WORK=/tmp/kcrit-$$
CD_DIR=$WORK/cd
REGISTRY_PID=
CRITEST_PID=
BRIDGE=kcrit$(($$ % 100000))
SUBNET=
NETNAME=kata-critest-$$
SOCK=
STARTED_CONTAINERD=0

# Unattached 1 MiB SysV shared memory segments (what critest's `ipcmk -M 1048576` makes).
shm_segments() {
    ipcs -m 2>/dev/null | awk '$2 ~ /^[0-9]+$/ && $5 == 1048576 && $6 == 0 { print $2 }'
}
SHM_BEFORE=$(shm_segments)

crictl_() { "$TOOLS/crictl" --runtime-endpoint "unix://$SOCK" --image-endpoint "unix://$SOCK" --timeout 60s "$@"; }

# Removes every pod through the CRI (as kubelet would), then stops containerd (its shims
# and their children too: containerd-private.sh), the registry, the bridge, the sandbox
# dirs our kata sandboxes left, and the work dir.
cleanup() {
    local status=$? ids=() id root m
    trap - EXIT INT TERM
    set +e
    if [ -n "$CRITEST_PID" ] && kill -0 "$CRITEST_PID" 2>/dev/null; then
        # ginkgo runs the specs' clean-up on SIGINT; then it is killed.
        kill -INT "$CRITEST_PID"
        for _ in $(seq 300); do kill -0 "$CRITEST_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$CRITEST_PID" 2>/dev/null
        wait "$CRITEST_PID" 2>/dev/null
    fi
    if [ "$STARTED_CONTAINERD" = 1 ]; then
        mapfile -t ids < <(crictl_ pods -q 2>/dev/null)
        [ ${#ids[@]} -eq 0 ] || crictl_ rmp -f "${ids[@]}" >/dev/null 2>&1
        mapfile -t ids < <(ls "$CD_DIR/state/io.containerd.runtime.v2.task/k8s.io" 2>/dev/null)
        cp -f "$CD_DIR/containerd.log" "$LOG_DIR/containerd.log" 2>/dev/null
        PATH="$CONTAINERD_BIN:$PATH" bash "$here/containerd-private.sh" stop "$CD_DIR" >/dev/null 2>&1 ||
            log "warning: stopping containerd failed (log: $LOG_DIR/containerd.log)"
        for id in "${ids[@]}"; do
            # A sandbox's host cgroup, which a killed shim could not remove (if empty).
            rmdir /sys/fs/cgroup/*/k8s.io/"$id" /sys/fs/cgroup/k8s.io/"$id" 2>/dev/null
            for root in /run/vc/sbs /run/vc/vm /run/kata-containers/shared/sandboxes; do
                [ -e "$root/$id" ] || continue
                awk -v d="$root/$id/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | tac |
                    while read -r m; do umount -l "$m"; done
                rm -rf --one-file-system "${root:?}/$id"
            done
        done
    fi
    stop_registry
    [ -e "/sys/class/net/$BRIDGE" ] && ip link del "$BRIDGE"
    # critest's host IPC specs make 1 MiB SysV segments on the host (ipcmk) and leave them.
    local shm
    for shm in $(shm_segments); do
        grep -qx "$shm" <<<"$SHM_BEFORE" || ipcrm -m "$shm"
    done
    cni_leftovers "$NETNAME" "$SUBNET"
    # critest's pods have no cgroup parent: runc made /k8s.io in every hierarchy for them
    # (removed only when empty, so never from under another user of it).
    rmdir /sys/fs/cgroup/*/k8s.io 2>/dev/null
    rm -rf --one-file-system "$WORK"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A /24 10.77.N.0 that no route and no other critest run uses.
choose_subnet() {
    local routes n
    routes=$(ip -4 route show; cat /tmp/kcrit-*/cni/net.d/*.conflist 2>/dev/null)
    for n in $(seq $(($$ % 200)) 255) $(seq 0 $(($$ % 200))); do
        grep -q "10\.77\.$n\." <<<"$routes" || { echo "10.77.$n"; return 0; }
    done
    die "no free 10.77.N.0/24"
}

# ---- set-up ----
build_tools
build_images

mkdir -p "$WORK/cni/net.d" "$WORK/hosts" "$LOG_DIR"
rm -f "$LOG_DIR"/*.log "$LOG_DIR"/*.json "$LOG_DIR"/*.txt
for p in 12000 12001 12002 12003; do
    [ -z "$(ss -Hltn "sport = :$p")" ] || log "warning: port $p (used by critest's port specs) is taken"
done

port=$(free_port 5100)
start_registry "$port"
registry=http://127.0.0.1:$port
push_images "$registry"

# containerd resolves critest's registries to ours, by plain HTTP on the loopback.
registry_hosts "$WORK/hosts" "$registry" gcr.io registry.k8s.io k8s.gcr.io

subnet=$(choose_subnet)
SUBNET=$subnet
cni_conflist "$WORK/cni/net.d/10-critest.conflist" "$NETNAME" "$BRIDGE" "$subnet"

# The runtime configuration: ours, as the end-to-end tests write it (without debug logs).
kata_config=$WORK/configuration.toml
# The shipped snippet has no options table; $KATA_CONF_FILE names the test's configuration.
export KATA_CONF_FILE=$kata_config
kata_test_config "$kata_config"

export PATH="$CONTAINERD_BIN:$KATA_SHIM_DIR:$PATH"
cfgver=$(containerd_config_version containerd)
extra="[plugins.\"io.containerd.cri.v1.images\".registry]
  config_path = \"$WORK/hosts\""
# Without CAP_SYS_RESOURCE (a host that is itself a container), runc cannot give the
# sandbox the OOM score containerd asks for; the CRI keeps scores at or above ours then.
capeff=$(awk '/^CapEff:/ { print $2 }' /proc/self/status)
if (( (16#$capeff >> 24 & 1) == 0 )); then
    extra="$extra
[plugins.\"io.containerd.cri.v1.runtime\"]
  restrict_oom_score_adj = true"
fi
if grep -q CONTAINERD_KATA_SNIPPET "$here/containerd-private.sh"; then
    kata_snippet "$cfgver" >"$WORK/kata-runtimes.toml"
    export CONTAINERD_KATA_SNIPPET=$WORK/kata-runtimes.toml
else
    # containerd-private.sh declares the kata runtime itself; the snippet's options on top.
    extra="$extra
[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.kata.options]
  ConfigPath = \"$kata_config\""
fi
[ "$cfgver" != 2 ] || die "critest runs on containerd 2.x; $CONTAINERD_BIN has $(containerd --version)"
STARTED_CONTAINERD=1
SOCK=$(CONTAINERD_ENABLE_CRI=1 CONTAINERD_SANDBOX_IMAGE=localhost/kata-e2e-pause:latest \
    CONTAINERD_CNI_CONF_DIR="$WORK/cni/net.d" CONTAINERD_EXTRA_TOML="$extra" \
    bash "$here/containerd-private.sh" start "$CD_DIR")
ctr -a "$SOCK" -n k8s.io images import "$KATA_PAUSE_IMAGE" >/dev/null 2>"$LOG_DIR/ctr-import.log" ||
    { cat "$LOG_DIR/ctr-import.log" >&2; die "importing $KATA_PAUSE_IMAGE failed"; }
log "$(containerd --version | awk '{print $1, $3}') at $SOCK; CNI $BRIDGE $subnet.0/24; kata: $kata_config"

ready=0
for _ in $(seq 200); do
    if crictl_ info 2>/dev/null | jq -e '[.status.conditions[] | select(.type == "RuntimeReady" or .type == "NetworkReady") | .status] | length == 2 and all' >/dev/null &&
        crictl_ images -q localhost/kata-e2e-pause:latest 2>/dev/null | grep -q .; then
        ready=1
        break
    fi
    sleep 0.1
done
[ $ready = 1 ] || { crictl_ info >&2 || true; die "the CRI did not become ready"; }

if [ "${CRITEST_HOLD:-0}" = 1 ]; then
    log "holding (CRITEST_HOLD=1) until interrupted: $TOOLS/crictl --runtime-endpoint unix://$SOCK ..."
    sleep infinity &
    CRITEST_PID=$!
    wait "$CRITEST_PID" || true
    exit 0
fi

# ---- the runs ----
skip=$(IFS='|'; echo "${SKIP_SPECS[*]}")
declare -A SUMMARY DURATION
for handler in $HANDLERS; do
    args=(--runtime-endpoint "unix://$SOCK" --image-endpoint "unix://$SOCK"
        --runtime-handler "$handler"
        "-ginkgo.skip=$skip" "-ginkgo.timeout=$TIMEOUT" -ginkgo.no-color
        "-ginkgo.json-report=$LOG_DIR/$handler.json")
    [ -z "${CRITEST_FOCUS:-}" ] || args+=("-ginkgo.focus=$CRITEST_FOCUS")
    [ -z "${CRITEST_SKIP:-}" ] || args+=("-ginkgo.skip=$CRITEST_SKIP")
    # (--parallel 1 would reach ginkgo as go test's -parallel, which it refuses.)
    [ "$PARALLEL" -le 1 ] || args+=(--parallel "$PARALLEL")
    log "critest $CRITEST_VERSION, handler $handler (full log: $LOG_DIR/$handler.log)"
    start=$SECONDS
    # critest exits non-zero when a spec fails; the report says which.
    (cd "$WORK" && PATH="$TOOLS:$PATH" exec "$TOOLS/critest" "${args[@]}") >"$LOG_DIR/$handler.log" 2>&1 &
    CRITEST_PID=$!
    wait "$CRITEST_PID" || true
    CRITEST_PID=
    DURATION[$handler]=$((SECONDS - start))
    SUMMARY[$handler]="$(grep -E '^Ran [0-9]+ of [0-9]+ Specs' "$LOG_DIR/$handler.log" | tail -n 1 || true)"
    SUMMARY[$handler]+=" $(grep -E '[0-9]+ Passed \| [0-9]+ Failed' "$LOG_DIR/$handler.log" | tail -n 1 || true)"
    [ -f "$LOG_DIR/$handler.json" ] || { tail -n 40 "$LOG_DIR/$handler.log" >&2; die "critest ($handler) wrote no report"; }
    # One line per spec: STATE<TAB>full spec name.
    jq -r '.[].SpecReports[]? | select(.LeafNodeType == "It")
        | "\(.State)\t\((.ContainerHierarchyTexts + [.LeafNodeText]) | join(" "))"' \
        "$LOG_DIR/$handler.json" | sort -t $'\t' -k2 >"$LOG_DIR/$handler.txt"
    left=$(crictl_ pods -q 2>/dev/null | wc -l)
    [ "$left" = 0 ] || log "warning: critest ($handler) left $left pods behind"
    mapfile -t ids < <(crictl_ pods -q 2>/dev/null)
    [ ${#ids[@]} -eq 0 ] || crictl_ rmp -f "${ids[@]}" >/dev/null 2>&1 || true
done

# ---- the report ----
failed_re='^(failed|panicked|timedout|interrupted|aborted)$'
specs_in() { # HANDLER STATE-REGEXP
    awk -F'\t' -v re="$2" '$1 ~ re { print $2 }' "$LOG_DIR/$1.txt"
}
echo
echo "==== critest $CRITEST_VERSION on $(containerd --version | awk '{print $1, $3}') ===="
for handler in $HANDLERS; do
    echo "critest [$handler]: ${SUMMARY[$handler]} (${DURATION[$handler]} s)"
done
# The user-namespace specs on their own line (issue 43: critest skips them all for a
# handler whose features lack user namespaces).
for handler in $HANDLERS; do
    awk -F'\t' -v h="$handler" '$2 ~ /UserNamespaces/ { n++; c[$1]++ }
        END { printf "critest [%s] UserNamespaces: %d of %d passed, %d failed, %d skipped\n",
              h, c["passed"], n, n - c["passed"] - c["skipped"], c["skipped"] }' "$LOG_DIR/$handler.txt"
done
for handler in $HANDLERS; do
    echo "failed with $handler:"
    specs_in "$handler" "$failed_re" | sed 's/^/  - /'
done

status=0
if [[ " $HANDLERS " == *" runc "* && " $HANDLERS " == *" kata "* ]]; then
    # The allow-list: "SPEC NAME  # reason" per line; blank lines and lines starting with
    # '#' are comments.
    declare -A REASON
    while IFS= read -r line; do
        case "$line" in '' | '#'*) continue ;; esac
        name=${line%%#*}
        name=${name%"${name##*[![:space:]]}"}
        REASON[$name]=$(sed 's/^[^#]*#[[:space:]]*//' <<<"$line")
    done <"$EXPECTED"
    mapfile -t runc_passed < <(specs_in runc '^passed$')
    declare -A KATA_STATE
    while IFS=$'\t' read -r state name; do KATA_STATE[$name]=$state; done <"$LOG_DIR/kata.txt"
    unexpected=() expected=()
    for name in "${runc_passed[@]}"; do
        [[ "${KATA_STATE[$name]:-}" =~ $failed_re ]] || continue
        if [ -n "${REASON[$name]:-}" ]; then
            expected+=("$name  <- ${REASON[$name]}")
        else
            unexpected+=("$name")
        fi
    done
    echo "kata-only failures listed in ${EXPECTED#"$repo"/} (${#expected[@]}):"
    for l in "${expected[@]}"; do echo "  - $l"; done
    stale=()
    for name in "${!REASON[@]}"; do
        [[ "${KATA_STATE[$name]:-}" =~ $failed_re ]] || stale+=("$name (kata: ${KATA_STATE[$name]:-not run})")
    done
    skipped=()
    for name in "${runc_passed[@]}"; do
        [ "${KATA_STATE[$name]:-}" = skipped ] && skipped+=("$name")
    done
    if [ ${#skipped[@]} -gt 0 ]; then
        # critest skips these itself for kata, by the features containerd reports for the
        # handler (recursive read-only mounts, user namespaces).
        echo "passed with runc, skipped by critest with kata (${#skipped[@]}):"
        printf '  - %s\n' "${skipped[@]}"
    fi
    if [ ${#stale[@]} -gt 0 ]; then
        echo "allow-list entries that did not fail with kata in this run (${#stale[@]}):"
        printf '  - %s\n' "${stale[@]}" | sort
    fi
    if [ ${#unexpected[@]} -gt 0 ]; then
        echo "FAIL: ${#unexpected[@]} specs passed with runc and failed with kata:"
        for name in "${unexpected[@]}"; do
            echo "  - $name"
            # The spec's failure as critest reported it, whole: the cause (a VMM's or a
            # helper's own words) comes after the sandbox id and the CRI's wrapping, and a
            # CI log may be all there is to read.
            jq -r --arg n "$name" '.[].SpecReports[]? | select(.LeafNodeType == "It")
                | select(((.ContainerHierarchyTexts + [.LeafNodeText]) | join(" ")) == $n)
                | "      \(.Failure.Location.FileName | split("/") | last):\(.Failure.Location.LineNumber): \(.Failure.Message | gsub("\\s+"; " ") | .[0:1500])"' \
                "$LOG_DIR/kata.json"
        done
        status=1
    else
        echo "OK: every spec that passed with runc passed with kata, but the ${#expected[@]} listed"
    fi
fi
echo "logs and reports: $LOG_DIR"
exit $status

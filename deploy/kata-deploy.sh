#!/bin/sh
# kata-deploy: installs the kata runtime on the node it runs on, and removes it. Run by the
# Helm chart's DaemonSet (deploy/helm/kata-deploy/) in a privileged pod with the node's
# root filesystem at $HOST_ROOT and the host's PID namespace; shipped in the installer
# image (scripts/kata-deploy-image.sh) beside the payload in $ARTIFACTS.
#
#   kata-deploy install     install (idempotent: a second run changes nothing)
#   kata-deploy uninstall   undo everything install did
#   kata-deploy run         install, label the node, then wait: on SIGTERM, uninstall when
#                           the DaemonSet is marked for removal (the chart's pre-delete
#                           hook), else leave the node as it is (an upgrade or a restart)
#   kata-deploy remove-all  the chart's pre-delete hook: mark the DaemonSet, take its pods
#                           off every node (each uninstalls) and wait for them to end
#
# What install changes on the node, and how uninstall undoes each:
#   $PREFIX/ (bin/, share/, containerd/)  the runtime, its guest kernel and initrds, its
#        configurations (config.d/10-kata-deploy.toml names the paths under the prefix,
#        config.d/50-values.toml the chart's `runtimeConfig`) and the containerd drop-in;
#        a file of the list $PREFIX/.kata-deploy-files: removed, then the empty dirs.
#   the containerd configuration ($CONTAINERD_CONFIG): config versions 3 and 4, one line
#        `imports = [...]` naming the drop-in (or its existing `imports` line with the
#        drop-in added), the original line kept in $PREFIX/containerd/imports.orig: the
#        line is put back as it was (or removed), leaving the file byte for byte as
#        before. Version 2 (containerd 1.x, whose imports replace whole plugin sections):
#        the runtimes appended between two marker lines, removed with them. For k3s/RKE2
#        the template config-v3.toml.tmpl (base template + the runtimes), removed again.
#   containerd restarted ($CONTAINERD_RESTART, run on the node) after each change.
#   the node label $NODE_LABEL=true: removed.
#
# Env (the chart sets them): NODE_NAME, PREFIX (/opt/kata), HOST_ROOT (/host), ARTIFACTS
# (/opt/kata-artifacts), CONTAINERD_FLAVOUR (containerd, k3s, rke2), CONTAINERD_CONFIG
# (the flavour's path when empty), CONTAINERD_RESTART (a shell command run on the node;
# the flavour's systemctl restart when empty), REQUIRE_KVM (true/false), NODE_LABEL,
# RUNTIME_CONFIG (TOML, the runtime configuration drop-in), DAEMONSET, NAMESPACE,
# UNINSTALL_TIMEOUT (seconds remove-all waits).
set -eu

prog=kata-deploy
PREFIX=${PREFIX:-/opt/kata}
HOST_ROOT=${HOST_ROOT:-/host}
ARTIFACTS=${ARTIFACTS:-/opt/kata-artifacts}
CONTAINERD_FLAVOUR=${CONTAINERD_FLAVOUR:-containerd}
CONTAINERD_CONFIG=${CONTAINERD_CONFIG:-}
CONTAINERD_RESTART=${CONTAINERD_RESTART:-}
REQUIRE_KVM=${REQUIRE_KVM:-false}
NODE_LABEL=${NODE_LABEL:-katacontainers.io/kata-runtime}
RUNTIME_CONFIG=${RUNTIME_CONFIG:-}
UNINSTALL_MARK=kata-deploy.katacontainers.io/uninstall
MARKER="# added by kata-deploy: removed on uninstall"
BLOCK_BEGIN="# >>> the kata runtimes, added by kata-deploy: removed on uninstall >>>"
BLOCK_END="# <<< kata-deploy <<<"

log() { echo "$prog: $(date +%T) $*" >&2; }
die() { echo "$prog: error: $*" >&2; exit 1; }

case "$PREFIX" in
/*/* | /[a-z]*) ;;
*) die "PREFIX must be an absolute directory other than / (got '$PREFIX')" ;;
esac
case "$PREFIX" in /usr | /usr/local | /etc | /var | /bin | /opt) die "PREFIX $PREFIX is a system directory: use one of its own, e.g. /opt/kata" ;; esac

H=$HOST_ROOT
P=$H$PREFIX
LIST=$P/.kata-deploy-files
DROPIN=$PREFIX/containerd/kata-deploy.toml

# The flavour's configuration file, method and restart command.
case "$CONTAINERD_FLAVOUR" in
containerd)
    : "${CONTAINERD_CONFIG:=/etc/containerd/config.toml}"
    : "${CONTAINERD_RESTART:=systemctl restart containerd}"
    METHOD=imports
    ;;
k3s)
    # k3s writes config.toml itself at every start, from config.toml.tmpl when there is one.
    : "${CONTAINERD_CONFIG:=/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl}"
    : "${CONTAINERD_RESTART:=systemctl restart k3s 2>/dev/null || systemctl restart k3s-agent}"
    METHOD=template
    ;;
rke2)
    : "${CONTAINERD_CONFIG:=/var/lib/rancher/rke2/agent/etc/containerd/config-v3.toml.tmpl}"
    : "${CONTAINERD_RESTART:=systemctl restart rke2-server 2>/dev/null || systemctl restart rke2-agent}"
    METHOD=template
    ;;
*) die "CONTAINERD_FLAVOUR '$CONTAINERD_FLAVOUR' is not one of containerd, k3s, rke2" ;;
esac
CFG=$H$CONTAINERD_CONFIG

# Runs the restart command on the node: in its root filesystem, with the host's PID
# namespace the pod has (systemctl reaches systemd through /run).
restart_containerd() {
    log "restarting containerd: $CONTAINERD_RESTART"
    chroot "$H" /bin/sh -c "$CONTAINERD_RESTART" >&2 || die "restarting containerd failed ($CONTAINERD_RESTART); the node's configuration is in place, restart containerd by hand"
}

# The config version of the node's containerd configuration: 2 (containerd 1.x), 3 (2.0 to
# 2.2) or 4 (2.3 on), from its `version` line.
config_version() {
    sed -n 's/^[[:space:]]*version[[:space:]]*=[[:space:]]*\([0-9][0-9]*\)[[:space:]]*\(#.*\)\{0,1\}$/\1/p' "$1" | head -n 1
}

# What would make the install fail half-way, checked before anything is written.
preflight() {
    [ -n "${NODE_NAME:-}" ] || die "NODE_NAME is not set (the chart sets it from spec.nodeName)"
    [ -d "$H/proc" ] && [ -d "$H/etc" ] || die "the node's root filesystem is not at $H (hostPath / mounted there)"
    [ -d "$ARTIFACTS/bin" ] || die "no payload in $ARTIFACTS: not the kata-deploy image?"
    if [ "$METHOD" = imports ]; then
        [ -f "$CFG" ] || die "no containerd configuration at $CONTAINERD_CONFIG on node $NODE_NAME: is containerd installed? (set containerd.configPath, or containerd.flavour for k3s/RKE2)"
        VERSION=$(config_version "$CFG")
        case "$VERSION" in
        2)
            # containerd 1.x replaces a whole plugin section with an imported file's (the
            # CRI's sandbox image, CNI and runc would go): the runtimes go into the file.
            METHOD=append ;;
        3 | 4) ;;
        '') die "$CONTAINERD_CONFIG has no 'version = N' line: containerd reads it as config version 1, which this installer does not write (run 'containerd config migrate')" ;;
        *) die "$CONTAINERD_CONFIG has config version $VERSION; the installer knows versions 2, 3 and 4" ;;
        esac
        if [ "$METHOD" = imports ] && grep -q '^[[:space:]]*imports[[:space:]]*=' "$CFG" && ! grep -qF "$MARKER" "$CFG" &&
            ! grep -q '^[[:space:]]*imports[[:space:]]*=[[:space:]]*\[.*\][[:space:]]*$' "$CFG"; then
            die "$CONTAINERD_CONFIG has an 'imports' spanning several lines: put it on one line, then retry"
        fi
    else
        [ -d "$(dirname "$CFG")" ] || die "no $(dirname "$CONTAINERD_CONFIG") on node $NODE_NAME: is $CONTAINERD_FLAVOUR installed?"
        if [ -f "$CFG" ] && ! head -n 1 "$CFG" | grep -qxF "$MARKER"; then
            die "$CONTAINERD_CONFIG exists and is not ours: add the runtimes of $ARTIFACTS/share/kata-containers/deploy/containerd to it by hand"
        fi
        # config-v3.toml.tmpl: k3s/RKE2 with containerd 2.x; config.toml.tmpl: 1.x.
        case "$CONTAINERD_CONFIG" in *-v3.toml.tmpl) VERSION=3 ;; *) VERSION=2 ;; esac
    fi
    if [ "$REQUIRE_KVM" = true ] && [ ! -c "$H/dev/kvm" ]; then
        die "node $NODE_NAME has no /dev/kvm and requireKvm is true (set requireKvm=false to run VMs under TCG, much slower)"
    fi
    [ -x "$H/usr/bin/qemu-system-x86_64" ] || die "node $NODE_NAME has no /usr/bin/qemu-system-x86_64 (install QEMU, or point runtimeConfig's hypervisor.qemu.path at one)"
}

# Copies FILE to the node's PATH (relative to the prefix) unless it is there with the same
# bytes: a new file beside it, then renamed over (a running shim keeps its old binary).
put() { # SOURCE RELATIVE MODE
    dest=$P/$2
    echo "$2" >>"$LIST.new"
    if [ -f "$dest" ] && cmp -s "$1" "$dest"; then return 0; fi
    mkdir -p "$(dirname "$dest")"
    cp "$1" "$dest.kata-deploy-new"
    chmod "$3" "$dest.kata-deploy-new"
    mv -f "$dest.kata-deploy-new" "$dest"
    CHANGED=1
}
# A symbolic link RELATIVE to TARGET (relative to its directory), as `put` does files.
put_link() { # TARGET RELATIVE
    dest=$P/$2
    echo "$2" >>"$LIST.new"
    [ "$(readlink "$dest" 2>/dev/null)" = "$1" ] && return 0
    mkdir -p "$(dirname "$dest")"
    ln -sfn "$1" "$dest.kata-deploy-new"
    mv -fT "$dest.kata-deploy-new" "$dest"
    CHANGED=1
}
put_text() { # TEXT RELATIVE
    printf '%s\n' "$1" >"$TMP/text"
    put "$TMP/text" "$2" 0644
}

# The runtime tables of deploy/containerd/ for config VERSION, with shims under the prefix.
containerd_dropin() {
    if [ "$VERSION" = 2 ]; then src=$ARTIFACTS/share/kata-containers/deploy/containerd/kata-containerd-1.x.toml; else src=$ARTIFACTS/share/kata-containers/deploy/containerd/kata-containerd-2.x.toml; fi
    [ "$METHOD" != imports ] || echo "version = $VERSION"
    echo "# Written by kata-deploy; removed on uninstall."
    # The shim under the prefix by the name containerd gives the runtime type
    # (io.containerd.kata-builtin.v2: containerd-shim-kata-builtin-v2), which picks its
    # configuration file among the prefix's defaults.
    awk -v bin="$PREFIX/bin" '
        /^#/ { next }
        /^[ \t]*runtime_type[ \t]*=/ {
            print
            name = $0; sub(/^[^"]*"io\.containerd\./, "", name); sub(/\.v2".*$/, "", name)
            sub(/runtime_type.*/, "runtime_path = \"" bin "/containerd-shim-" name "-v2\""); print; next
        }
        { print }' "$src"
}

# The configuration as the shim will read it (the file and the drop-ins install writes),
# loaded by this image's kata-runtime in a scratch dir on the node: a bad runtimeConfig
# stops the install before anything is written.
check_runtime_config() {
    c=$P/.kata-deploy-check
    mkdir -p "$c/config.d"
    cp "$ARTIFACTS/bin/kata-runtime" "$c/kata-runtime"
    cp "$ARTIFACTS/share/defaults/kata-containers/configuration.toml" "$c/configuration.toml"
    [ -z "$RUNTIME_CONFIG" ] || printf '%s\n' "$RUNTIME_CONFIG" >"$c/config.d/50-values.toml"
    ok=1
    chroot "$H" "$PREFIX/.kata-deploy-check/kata-runtime" env --config "$PREFIX/.kata-deploy-check/configuration.toml" >"$c/env" 2>&1 || ok=0
    # Error = "" when it loads; else the message (TOML's multi-line string when it has lines).
    err=$(sed -n '/^Error = /,/^$/p' "$c/env" | grep -vxF -e 'Error = ""' -e '' | tr -s '\n' ' ' || true)
    [ $ok = 1 ] || err=$(tail -n 3 "$c/env")
    rm -rf "$c"
    rmdir "$P" 2>/dev/null || true
    [ -z "$err" ] || die "the runtime configuration (runtimeConfig) does not load: ${err#Error = }"
}

install_files() {
    CHANGED=0
    TMP=$(mktemp -d)
    : >"$LIST.new" 2>/dev/null || { mkdir -p "$P"; : >"$LIST.new"; }
    for f in containerd-shim-kata-v2 kata-runtime kata-vm-factory kata-vsock kata-vmm kata-monitor; do
        [ -f "$ARTIFACTS/bin/$f" ] && put "$ARTIFACTS/bin/$f" "bin/$f" 0755
    done
    put_link containerd-shim-kata-v2 bin/containerd-shim-kata-builtin-v2
    for f in $(cd "$ARTIFACTS/share" && find . -type f | sed 's|^\./||' | sort); do
        put "$ARTIFACTS/share/$f" "share/$f" 0644
    done
    put_text "# Written by kata-deploy: the paths under $PREFIX. Removed on uninstall.
[hypervisor.qemu]
kernel = \"$PREFIX/share/kata-containers/vmlinux\"
initrd = \"$PREFIX/share/kata-containers/kata-initrd.img\"
vsock_backend = \"$PREFIX/bin/kata-vsock\"

[hypervisor.builtin]
path = \"$PREFIX/bin/kata-vmm\"
kernel = \"$PREFIX/share/kata-containers/vmlinux\"
initrd = \"$PREFIX/share/kata-containers/kata-initrd.img\"" "share/defaults/kata-containers/config.d/10-kata-deploy.toml"
    if [ -n "$RUNTIME_CONFIG" ]; then
        put_text "# Written by kata-deploy from the chart's runtimeConfig. Removed on uninstall.
$RUNTIME_CONFIG" "share/defaults/kata-containers/config.d/50-values.toml"
    fi
    if [ "$METHOD" = imports ]; then
        put_text "$(containerd_dropin)" "containerd/kata-deploy.toml"
    fi
    # Files of an older version that this one does not have.
    if [ -f "$LIST" ]; then
        sort "$LIST" >"$TMP/old"
        sort "$LIST.new" >"$TMP/new"
        grep -vxF -f "$TMP/new" "$TMP/old" >"$TMP/gone" || true
        [ -s "$TMP/gone" ] && { remove_files_of "$TMP/gone"; CHANGED=1; }
    fi
    if [ -f "$LIST" ] && cmp -s "$LIST" "$LIST.new"; then rm -f "$LIST.new"; else mv -f "$LIST.new" "$LIST"; fi
    rm -rf "$TMP"
    FILES_CHANGED=$CHANGED
}

# Removes the files (relative to the prefix) listed in LIST_FILE and the dirs they leave empty.
remove_files_of() {
    while IFS= read -r rel; do
        [ -n "$rel" ] || continue
        case "$rel" in /* | *..*) continue ;; esac
        rm -f "$P/$rel"
        d=$(dirname "$P/$rel")
        while [ "$d" != "$P" ] && [ "${#d}" -gt "${#P}" ]; do
            rmdir "$d" 2>/dev/null || break
            d=$(dirname "$d")
        done
    done <"$1"
}

# The containerd configuration: our imports line (config versions 3 and 4), our block at
# its end (version 2) or the template (k3s/RKE2). Sets CFG_CHANGED.
configure_containerd() {
    CFG_CHANGED=0
    if [ "$METHOD" = append ]; then
        grep -qxF "$BLOCK_BEGIN" "$CFG" && return 0
        # Whether the file lacked its last newline (added before the block, taken off again).
        if [ -s "$CFG" ] && [ -n "$(tail -c 1 "$CFG")" ]; then nl=1; else nl=0; fi
        echo "$nl" >"$P/containerd/append.orig"
        { cat "$CFG"; [ $nl = 0 ] || echo; echo "$BLOCK_BEGIN"; containerd_dropin; echo "$BLOCK_END"; } >"$CFG.kata-deploy-new"
        replace_config
        return 0
    fi
    if [ "$METHOD" = template ]; then
        new=$(printf '%s\n%s\n{{ template "base" . }}\n\n%s\n' "$MARKER" "# kata-deploy: k3s/RKE2 base template plus the kata runtimes" "$(containerd_dropin)")
        if [ -f "$CFG" ] && [ "$(cat "$CFG")" = "$new" ]; then return 0; fi
        printf '%s\n' "$new" >"$CFG.kata-deploy-new"
        mv -f "$CFG.kata-deploy-new" "$CFG"
        CFG_CHANGED=1
        return 0
    fi
    grep -qF "$MARKER" "$CFG" && return 0
    orig_line=$(grep -n '^[[:space:]]*imports[[:space:]]*=' "$CFG" | head -n 1 || true)
    if [ -n "$orig_line" ]; then
        n=${orig_line%%:*}
        line=${orig_line#*:}
        items=$(printf '%s' "$line" | sed 's/^[^[]*\[\(.*\)\][[:space:]]*$/\1/')
        case "$items" in *[![:space:]]*) new="imports = [\"$DROPIN\", $items]  $MARKER" ;; *) new="imports = [\"$DROPIN\"]  $MARKER" ;; esac
        printf '%s\n' "$line" >"$P/containerd/imports.orig"
    else
        # Top-level keys come before the first table: right after the version line.
        n=$(grep -n '^[[:space:]]*version[[:space:]]*=' "$CFG" | head -n 1 | cut -d: -f1)
        new="imports = [\"$DROPIN\"]  $MARKER"
        : >"$P/containerd/imports.orig"
    fi
    awk -v n="$n" -v new="$new" -v replace="$([ -n "$orig_line" ] && echo 1 || echo 0)" '
        NR == n { if (replace) { print new; next } print; print new; next }
        { print }' "$CFG" >"$CFG.kata-deploy-new"
    replace_config
}

# Renames $CFG.kata-deploy-new over the configuration, with its owner and mode. Line
# edits (awk, grep) end the last line: a file whose last line had no newline keeps none.
replace_config() {
    if [ -s "$CFG" ] && [ -n "$(tail -c 1 "$CFG")" ] && [ "$METHOD" = imports ]; then
        printf '%s' "$(cat "$CFG.kata-deploy-new")" >"$CFG.kata-deploy-new2"
        mv -f "$CFG.kata-deploy-new2" "$CFG.kata-deploy-new"
    fi
    chmod "$(stat -c %a "$CFG")" "$CFG.kata-deploy-new"
    chown "$(stat -c %u:%g "$CFG")" "$CFG.kata-deploy-new"
    mv -f "$CFG.kata-deploy-new" "$CFG"
    CFG_CHANGED=1
}

# Puts the containerd configuration back as it was. Sets CFG_CHANGED.
unconfigure_containerd() {
    CFG_CHANGED=0
    if [ -f "$CFG" ] && grep -qxF "$BLOCK_BEGIN" "$CFG"; then
        nl=$(cat "$P/containerd/append.orig" 2>/dev/null || echo 0)
        awk -v b="$BLOCK_BEGIN" -v e="$BLOCK_END" -v nl="$nl" '
            $0 == b { skip = 1; next }
            skip && $0 == e { skip = 0; next }
            skip { next }
            { lines[++n] = $0 }
            END {
                # The newline added before the block goes with it.
                for (i = 1; i <= n; i++) printf "%s%s", lines[i], (i < n || nl == 0) ? "\n" : ""
            }' "$CFG" >"$CFG.kata-deploy-new"
        replace_config
        return 0
    fi
    [ -f "$CFG" ] && grep -qF "$MARKER" "$CFG" || return 0
    if [ "$METHOD" = template ]; then
        head -n 1 "$CFG" | grep -qxF "$MARKER" || return 0
        rm -f "$CFG"
        CFG_CHANGED=1
        return 0
    fi
    orig=$P/containerd/imports.orig
    if [ -s "$orig" ]; then
        awk -v marker="$MARKER" -v origf="$orig" '
            BEGIN { getline orig <origf }
            index($0, marker) { print orig; next }
            { print }' "$CFG" >"$CFG.kata-deploy-new"
    else
        grep -vF "$MARKER" "$CFG" >"$CFG.kata-deploy-new" || true
    fi
    replace_config
}

# Bounded by timeout(1): kubectl's own --request-timeout, like any client flag, turns off
# its in-cluster configuration (the service account's token).
kubectl_() { timeout 60 kubectl "$@"; }

label_node() {
    kubectl_ get nodes -l "$NODE_LABEL=true" -o name 2>/dev/null | grep -qxF "node/$NODE_NAME" && return 0
    kubectl_ label node "$NODE_NAME" --overwrite "$NODE_LABEL=true" >/dev/null || die "labelling node $NODE_NAME failed"
    log "node $NODE_NAME labelled $NODE_LABEL=true"
}

unlabel_node() {
    kubectl_ label node "$NODE_NAME" "$NODE_LABEL-" >/dev/null 2>&1 || log "warning: removing the label $NODE_LABEL from $NODE_NAME failed"
}

do_install() {
    preflight
    check_runtime_config
    mkdir -p "$P"
    install_files
    # The line is in the list so that a failed uninstall can be retried; its file goes last.
    mkdir -p "$P/containerd"
    configure_containerd
    if [ "$FILES_CHANGED" = 1 ] && [ "$CFG_CHANGED" = 0 ]; then
        # Binaries and configurations are read at each pod start: no restart for them.
        log "updated the files under $PREFIX; containerd's configuration unchanged"
    fi
    if [ "$CFG_CHANGED" = 1 ]; then
        restart_containerd
    fi
    if [ "$FILES_CHANGED" = 0 ] && [ "$CFG_CHANGED" = 0 ]; then
        log "already installed under $PREFIX on $NODE_NAME: nothing changed"
    else
        log "installed under $PREFIX on $NODE_NAME (containerd config $CONTAINERD_CONFIG, version $VERSION)"
    fi
}

do_uninstall() {
    [ -n "${NODE_NAME:-}" ] || die "NODE_NAME is not set"
    # The label first: no new kata pod is scheduled here while the runtime goes.
    unlabel_node
    unconfigure_containerd
    [ "$CFG_CHANGED" = 0 ] || restart_containerd
    [ -f "$LIST" ] && remove_files_of "$LIST"
    rm -f "$LIST" "$P/containerd/imports.orig" "$P/containerd/append.orig"
    rmdir "$P/containerd" "$P" 2>/dev/null || true
    if [ -e "$P" ]; then
        log "left $PREFIX on $NODE_NAME: it holds files kata-deploy did not put there"
    fi
    log "uninstalled from $NODE_NAME"
}

marked_for_removal() {
    [ -n "${DAEMONSET:-}" ] || return 1
    kubectl_ -n "$NAMESPACE" get daemonset "$DAEMONSET" -o 'jsonpath={.metadata.annotations}' 2>/dev/null |
        grep -qF "\"$UNINSTALL_MARK\":\"true\""
}

do_run() {
    do_install
    label_node
    # The pod's readiness probe.
    : >/tmp/kata-deploy-ready
    log "ready; waiting (SIGTERM: uninstall if the DaemonSet is marked for removal)"
    SLEEP=
    trap 'on_term' TERM INT
    # A sleep in the background: the shell handles the signal at once.
    while :; do
        sleep 3600 &
        SLEEP=$!
        wait $SLEEP || true
    done
}

on_term() {
    kill "$SLEEP" 2>/dev/null || true
    if marked_for_removal; then
        log "the DaemonSet is being removed: uninstalling"
        do_uninstall
    else
        log "stopping without uninstalling (an upgrade or a restart of this pod)"
    fi
    exit 0
}

do_remove_all() {
    [ -n "${DAEMONSET:-}" ] && [ -n "${NAMESPACE:-}" ] || die "DAEMONSET and NAMESPACE must be set"
    kubectl_ -n "$NAMESPACE" get daemonset "$DAEMONSET" >/dev/null 2>&1 || { log "no DaemonSet $DAEMONSET: nothing to remove"; return 0; }
    kubectl_ -n "$NAMESPACE" annotate daemonset "$DAEMONSET" --overwrite "$UNINSTALL_MARK=true" >/dev/null
    # No node matches any more: the DaemonSet controller deletes every pod, each uninstalls
    # on its SIGTERM.
    kubectl_ -n "$NAMESPACE" patch daemonset "$DAEMONSET" --type merge \
        -p "{\"spec\":{\"template\":{\"spec\":{\"nodeSelector\":{\"$UNINSTALL_MARK\":\"no-node-has-this\"}}}}}" >/dev/null
    log "waiting for the installer pods to uninstall"
    t=${UNINSTALL_TIMEOUT:-600}
    end=$(($(date +%s) + t))
    while :; do
        left=$(kubectl_ -n "$NAMESPACE" get pods -l "app.kubernetes.io/name=$DAEMONSET" -o name) || left=unknown
        [ -n "$left" ] || break
        [ "$(date +%s)" -lt "$end" ] || die "the installer pods did not end within $t s: $left"
        sleep 2
    done
    log "every node uninstalled"
}

case "${1:-}" in
install) do_install ;;
uninstall) do_uninstall ;;
run) do_run ;;
remove-all) do_remove_all ;;
*) die "usage: $0 install|uninstall|run|remove-all" ;;
esac

#!/usr/bin/env bash
# A private containerd (1.6, 1.7 or 2.x) instance living entirely under one directory, for tests.
#
#   scripts/containerd-private.sh start DIR     -> prints DIR/containerd.sock
#   scripts/containerd-private.sh stop DIR
#
# Layout under DIR: config.toml, containerd.sock (+ .ttrpc), containerd.pid, containerd.log,
# root/, state/, opt/. Several instances (and a system containerd) can run side by side:
# every path containerd itself owns is under DIR. Paths shared by design (unique names, no
# conflict): shim sockets /run/containerd/s/<hash of address+ns+id>, ctr's stdio fifos
# /run/containerd/fifo/<random>/ (ctr run --fifo-dir moves them), runc's state
# /run/containerd/runc/<ns>/<id> (so two instances must not run the same ns/id at once).
#
# containerd inherits this script's environment: put a build dir in PATH so it finds
# containerd-shim-kata-v2. Env:
#   CONTAINERD_ENABLE_CRI=1        keep the CRI plugin (disabled by default)
#   CONTAINERD_SANDBOX_IMAGE=ref   CRI sandbox (pause) image (when CRI is on)
#   CONTAINERD_CNI_BIN_DIR / CONTAINERD_CNI_CONF_DIR   CRI CNI dirs (default /usr/lib/cni if
#                                  present, else /opt/cni/bin; DIR/cni/net.d)
#   CONTAINERD_LOG_LEVEL           default info
#   CONTAINERD_EXTRA_TOML          text appended to config.toml (config version 2 for
#                                  containerd 1.x, 3 for 2.0 to 2.2, 4 for 2.3 and later:
#                                  see config_version)
#   CONTAINERD_KATA_SNIPPET=FILE   the CRI's kata runtimes come from FILE (a deploy snippet
#                                  for this config version) instead of the entry written here
#                                  (`none`: no kata runtime, a node without ours)
#   CONTAINERD_KEEP_CONFIG=1       start with DIR/config.toml as it is when this script wrote
#                                  it before (what an installer changed in it stays)
#   CONTAINERD_START_TIMEOUT       seconds to wait for the socket (default 30)
#   CONTAINERD (default containerd), CTR (default ctr): use each containerd's own ctr
set -euo pipefail

prog=containerd-private
die() { echo "$prog: $*" >&2; exit 1; }
log() { echo "$prog: $*" >&2; }

[ $# -eq 2 ] || die "usage: $0 start|stop DIR"
cmd=$1
[ -n "$2" ] || die "DIR must not be empty"
mkdir -p -- "$(dirname -- "$2")"
dir=$(realpath -m -- "$2")
case "$dir" in / | /run | /run/containerd | /var/lib/containerd | /tmp | /var | /home | /root)
    die "refusing to use '$dir' as a private containerd directory" ;;
esac
CONTAINERD=${CONTAINERD:-containerd}
CTR=${CTR:-ctr}
sock="$dir/containerd.sock"
pidfile="$dir/containerd.pid"
logfile="$dir/containerd.log"
config="$dir/config.toml"
MARK="# private containerd instance written by containerd-private.sh"

# pid of our containerd if it is alive (and really ours), else nothing.
live_pid() {
    local pid
    [ -f "$pidfile" ] || return 0
    pid=$(cat "$pidfile" 2>/dev/null || true)
    case "$pid" in '' | *[!0-9]*) return 0 ;; esac
    [ -r "/proc/$pid/cmdline" ] || return 0
    tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "$config" && echo "$pid"
    return 0
}

answers() { timeout 5 "$CTR" -a "$sock" version >/dev/null 2>&1; }

# Pids (other than ours) whose command line contains STRING.
pids_with() {
    local p
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [ "$p" != $$ ] || continue
        tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -qF -- "$1" && echo "$p"
    done
    return 0
}

# All descendants of the given pids (by the ppid field of /proc/PID/stat).
descendants() {
    local -A parent=()
    local p st
    for p in /proc/[0-9]*; do
        st=$(cat "$p/stat" 2>/dev/null) || continue
        st=${st##*) }  # fields after "pid (comm) ": state ppid ...
        st=${st#* }
        parent[${p#/proc/}]=${st%% *}
    done
    local -a queue=("$@")
    local -A seen=()
    local cur child
    while [ ${#queue[@]} -gt 0 ]; do
        cur=${queue[0]}
        queue=("${queue[@]:1}")
        for child in "${!parent[@]}"; do
            if [ "${parent[$child]}" = "$cur" ] && [ -z "${seen[$child]:-}" ]; then
                seen[$child]=1
                queue+=("$child")
                echo "$child"
            fi
        done
    done
}

# The config version CONTAINERD reads natively, the one `containerd config default` writes:
# 2 for 1.x; 3 for 2.0 to 2.2 (which would migrate a version 2 file at every start, and
# whose CRI is split into several plugins); 4 for 2.3 and later, whose listeners (grpc,
# ttrpc, debug, metrics) are plugins of their own, io.containerd.server.v1.*.
config_version() {
    local v
    v=$("$CONTAINERD" --version 2>/dev/null | awk '{print $3}') ||
        die "'$CONTAINERD --version' failed"
    v=${v#v}
    case "$v" in
    1.*) echo 2 ;;
    2.[0-2].* | 2.[0-2]) echo 3 ;;
    2.* | [3-9].*) echo 4 ;;
    *) die "cannot tell the version of '$CONTAINERD' from '$("$CONTAINERD" --version 2>&1 | head -n 1)'" ;;
    esac
}

toml_str() { # quote a string for TOML
    local s=${1//\\/\\\\}
    printf '"%s"' "${s//\"/\\\"}"
}

start() {
    command -v "$CONTAINERD" >/dev/null || die "'$CONTAINERD' not found in PATH (apt-get install containerd)"
    command -v "$CTR" >/dev/null || die "'$CTR' not found in PATH"
    [ "$(id -u)" = 0 ] || die "must run as root"
    [ ${#sock} -le 100 ] || die "socket path '$sock.ttrpc' is too long for a unix socket; use a shorter DIR"

    local pid
    pid=$(live_pid)
    if [ -n "$pid" ]; then
        if answers; then
            log "already running (pid $pid) at $sock"
            echo "$sock"
            return 0
        fi
        die "containerd pid $pid of $dir is alive but $sock does not answer; run '$0 stop $dir' first"
    fi

    mkdir -p "$dir/root" "$dir/state" "$dir/opt"
    chmod 0711 "$dir"
    rm -f "$sock" "$sock.ttrpc" "$pidfile"

    local cfgver cri_rt cri_img
    cfgver=$(config_version)
    local disabled='disabled_plugins = ["io.containerd.grpc.v1.cri"]'
    cri_rt='io.containerd.grpc.v1.cri' cri_img='io.containerd.grpc.v1.cri'
    if [ "$cfgver" -ge 3 ]; then
        # 2.x: CRI's runtime and image halves are plugins of their own, configured there.
        # Disabling the CRI service alone stops CRI being served; the halves still load,
        # as the pod sandbox controller and the sandbox-controllers service need them
        # (both fail to load without them).
        cri_rt='io.containerd.cri.v1.runtime' cri_img='io.containerd.cri.v1.images'
    fi
    [ "${CONTAINERD_ENABLE_CRI:-0}" = 1 ] && disabled='disabled_plugins = []'
    local cni_bin=${CONTAINERD_CNI_BIN_DIR:-}
    if [ -z "$cni_bin" ]; then
        cni_bin=/opt/cni/bin
        [ -d /usr/lib/cni ] && cni_bin=/usr/lib/cni
    fi
    local cni_conf=${CONTAINERD_CNI_CONF_DIR:-$dir/cni/net.d}
    [ "${CONTAINERD_ENABLE_CRI:-0}" = 1 ] && mkdir -p "$cni_conf"

    local snippet=${CONTAINERD_KATA_SNIPPET:-}
    [ -z "$snippet" ] || [ "$snippet" = none ] || [ -f "$snippet" ] || die "CONTAINERD_KATA_SNIPPET: $snippet is not a file"

    if [ "${CONTAINERD_KEEP_CONFIG:-0}" = 1 ] && [ -f "$config" ]; then
        head -n 1 "$config" | grep -qxF "$MARK" || die "$config was not written by this script: not starting with it"
    else
        {
            echo "$MARK"
            echo "version = $cfgver"
            echo "root = $(toml_str "$dir/root")"
            echo "state = $(toml_str "$dir/state")"
            echo "$disabled"
            echo
            if [ "$cfgver" -ge 4 ]; then
                # Version 4: the listeners are server plugins, each with its own default
                # address (the system's sockets): name ours. debug and metrics listen only
                # where an address is given.
                echo '[plugins."io.containerd.server.v1.grpc"]'
                echo "  address = $(toml_str "$sock")"
                echo
                echo '[plugins."io.containerd.server.v1.ttrpc"]'
                echo "  address = $(toml_str "$sock.ttrpc")"
                echo
                echo "[debug]"
                echo "  level = $(toml_str "${CONTAINERD_LOG_LEVEL:-info}")"
                echo
            else
                echo "[grpc]"
                echo "  address = $(toml_str "$sock")"
                echo
                echo "[ttrpc]"
                echo "  address = $(toml_str "$sock.ttrpc")"
                echo
                echo "[debug]"
                echo '  address = ""'
                echo "  level = $(toml_str "${CONTAINERD_LOG_LEVEL:-info}")"
                echo
                echo "[metrics]"
                echo '  address = ""'
                echo
            fi
            echo '[plugins."io.containerd.internal.v1.opt"]'
            echo "  path = $(toml_str "$dir/opt")"
            echo
            if [ -n "${CONTAINERD_SANDBOX_IMAGE:-}" ]; then
                if [ "$cfgver" -ge 3 ]; then
                    echo "[plugins.\"$cri_img\".pinned_images]"
                    echo "  sandbox = $(toml_str "$CONTAINERD_SANDBOX_IMAGE")"
                else
                    echo "[plugins.\"$cri_img\"]"
                    echo "  sandbox_image = $(toml_str "$CONTAINERD_SANDBOX_IMAGE")"
                fi
            fi
            echo "[plugins.\"$cri_rt\".cni]"
            if [ "$cfgver" -ge 3 ]; then
                echo "  bin_dirs = [$(toml_str "$cni_bin")]"
            else
                echo "  bin_dir = $(toml_str "$cni_bin")"
            fi
            echo "  conf_dir = $(toml_str "$cni_conf")"
            # Naming any runtime replaces CRI's default map, so runc (default_runtime_name) too.
            echo "[plugins.\"$cri_rt\".containerd.runtimes.runc]"
            echo '  runtime_type = "io.containerd.runc.v2"'
            if [ "$snippet" = none ]; then
                :
            elif [ -n "$snippet" ]; then
                echo
                echo "# $snippet"
                cat -- "$snippet"
            else
                echo "[plugins.\"$cri_rt\".containerd.runtimes.kata]"
                echo '  runtime_type = "io.containerd.kata.v2"'
                # As deploy/containerd/ sets it: a privileged pod gets the VM's devices.
                echo '  privileged_without_host_devices = true'
            fi
            if [ -n "${CONTAINERD_EXTRA_TOML:-}" ]; then
                echo
                printf '%s\n' "$CONTAINERD_EXTRA_TOML"
            fi
        } >"$config.tmp"
        mv -f "$config.tmp" "$config"
    fi

    echo "=== $(date -u +%FT%TZ) $prog start (PATH=$PATH)" >>"$logfile"
    setsid nohup "$CONTAINERD" --config "$config" </dev/null >>"$logfile" 2>&1 &
    pid=$!
    # setsid execs in place unless it is a process-group leader; if it forked, find the child.
    if ! tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "$config"; then
        sleep 0.2
        pid=$(pids_with "--config $config" | head -n 1)
    fi
    [ -n "$pid" ] || { tail -n 30 "$logfile" >&2; die "containerd did not start (log above: $logfile)"; }
    echo "$pid" >"$pidfile"

    local deadline=$((SECONDS + ${CONTAINERD_START_TIMEOUT:-30}))
    until answers; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 30 "$logfile" >&2
            die "containerd (pid $pid) exited during start-up (log above: $logfile)"
        fi
        if [ $SECONDS -ge $deadline ]; then
            tail -n 30 "$logfile" >&2
            die "containerd (pid $pid) did not answer on $sock within ${CONTAINERD_START_TIMEOUT:-30}s (log above: $logfile)"
        fi
        sleep 0.1
    done
    log "containerd pid $pid listening on $sock"
    echo "$sock"
}

# Kill PIDS with TERM, then KILL after SECS; wait until they are gone.
terminate() { # SECS PID...
    local secs=$1 p alive
    shift
    [ $# -gt 0 ] || return 0
    kill -TERM "$@" 2>/dev/null || true
    local deadline=$((SECONDS + secs))
    while :; do
        alive=()
        for p in "$@"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
        [ ${#alive[@]} -gt 0 ] || return 0
        if [ $SECONDS -ge $deadline ]; then
            log "sending KILL to ${alive[*]}"
            kill -KILL "${alive[@]}" 2>/dev/null || true
            break
        fi
        sleep 0.1
    done
    deadline=$((SECONDS + 10))
    while [ $SECONDS -lt $deadline ]; do
        alive=()
        for p in "$@"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
        [ ${#alive[@]} -gt 0 ] || return 0
        sleep 0.1
    done
    log "warning: processes ${alive[*]} survived KILL"
}

stop() {
    if [ ! -e "$dir" ]; then
        log "$dir does not exist; nothing to stop"
        return 0
    fi
    [ -d "$dir" ] || die "'$dir' is not a directory"
    if [ -f "$config" ] && ! head -n 1 "$config" | grep -qxF "$MARK"; then
        die "$config was not written by this script; refusing to remove $dir"
    fi
    if [ ! -f "$config" ] && [ -n "$(ls -A "$dir")" ] && [ ! -d "$dir/root" ]; then
        die "$dir does not look like a private containerd directory; refusing to remove it"
    fi

    local pid
    pid=$(live_pid)
    if [ -n "$pid" ]; then
        # Best effort: let the shims tear their tasks (and VMs) down properly first.
        if answers; then
            local ns t
            for ns in $(timeout 5 "$CTR" -a "$sock" namespaces ls -q 2>/dev/null); do
                for t in $(timeout 5 "$CTR" -a "$sock" -n "$ns" tasks ls -q 2>/dev/null); do
                    timeout 10 "$CTR" -a "$sock" -n "$ns" tasks kill -a -s SIGKILL "$t" >/dev/null 2>&1 || true
                    timeout 10 "$CTR" -a "$sock" -n "$ns" tasks delete -f "$t" >/dev/null 2>&1 || true
                done
            done
        fi
        log "stopping containerd pid $pid"
        terminate 10 "$pid"
    fi

    # Shims started for this instance carry "-address DIR/containerd.sock" on their cmdline.
    # Their descendants (container processes, a VMM, virtiofsd, ...) would outlive them as
    # orphans: note them first, and kill what is left of them once the shims are gone.
    local shims=() kids=() p
    for p in $(pids_with "$sock"); do
        tr '\0' '\n' 2>/dev/null <"/proc/$p/cmdline" | grep -qxF -- "$sock" || continue
        tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q 'containerd-shim' && shims+=("$p")
    done
    if [ ${#shims[@]} -gt 0 ]; then
        mapfile -t kids < <(descendants "${shims[@]}")
        log "killing leftover shims ${shims[*]}${kids[*]:+ and their descendants ${kids[*]}}"
        # containerd is gone: nothing can stop these gracefully any more.
        [ ${#kids[@]} -eq 0 ] || kill -KILL "${kids[@]}" 2>/dev/null || true
        terminate 5 "${shims[@]}"
        [ ${#kids[@]} -eq 0 ] || terminate 2 "${kids[@]}"
    fi

    # runc state (and cgroups) of containers whose bundle lives under DIR, left behind
    # when a shim died without cleaning up: runc keeps it in /run/containerd/runc/<ns>/<id>.
    local st rroot id
    for st in /run/containerd/runc/*/*/state.json; do
        [ -f "$st" ] || continue
        grep -qF -- "bundle=$dir/" "$st" 2>/dev/null || continue
        rroot=$(dirname -- "$(dirname -- "$st")")
        id=$(basename -- "$(dirname -- "$st")")
        log "removing leftover runc container $id (root $rroot)"
        if command -v runc >/dev/null; then
            runc --root "$rroot" delete -f "$id" >/dev/null 2>&1 || rm -rf -- "$(dirname -- "$st")"
        else
            rm -rf -- "$(dirname -- "$st")"
        fi
    done

    # Unmount everything under DIR, deepest (latest) first.
    local m
    local -a mounts=()
    mapfile -t mounts < <(awk -v d="$dir/" '{
            p = $5
            gsub(/\\040/, " ", p); gsub(/\\011/, "\t", p); gsub(/\\012/, "\n", p); gsub(/\\134/, "\\", p)
            if (index(p, d) == 1) print p
        }' /proc/self/mountinfo | tac)
    for m in "${mounts[@]}"; do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "warning: cannot unmount $m"
    done

    rm -rf --one-file-system -- "$dir" || die "could not remove $dir"
    log "stopped and removed $dir"
}

case "$cmd" in
start) start ;;
stop) stop ;;
*) die "unknown command '$cmd' (start or stop)" ;;
esac

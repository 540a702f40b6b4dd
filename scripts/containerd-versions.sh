#!/usr/bin/env bash
# Gets the extra containerd versions the end-to-end suite runs on, besides the system's 1.6
# (issues 12 and 27), into a cache outside the repo and the system:
#   - 1.7 and 2.1 from Debian trixie's and sid's packages, unpacked (never installed): the
#     packages come through an apt source list of our own (never added to the system's
#     sources) and are unpacked with dpkg-deb;
#   - 2.3 (the LTS) and 2.4, which Debian does not package, built from the Go module proxy
#     with `go install github.com/containerd/containerd/v2/cmd/...@VERSION`, pinned.
#
#   scripts/containerd-versions.sh          -> gets what is missing, prints each bin dir
#
# Layout: $KATA_CONTAINERD_CACHE/<series>/usr/bin/{containerd,ctr,containerd-shim-runc-v2}
# and a VERSION file holding the exact version (Debian's, or the Go module's "v2.3.7").
# Idempotent: a series already there at its pinned version is left alone (delete its
# directory to get it again). The runc shim of each series matters to whoever runs runc on
# it: put that bin dir first in PATH, ahead of the system's containerd-shim-runc-v2.
#
# Env:
#   KATA_CONTAINERD_CACHE   default /var/cache/kata-containerd
#   CONTAINERD_VERSIONS     "SERIES=SUITE=VERSION ..." (default below); VERSION is the exact
#                           Debian version to pin; when the mirror only has another
#                           revision of the same upstream version, that one is taken (and
#                           said so); a different upstream version is an error.
#   CONTAINERD_GO_VERSIONS  "SERIES=VERSION ..." (default below): Go module versions of
#                           github.com/containerd/containerd/v2 to build (each the newest
#                           patch release of its series when this was written).
#   DEBIAN_MIRROR           default http://deb.debian.org/debian
#   GO                      the go command (default: go in PATH, else /usr/local/go/bin/go);
#                           its module and build caches are its own (`go env GOMODCACHE
#                           GOCACHE`: root's are under /root), outside the repo. The build
#                           uses no cgo (static binaries; no btrfs snapshotter) and the
#                           local toolchain only (GOTOOLCHAIN=local).
set -euo pipefail

prog=containerd-versions
die() { echo "$prog: $*" >&2; exit 1; }
log() { echo "$prog: $*" >&2; }

CACHE=${KATA_CONTAINERD_CACHE:-/var/cache/kata-containerd}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# trixie's and sid's packages as deb.debian.org had them when this was written.
VERSIONS=${CONTAINERD_VERSIONS:-"1.7=trixie=1.7.24~ds1-6+deb13u1 2.1=sid=2.1.9+ds1-5"}
# The newest patch release of each series the Go module proxy served when this was written
# (`go list -m -versions github.com/containerd/containerd/v2`).
GO_VERSIONS=${CONTAINERD_GO_VERSIONS:-"2.3=v2.3.7 2.4=v2.4.2"}
GO_MODULE=github.com/containerd/containerd/v2
GO_CMDS=(containerd ctr containerd-shim-runc-v2)
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

mkdir -p -- "$CACHE" 2>/dev/null || die "cannot create $CACHE (run as root, or set KATA_CONTAINERD_CACHE)"
[ -w "$CACHE" ] || die "$CACHE is not writable (run as root, or set KATA_CONTAINERD_CACHE)"
# One run at a time (make test and a developer's run may overlap).
exec 9>"$CACHE/.lock"
flock 9 || die "cannot lock $CACHE/.lock"

# The upstream part of a Debian version: 1.7.24~ds1-6+deb13u1 -> 1.7.24.
upstream_of() { local v=${1#*:}; echo "${v%%[~+-]*}"; }

# The Debian series: fetched with apt (our own lists) and unpacked.
debian_versions() {
    local spec series rest suite want upstream pin v deb got dest tmp apt_dir sources suites
    local -a need=() have=()
    # Everything already unpacked (the same upstream version)? Then no apt at all (no network).
    for spec in $VERSIONS; do
        series=${spec%%=*}
        if [ -x "$CACHE/$series/usr/bin/containerd" ] && [ -x "$CACHE/$series/usr/bin/ctr" ] &&
            [ -f "$CACHE/$series/VERSION" ] &&
            [ "$(upstream_of "$(cat "$CACHE/$series/VERSION")")" = "$(upstream_of "${spec##*=}")" ]; then
            continue
        fi
        need+=("$spec")
    done
    if [ ${#need[@]} -eq 0 ]; then
        for spec in $VERSIONS; do
            series=${spec%%=*}
            log "containerd $(cat "$CACHE/$series/VERSION") present in $CACHE/$series"
        done
        return 0
    fi

    command -v apt-get >/dev/null || die "apt-get not found (this script needs a Debian host)"
    command -v dpkg-deb >/dev/null || die "dpkg-deb not found"

    [ "$(id -u)" = 0 ] || die "must run as root (apt-get update and download into $CACHE)"
    [ -f "$KEYRING" ] || die "$KEYRING missing (apt-get install debian-archive-keyring)"

    apt_dir=$CACHE/apt
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/debs"
    sources=$apt_dir/sources.list
    suites=$(for spec in "${need[@]}"; do rest=${spec#*=}; echo "${rest%%=*}"; done | sort -u | tr '\n' ' ' | sed 's/ $//')
    {
        echo "# containerd-versions.sh: Debian suites the extra containerd versions come from."
        echo "# Only ever used through -o Dir::Etc::sourcelist; never part of the system's sources."
        for suite in $suites; do
            echo "deb [signed-by=$KEYRING] $MIRROR $suite main"
        done
    } >"$sources.tmp"
    mv -f "$sources.tmp" "$sources"

    # apt with our own source list, lists and archive cache; the system's apt state untouched.
    # Our own (empty) status file: the versions apt offers are the mirror's alone.
    : >"$apt_dir/status"
    APT_OPTS=(
        -o "Dir::Etc::sourcelist=$sources"
        -o "Dir::Etc::sourceparts=-"
        -o "Dir::State::Lists=$apt_dir/lists"
        -o "Dir::State::status=$apt_dir/status"
        -o "Dir::Cache=$apt_dir"
        -o "Dir::Cache::archives=$apt_dir/archives"
        -o "APT::Architecture=amd64"
        -o "APT::Get::List-Cleanup=0"
        -o "Acquire::Languages=none"
    )

    log "apt-get update with $sources ($suites)"
    if ! apt-get "${APT_OPTS[@]}" update -q >"$apt_dir/update.log" 2>&1; then
        cat "$apt_dir/update.log" >&2
        die "apt-get update against $MIRROR failed (log above): the extra containerd versions cannot be fetched without Debian's mirror"
    fi
    if grep -qE '^(W|E): ' "$apt_dir/update.log"; then
        grep -E '^(W|E): ' "$apt_dir/update.log" >&2
        die "apt-get update against $MIRROR reported errors (above)"
    fi

    # The versions of containerd SUITE offers, by apt-cache madison under our own lists.
    versions_in() { # suite
        apt-cache "${APT_OPTS[@]}" madison containerd 2>/dev/null |
            awk -F' *[|] *' -v s="$1" '{ split($3, a, " "); split(a[2], b, "/"); if (b[1] == s) print $2 }'
    }

    for spec in "${need[@]}"; do
        series=${spec%%=*}
        rest=${spec#*=}
        suite=${rest%%=*}
        want=${rest#*=}
        upstream=$(upstream_of "$want")
        mapfile -t have < <(versions_in "$suite")
        [ ${#have[@]} -gt 0 ] || die "no containerd in $suite's package list ($apt_dir/lists); apt-cache policy says: $(apt-cache "${APT_OPTS[@]}" policy containerd 2>&1 | tr -s '\n ' ' ')"
        pin=""
        for v in "${have[@]}"; do [ "$v" = "$want" ] && pin=$v; done
        if [ -z "$pin" ]; then
            for v in "${have[@]}"; do [ "$(upstream_of "$v")" = "$upstream" ] && pin=$v; done
            [ -n "$pin" ] || die "$suite has containerd ${have[*]}, not $want (upstream $upstream); set CONTAINERD_VERSIONS to pin another"
            log "note: $suite has containerd $pin, not $want; using $pin (same upstream version)"
        fi

        log "downloading containerd=$pin ($suite)"
        rm -f "$apt_dir"/debs/containerd_*.deb
        if ! (cd "$apt_dir/debs" && apt-get "${APT_OPTS[@]}" download -q "containerd=$pin") >"$apt_dir/download.log" 2>&1; then
            cat "$apt_dir/download.log" >&2
            die "apt-get download containerd=$pin failed (log above)"
        fi
        deb=$(ls "$apt_dir"/debs/containerd_*.deb 2>/dev/null | head -n 1)
        [ -n "$deb" ] || die "apt-get download containerd=$pin left no .deb in $apt_dir/debs"
        got=$(dpkg-deb -f "$deb" Version)
        [ "$got" = "$pin" ] || die "$deb is version $got, expected $pin"

        dest=$CACHE/$series
        tmp=$CACHE/.$series.tmp
        rm -rf -- "$tmp"
        mkdir -p "$tmp"
        dpkg-deb -x "$deb" "$tmp"
        [ -x "$tmp/usr/bin/containerd" ] && [ -x "$tmp/usr/bin/ctr" ] ||
            die "$deb holds no usr/bin/containerd and usr/bin/ctr"
        echo "$pin" >"$tmp/VERSION"
        # It must run on this host (trixie/sid packages are static Go binaries that do).
        "$tmp/usr/bin/containerd" --version >/dev/null 2>&1 ||
            die "the unpacked $tmp/usr/bin/containerd does not run on this host: $("$tmp/usr/bin/containerd" --version 2>&1 | head -n 3)"
        rm -rf -- "$dest"
        mv -- "$tmp" "$dest"
        rm -f -- "$deb"
        log "containerd $pin unpacked in $dest"
    done
}

# shellcheck source=find-go.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/find-go.sh"

# Whether series SERIES is in the cache at Go module version VERSION.
go_present() { # series version
    local c
    for c in "${GO_CMDS[@]}"; do [ -x "$CACHE/$1/usr/bin/$c" ] || return 1; done
    [ -f "$CACHE/$1/VERSION" ] && [ "$(head -n 1 "$CACHE/$1/VERSION")" = "$2" ]
}

# The Go series: `go install` of the pinned module version into the cache.
go_versions() {
    local spec series version dest tmp go_cmd got start log_file c
    local -a need=() pkgs
    for spec in $GO_VERSIONS; do
        series=${spec%%=*}
        version=${spec#*=}
        case "$version" in v[0-9]*.*.*) ;; *) die "CONTAINERD_GO_VERSIONS: '$spec' is not SERIES=vX.Y.Z" ;; esac
        case "$version" in "v$series".*) ;; *) die "CONTAINERD_GO_VERSIONS: $version is not of series $series" ;; esac
        if go_present "$series" "$version"; then
            log "containerd $version present in $CACHE/$series"
        else
            need+=("$spec")
        fi
    done
    [ ${#need[@]} -gt 0 ] || return 0

    go_cmd=$(find_go "containerd ${GO_VERSIONS// /, } are built with \`go install\`, which needs Go (the version their go.mod names, 1.26 or later)")
    "$go_cmd" version >/dev/null 2>&1 || die "'$go_cmd version' failed: $("$go_cmd" version 2>&1 | head -n 3)"
    log "building with $("$go_cmd" version) (module cache $("$go_cmd" env GOMODCACHE), build cache $("$go_cmd" env GOCACHE), GOPROXY $("$go_cmd" env GOPROXY))"
    for spec in "${need[@]}"; do
        series=${spec%%=*}
        version=${spec#*=}
        dest=$CACHE/$series
        tmp=$CACHE/.$series.tmp
        log_file=$CACHE/go-install-$series.log
        rm -rf -- "$tmp"
        mkdir -p "$tmp/usr/bin"
        pkgs=()
        for c in "${GO_CMDS[@]}"; do pkgs+=("$GO_MODULE/cmd/$c@$version"); done
        log "go install ${pkgs[*]} (a few minutes on 2 cores; log: $log_file)"
        start=$SECONDS
        # -ldflags: the version the release builds print (go install leaves "X.Y.Z+unknown").
        if ! GOBIN="$tmp/usr/bin" CGO_ENABLED=0 GOTOOLCHAIN=local GOWORK=off GOFLAGS="${GOFLAGS:-}" \
            "$go_cmd" install -trimpath -ldflags "-s -w -X $GO_MODULE/version.Version=$version" \
            "${pkgs[@]}" >"$log_file" 2>&1; then
            tail -n 30 "$log_file" >&2
            rm -rf -- "$tmp"
            die "go install of containerd $version failed (log above, all of it in $log_file): it needs the Go module proxy ($("$go_cmd" env GOPROXY)) or the modules already in $("$go_cmd" env GOMODCACHE), and a Go at least as new as its go.mod asks"
        fi
        for c in "${GO_CMDS[@]}"; do
            [ -x "$tmp/usr/bin/$c" ] || die "go install of containerd $version left no $c in $tmp/usr/bin (log: $log_file)"
        done
        got=$("$tmp/usr/bin/containerd" --version 2>&1 | awk 'NR == 1 { print $3 }')
        [ "$got" = "$version" ] ||
            die "the built $tmp/usr/bin/containerd says it is '$got', not $version: $("$tmp/usr/bin/containerd" --version 2>&1 | head -n 3)"
        echo "$version" >"$tmp/VERSION"
        rm -rf -- "$dest"
        mv -- "$tmp" "$dest"
        log "containerd $version built in $dest in $((SECONDS - start)) s"
    done
}

debian_versions
go_versions

for spec in $VERSIONS $GO_VERSIONS; do
    series=${spec%%=*}
    echo "$CACHE/$series/usr/bin"
done

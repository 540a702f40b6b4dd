#!/usr/bin/env bash
# Fetches the extra containerd versions the end-to-end suite runs on (issue 12: the system's
# 1.6 plus Debian trixie's 1.7 and sid's 2.1) and unpacks each into a cache outside the repo
# and the system. Nothing is installed: the packages come through an apt source list of our
# own (never added to the system's sources) and are unpacked with dpkg-deb.
#
#   scripts/containerd-versions.sh          -> fetches what is missing, prints each bin dir
#
# Layout: $KATA_CONTAINERD_CACHE/<series>/usr/bin/{containerd,ctr,containerd-shim-runc-v2}
# with <series> "1.7" and "2.1", and a VERSION file holding the exact Debian version.
# Idempotent: a series already unpacked is left alone (delete its directory to refetch).
#
# Env:
#   KATA_CONTAINERD_CACHE   default /var/cache/kata-containerd
#   CONTAINERD_VERSIONS     "SERIES=SUITE=VERSION ..." (default below); VERSION is the exact
#                           Debian version to pin; when the mirror only has another
#                           revision of the same upstream version, that one is taken (and
#                           said so); a different upstream version is an error.
#   DEBIAN_MIRROR           default http://deb.debian.org/debian
set -euo pipefail

prog=containerd-versions
die() { echo "$prog: $*" >&2; exit 1; }
log() { echo "$prog: $*" >&2; }

CACHE=${KATA_CONTAINERD_CACHE:-/var/cache/kata-containerd}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# trixie's and sid's packages as deb.debian.org had them when this was written.
VERSIONS=${CONTAINERD_VERSIONS:-"1.7=trixie=1.7.24~ds1-6+deb13u1 2.1=sid=2.1.9+ds1-5"}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

command -v apt-get >/dev/null || die "apt-get not found (this script needs a Debian host)"
command -v dpkg-deb >/dev/null || die "dpkg-deb not found"

# The upstream part of a Debian version: 1.7.24~ds1-6+deb13u1 -> 1.7.24.
upstream_of() { local v=${1#*:}; echo "${v%%[~+-]*}"; }

# Everything already unpacked (the same upstream version)? Then no apt at all (no network).
need=()
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
        echo "$CACHE/$series/usr/bin"
    done
    exit 0
fi

[ "$(id -u)" = 0 ] || die "must run as root (apt-get update and download into $CACHE)"
[ -f "$KEYRING" ] || die "$KEYRING missing (apt-get install debian-archive-keyring)"

apt_dir=$CACHE/apt
mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/debs"
sources=$apt_dir/sources.list
suites=$(for spec in "${need[@]}"; do s=${spec#*=}; echo "${s%%=*}"; done | sort -u | tr '\n' ' ' | sed 's/ $//')
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

for spec in $VERSIONS; do
    series=${spec%%=*}
    echo "$CACHE/$series/usr/bin"
done

#!/usr/bin/env bash
# Installs everything the runtime and its tests need on a Debian bookworm host, as root.
# Idempotent: each step checks before it acts. Caches live outside the repo.
set -euo pipefail

log() { echo "setup-host: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
    echo "setup-host: must run as root (apt-get, /usr/local/bin)" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive

# bookworm-backports carries QEMU 10 (microvm with vhost-user-vsock-device).
BPO=/etc/apt/sources.list.d/bookworm-backports.sources
if [ ! -f "$BPO" ]; then
    log "adding bookworm-backports to apt sources"
    cat >"$BPO" <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    rm -f /var/lib/apt/periodic/kata-apt-updated
fi

PKGS=(containerd runc busybox-static linux-source-6.12 patch build-essential flex bison bc
      libelf-dev libssl-dev cpio xz-utils pkg-config libseccomp-dev libcap-ng-dev
      iproute2 procps util-linux psmisc jq curl openssl bsdutils mount
      protobuf-compiler containernetworking-plugins iptables nftables
      prometheus)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
qemu_ok=0
if command -v qemu-system-x86_64 >/dev/null; then
    qemu-system-x86_64 --version | grep -qE 'version (9|1[0-9])\.' && qemu_ok=1
fi
if [ ${#missing[@]} -gt 0 ] || [ $qemu_ok = 0 ]; then
    log "apt-get update"
    apt-get update -qq
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
    if [ $qemu_ok = 0 ]; then
        log "installing qemu-system-x86 from bookworm-backports"
        apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86
    fi
fi

# The distribution's containerd service would compete with our private instances for
# /run/containerd; the project never relies on it.
if command -v systemctl >/dev/null && systemctl is-active --quiet containerd 2>/dev/null; then
    log "note: the system containerd service is running; tests use their own instance"
fi

# prometheus (Debian's package) is for tests/tests/monitor.rs, which runs its own instance
# on a free port with a storage directory of its own; the package's service is not used.
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
    log "note: the system prometheus service is running; the tests use their own instance"
fi

# Rust daemons from crates.io. Installed to a root outside the repo.
CARGO_TOOLS_ROOT=${CARGO_TOOLS_ROOT:-/opt/kata-tools}
mkdir -p "$CARGO_TOOLS_ROOT/bin"
install_crate() { # name version binary
    local name=$1 version=$2 bin=$3
    if [ -x "$CARGO_TOOLS_ROOT/bin/$bin" ] && "$CARGO_TOOLS_ROOT/bin/$bin" --version 2>/dev/null | grep -q "$version"; then
        return 0
    fi
    log "cargo install $name@$version"
    cargo install --locked --quiet --root "$CARGO_TOOLS_ROOT" "$name@$version"
}
install_crate virtiofsd "${VIRTIOFSD_VERSION:-1.14.0}" virtiofsd
# `make fuzz` (scripts/fuzz.sh) runs the fuzz targets with it; it needs no nightly toolchain.
install_crate cargo-fuzz "${CARGO_FUZZ_VERSION:-0.13.2}" cargo-fuzz
# The vsock backend is ours (kata-vsock, built by `make`), not a crates.io daemon.
for b in virtiofsd; do
    ln -sf "$CARGO_TOOLS_ROOT/bin/$b" "/usr/local/bin/$b"
done
log "host set-up complete"

#!/usr/bin/env bash
# The installer image of the Helm chart (deploy/helm/kata-deploy/), made without a container
# engine like the project's test images (scripts/oci-archive.sh):
#
#   KATA_SHIM_DIR=... KATA_KERNEL=... KATA_INITRD=... KUBECTL=... \
#       scripts/kata-deploy-image.sh BASE.tar OUT.tar NAME:TAG
#
# BASE.tar: an OCI archive whose one layer gives a shell and its tools (the suite uses the
# project's busybox image, e2e-test-images/busybox of scripts/critest-images.sh). Added:
#   /usr/local/bin/kata-deploy      the installer (deploy/kata-deploy.sh)
#   /usr/local/bin/kubectl          KUBECTL (statically linked): labels the node
#   /opt/kata-artifacts/            what the installer puts under the node's prefix:
#     bin/                          containerd-shim-kata-v2 kata-runtime kata-vm-factory
#                                   kata-vsock kata-vmm kata-monitor (from KATA_SHIM_DIR)
#     share/kata-containers/        vmlinux (KATA_KERNEL), kata-initrd.img (KATA_INITRD),
#                                   deploy/containerd/ (the runtime snippets)
#     share/defaults/kata-containers/  configuration.toml, configuration-builtin.toml
# The runtime binaries are the host's build (linked against the node's glibc, as
# `make install` puts them); QEMU and virtiofsd come from the node.
set -euo pipefail

prog=kata-deploy-image
here=$(dirname -- "$(realpath -- "$0")")
repo=$(dirname -- "$here")
. "$here/oci-archive.sh"
die() { echo "$prog: $*" >&2; exit 1; }

[ $# -eq 3 ] || die "usage: $0 BASE.tar OUT.tar NAME:TAG"
base=$1 out=$2 name=$3
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-0}
for v in KATA_SHIM_DIR KATA_KERNEL KATA_INITRD KUBECTL; do
    [ -n "${!v:-}" ] || die "$v is not set"
done
bins=(containerd-shim-kata-v2 kata-runtime kata-vm-factory kata-vsock kata-vmm kata-monitor)
for b in "${bins[@]}"; do
    [ -x "$KATA_SHIM_DIR/$b" ] || die "no $b in $KATA_SHIM_DIR (make build vsock)"
done
[ -f "$KATA_KERNEL" ] || die "KATA_KERNEL: $KATA_KERNEL not found"
[ -f "$KATA_INITRD" ] || die "KATA_INITRD: $KATA_INITRD not found"
[ -x "$KUBECTL" ] || die "KUBECTL: $KUBECTL is not an executable"
if LC_ALL=C readelf -lW "$KUBECTL" | grep -q INTERP; then
    die "$KUBECTL is dynamically linked: the image has no libraries for it"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/kata-deploy-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
r=$work/rootfs
mkdir -p "$r"
oci_unpack_layer "$base" "$r" "$work/base"
a=$r/opt/kata-artifacts
for b in "${bins[@]}"; do
    install -D -m 0755 "$KATA_SHIM_DIR/$b" "$a/bin/$b"
done
install -D -m 0644 "$KATA_KERNEL" "$a/share/kata-containers/vmlinux"
install -D -m 0644 "$KATA_INITRD" "$a/share/kata-containers/kata-initrd.img"
install -D -m 0644 -t "$a/share/kata-containers/deploy/containerd" \
    "$repo/deploy/containerd/kata-containerd-1.x.toml" "$repo/deploy/containerd/kata-containerd-2.x.toml"
install -D -m 0644 "$repo/config/configuration.toml" "$a/share/defaults/kata-containers/configuration.toml"
install -D -m 0644 "$repo/deploy/configuration-builtin.toml" "$a/share/defaults/kata-containers/configuration-builtin.toml"
install -D -m 0755 "$repo/deploy/kata-deploy.sh" "$r/usr/local/bin/kata-deploy"
install -D -m 0755 "$KUBECTL" "$r/usr/local/bin/kubectl"
mapfile -t entries < <(ls -A "$r")
oci_archive "$r" "$out" "$name" \
    '{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":["/usr/local/bin/kata-deploy"],"Cmd":["run"]}' \
    "kata-deploy-image.sh: the kata runtime and its installer" "${entries[@]}"
echo "$prog: wrote $out ($name, $(du -m "$out" | cut -f1) MiB)" >&2

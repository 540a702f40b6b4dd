#!/usr/bin/env bash
# Builds the images cri-tools' critest (v1.37) pulls, with no registry and nothing from the
# internet, as OCI image layout archives that scripts/critest.sh pushes into its loopback
# registry:
#
#   scripts/critest-images.sh BUSYBOX_IMAGE.tar OUT_DIR
#
# BUSYBOX_IMAGE.tar is the project's busybox image (scripts/busybox-image.sh, Debian's
# busybox-static); every image but pause starts from its root filesystem. Writes
# OUT_DIR/<n>.tar per image and OUT_DIR/images.list, one "REPOSITORY:TAG FILE" per line,
# REPOSITORY as critest names it without its registry host (the registry's hosts.toml
# sends gcr.io, registry.k8s.io and k8s.gcr.io to the loopback registry, whose
# repositories keep the paths: k8s-staging-cri-tools/test-image-1, e2e-test-images/busybox,
# pause, ...). Deterministic: the same inputs give the same digests.
#
# What each image is for (read from critest v1.37's pkg/validate and pkg/framework):
#   e2e-test-images/busybox:1.29-2      every default container: sh, echo, sleep, top, ls,
#                                       id, hostname, brctl, netstat, ping, pidof (busybox)
#                                       and pgrep, ipcs, which Debian's busybox-static lacks:
#                                       procps' and util-linux's, with their shared libraries;
#                                       /bin/sh is $SHELL_BUSYBOX when set (see below)
#   e2e-test-images/nginx:1.14-2        web server on port 80 whose PID 1 is nginx's master
#                                       (scripts/critest-nginx.c around busybox httpd)
#   k8s-staging-cri-tools/hostnet-nginx-amd64:latest   the same on port 12003
#   e2e-test-images/httpd:2.4.39-4      web server on port 80 that logs "httpd"
#   e2e-test-images/nonewprivs:1.3      set-user-ID root program printing its effective uid
#                                       (scripts/critest-nnp.c)
#   pause:3.9                           one image under two registries' names (registry.k8s.io
#                                       and k8s.gcr.io), distinct from the CRI's sandbox image
#   k8s-staging-cri-tools/test-image-{1,2,3,latest}:latest, test-image-tag:{test,all}
#                                       distinct images (a file of their own name at /)
#   k8s-staging-cri-tools/test-image-tags:{1,2,3}      one image under three tags
#   k8s-staging-cri-tools/test-image-user-{uid,username,uid-group,username-group}:latest
#                                       image config User 1002, www-data, 1003:1004,
#                                       www-data:1004
#   k8s-staging-cri-tools/test-image-predefined-group:latest   User 1000 (default-user),
#                                       a member of group-defined-in-image (gid 50000)
# Not built: test-image-digest, which critest pulls by upstream's digest (unreproducible).
# Env: CC (default gcc), SOURCE_DATE_EPOCH (default 0), SHELL_BUSYBOX: a busybox that runs
# commands through PATH, as /bin/sh of the default image (scripts/critest.sh passes Debian's
# dynamically linked busybox: busybox-static's sh runs its applets without exec, so the
# masked-paths spec could not see a masked /bin/ls). Nothing is written in the repo.
set -euo pipefail

prog=critest-images
here=$(dirname -- "$(realpath -- "$0")")
. "$here/oci-archive.sh"
die() { echo "$prog: $*" >&2; exit 1; }

[ $# -eq 2 ] || die "usage: $0 BUSYBOX_IMAGE.tar OUT_DIR"
base_tar=$1
out=$2
CC=${CC:-gcc}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-0}
[ -f "$base_tar" ] || die "$base_tar not found (make image)"
for tool in "$CC" tar gzip sha256sum jq ldd readelf; do
    command -v "$tool" >/dev/null || die "'$tool' not found in PATH"
done
for tool in pgrep ipcs; do
    command -v "$tool" >/dev/null || die "'$tool' not found in PATH (apt-get install procps util-linux)"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/critest-images.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
out=$(realpath -- "$out")
rm -f "$out"/*.tar "$out/images.list"

# ---- the base root filesystem: the busybox image's one layer, with more users ----
layout="$work/busybox-layout"
mkdir -p "$layout"
tar -xf "$base_tar" -C "$layout"
manifest=$(jq -r '.manifests[0].digest' "$layout/index.json")
layer=$(jq -r '.layers | if length == 1 then .[0].digest else error("expected one layer") end' \
    "$layout/blobs/sha256/${manifest#sha256:}")
base="$work/base"
mkdir -p "$base"
tar -xzf "$layout/blobs/sha256/${layer#sha256:}" -C "$base"
[ -x "$base/bin/busybox" ] || die "$base_tar has no /bin/busybox"
# Applets as hard links of /bin/busybox, not symlinks (as in upstream's busybox images):
# critest masks /bin/ls, and a mask on a symlink lands on its target, /bin/busybox.
for a in "$base"/bin/*; do
    [ -L "$a" ] && [ "$(readlink -- "$a")" = busybox ] && ln -f "$base/bin/busybox" "$a"
done
printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'daemon:x:1:1:daemon:/usr/sbin:/bin/false' \
    'www-data:x:33:33:www-data:/var/www:/bin/false' 'nobody:x:65534:65534:nobody:/home:/bin/false' \
    >"$base/etc/passwd"
printf '%s\n' 'root:x:0:' 'daemon:x:1:' 'www-data:x:33:' 'nobody:x:65534:' >"$base/etc/group"
mkdir -p "$base/var/run"
chmod 0755 "$base/var" "$base/var/run"

path_env='"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"'
n=0

# image REPOSITORY:TAG... -- ROOTFS CONFIG_JSON: one archive, listed under every name.
image() {
    local names=() rootfs config file entries
    while [ "$1" != -- ]; do names+=("$1"); shift; done
    shift
    rootfs=$1 config=$2
    n=$((n + 1))
    file="$out/$n.tar"
    mapfile -t entries < <(ls -A "$rootfs")
    oci_archive "$rootfs" "$file" "${names[0]}" "$config" \
        "critest-images.sh: ${names[0]} from Debian busybox-static" "${entries[@]}"
    local name
    for name in "${names[@]}"; do
        echo "$name $n.tar" >>"$out/images.list"
    done
    echo "$prog: ${names[*]}: manifest $OCI_MANIFEST_DIGEST" >&2
}

# A copy of the base root filesystem to change.
fresh() { # DIR
    rm -rf "$1"
    cp -a "$base" "$1"
}

# Copies a host binary and the shared libraries it loads into ROOTFS, at the same paths.
with_libs() { # ROOTFS BINARY DEST
    local rootfs=$1 bin=$2 dest=$3 lib
    install -D -m 0755 "$bin" "$rootfs$dest"
    for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
        [ -e "$rootfs$lib" ] && continue
        install -D -m 0755 "$(realpath -- "$lib")" "$rootfs$lib"
    done
}

static_c() { # SOURCE OUTPUT
    "$CC" -static -Os -s -Wall -Wextra -Werror -o "$2" "$1" || die "compiling $1 failed"
    if LC_ALL=C readelf -lW "$2" | grep -q INTERP; then
        die "$2 is dynamically linked"
    fi
}

# ---- the default container image ----
r="$work/busybox"
fresh "$r"
with_libs "$r" "$(command -v pgrep)" /usr/bin/pgrep
with_libs "$r" "$(command -v ipcs)" /usr/bin/ipcs
if [ -n "${SHELL_BUSYBOX:-}" ]; then
    # busybox-static's sh runs applets without looking at PATH, so a masked /bin/ls would
    # still run; Debian's other build execs them, as upstream's busybox image does.
    rm -f "$r/bin/sh"
    with_libs "$r" "$SHELL_BUSYBOX" /bin/sh
fi
image e2e-test-images/busybox:1.29-2 -- "$r" "{\"Env\":[$path_env],\"Cmd\":[\"sh\"]}"

# ---- web servers ----
static_c "$here/critest-nginx.c" "$work/nginx"
for port in 80 12003; do
    r="$work/nginx-$port"
    fresh "$r"
    install -D -m 0755 "$work/nginx" "$r/usr/sbin/nginx"
    mkdir -p "$r/usr/share/nginx/html"
    echo "<html><body>critest web server (port $port)</body></html>" >"$r/usr/share/nginx/html/index.html"
    config="{\"Env\":[$path_env,\"NGINX_PORT=$port\"],\"Cmd\":[\"/usr/sbin/nginx\"],\"StopSignal\":\"SIGQUIT\",\"ExposedPorts\":{\"$port/tcp\":{}}}"
    if [ "$port" = 80 ]; then
        image e2e-test-images/nginx:1.14-2 -- "$r" "$config"
    else
        image k8s-staging-cri-tools/hostnet-nginx-amd64:latest -- "$r" "$config"
    fi
done

r="$work/httpd"
fresh "$r"
mkdir -p "$r/usr/local/apache2/htdocs" "$r/usr/local/bin"
echo "<html><body>critest httpd</body></html>" >"$r/usr/local/apache2/htdocs/index.html"
cat >"$r/usr/local/bin/httpd-foreground" <<'EOF'
#!/bin/sh
# busybox httpd in the foreground on port 80; the first line tells the log who serves.
echo "httpd: serving /usr/local/apache2/htdocs on port 80" >&2
exec httpd -f -p 80 -h /usr/local/apache2/htdocs
EOF
chmod 0755 "$r/usr/local/bin/httpd-foreground"
image e2e-test-images/httpd:2.4.39-4 -- "$r" \
    "{\"Env\":[$path_env],\"Cmd\":[\"httpd-foreground\"],\"ExposedPorts\":{\"80/tcp\":{}}}"

# ---- no_new_privs ----
r="$work/nnp"
fresh "$r"
mkdir -p "$r/usr/local/bin"
static_c "$here/critest-nnp.c" "$r/usr/local/bin/nnp"
chmod 4755 "$r/usr/local/bin/nnp"
image e2e-test-images/nonewprivs:1.3 -- "$r" "{\"Env\":[$path_env],\"Cmd\":[\"/usr/local/bin/nnp\"]}"

# ---- pause:3.9: the project's pause, built with another timestamp than the sandbox image
# (so another image ID: critest removes pause:3.9 by ID) ----
n=$((n + 1))
SOURCE_DATE_EPOCH=1 IMAGE_NAME=registry.k8s.io/pause:3.9 bash "$here/pause-image.sh" "$out/$n.tar"
echo "pause:3.9 $n.tar" >>"$out/images.list"

# ---- image management specs: busybox with a marker file ----
marked() { # FILE -> rootfs dir with /FILE
    r="$work/marked-$1"
    fresh "$r"
    : >"$r/$1"
    chmod 0644 "$r/$1"
}
plain="{\"Env\":[$path_env],\"Cmd\":[\"sh\"]}"
for i in 1 2 3 latest; do
    marked "test-image-$i"
    image "k8s-staging-cri-tools/test-image-$i:latest" -- "$r" "$plain"
done
marked same-image
image k8s-staging-cri-tools/test-image-tags:1 k8s-staging-cri-tools/test-image-tags:2 \
    k8s-staging-cri-tools/test-image-tags:3 -- "$r" "$plain"
for t in test all; do
    marked "$t"
    image "k8s-staging-cri-tools/test-image-tag:$t" -- "$r" "$plain"
done

# ---- image users ----
r="$work/users"
fresh "$r"
for u in uid:1002 username:www-data uid-group:1003:1004 username-group:www-data:1004; do
    image "k8s-staging-cri-tools/test-image-user-${u%%:*}:latest" -- "$r" \
        "{\"Env\":[$path_env],\"Cmd\":[\"sh\"],\"User\":\"${u#*:}\"}"
done

r="$work/predefined-group"
fresh "$r"
echo 'default-user:x:1000:1000::/home/default-user:/bin/sh' >>"$r/etc/passwd"
printf '%s\n' 'default-user:x:1000:' 'group-defined-in-image:x:50000:default-user' >>"$r/etc/group"
mkdir -p "$r/home/default-user"
chmod 0755 "$r/home/default-user"
image k8s-staging-cri-tools/test-image-predefined-group:latest -- "$r" \
    "{\"Env\":[$path_env],\"Cmd\":[\"sh\"],\"User\":\"1000\"}"

echo "$prog: $n archives, $(wc -l <"$out/images.list") names in $out/images.list" >&2

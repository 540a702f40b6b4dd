# Sourced by the scripts that stand up a CRI node of their own (critest.sh, k8s-suite.sh),
# after they define die(), log() and $WORK: Debian packages unpacked (never installed), the
# project's test images, a loopback registry serving them, and the kata runtime snippet of
# deploy/containerd/ with our configuration.
#
# Globals they read: CRI_LIB_CACHE (where unpacked packages and built images are kept),
# WORK (run-time directory), LOG_DIR, KATA_IMAGE (the project's busybox image).
# Globals they set: REGISTRY_PID (start_registry), IMAGES (build_images), SHELL_BUSYBOX
# (shell_busybox).

cri_lib_dir=$(dirname -- "$(realpath -- "${BASH_SOURCE[0]}")")

# Dies unless run as root with what the make target sets (KATA_KERNEL, KATA_INITRD,
# KATA_SHIM_DIR, KATA_IMAGE, KATA_PAUSE_IMAGE) and a containerd in CONTAINERD_BIN.
check_node_inputs() { # MAKE_TARGET CONTAINERD_BIN
    local v c
    [ "$(id -u)" = 0 ] || die "must run as root"
    for v in KATA_KERNEL KATA_INITRD KATA_SHIM_DIR KATA_IMAGE KATA_PAUSE_IMAGE; do
        [ -n "${!v:-}" ] || die "$v is not set (run it through 'make $1')"
    done
    [ -f "$KATA_KERNEL" ] || die "KATA_KERNEL: $KATA_KERNEL not found"
    [ -f "$KATA_INITRD" ] || die "KATA_INITRD: $KATA_INITRD not found"
    [ -x "$KATA_SHIM_DIR/containerd-shim-kata-v2" ] || die "no containerd-shim-kata-v2 in $KATA_SHIM_DIR"
    [ -x "$KATA_SHIM_DIR/kata-vsock" ] || die "no kata-vsock in $KATA_SHIM_DIR"
    [ -f "$KATA_IMAGE" ] || die "KATA_IMAGE: $KATA_IMAGE not found (make image)"
    [ -f "$KATA_PAUSE_IMAGE" ] || die "KATA_PAUSE_IMAGE: $KATA_PAUSE_IMAGE not found (make image)"
    for c in containerd ctr containerd-shim-runc-v2; do
        [ -x "$2/$c" ] || die "no $c in $2 (make containerd-versions)"
    done
}

# Unpacks Debian package NAME (VERSION, or the candidate) into $CRI_LIB_CACHE/deb-NAME;
# prints the dir. docker-registry's package would start a system service listening on
# every address, and the dynamically linked busybox conflicts with busybox-static, which
# the host keeps: both are only unpacked.
debian_package() { # NAME [VERSION]
    local name=$1 version=${2:-} dest=$CRI_LIB_CACHE/deb-$1 tmp spec deb
    if [ -f "$dest/.version" ] && { [ -z "$version" ] || [ "$(cat "$dest/.version")" = "$version" ]; }; then
        echo "$dest"
        return 0
    fi
    spec=$name${version:+=$version}
    mkdir -p "$CRI_LIB_CACHE"
    tmp=$(mktemp -d "$CRI_LIB_CACHE/.deb.XXXXXX")
    log "fetching Debian's $spec"
    if ! (cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "$spec") >&2; then
        apt-get update -qq >&2 || true
        (cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "$spec") >&2 ||
            { rm -rf "$tmp"; die "apt-get download $spec failed"; }
    fi
    deb=$(ls "$tmp"/*.deb)
    mkdir -p "$tmp/root"
    dpkg-deb -x "$deb" "$tmp/root"
    dpkg-deb -f "$deb" Version >"$tmp/root/.version"
    rm -rf "$dest"
    mv "$tmp/root" "$dest"
    rm -rf "$tmp"
    echo "$dest"
}

# Debian's dynamically linked busybox of the host's busybox-static release (one source
# package): its sh runs commands through PATH, as upstream's busybox images do. Sets
# SHELL_BUSYBOX.
shell_busybox() {
    local bb_version
    bb_version=$(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null) ||
        die "busybox-static is not installed (scripts/setup-host.sh)"
    SHELL_BUSYBOX=$(debian_package busybox "$bb_version")/bin/busybox
    [ -x "$SHELL_BUSYBOX" ] || die "Debian's busybox package has no /bin/busybox"
}

# The test images (scripts/critest-images.sh, plus EXTRA: more image scripts, each run as
# `bash SCRIPT OUT_DIR` adding to OUT_DIR/images.list), cached by the hash of what makes
# them (with the files CRI_LIB_IMAGE_INPUTS names, space-separated: what EXTRA reads). Sets
# IMAGES (the dir holding images.list and the archives).
build_images() { # [EXTRA_SCRIPT...]
    local key here=$cri_lib_dir extra
    [ -n "${SHELL_BUSYBOX:-}" ] || shell_busybox
    key=$( (sha256sum "$here/critest-images.sh" "$here/oci-archive.sh" "$here/critest-nginx.c" \
        "$here/critest-nnp.c" "$here/pause.c" "$here/pause-image.sh" "$KATA_IMAGE" "$SHELL_BUSYBOX" \
        "$(command -v pgrep)" "$(command -v ipcs)" "$@" ${CRI_LIB_IMAGE_INPUTS:-} | cut -d' ' -f1) | sha256sum | cut -c1-16)
    IMAGES=$CRI_LIB_CACHE/images-$key
    [ -f "$IMAGES/images.list" ] && return 0
    rm -rf "$IMAGES.tmp"
    SHELL_BUSYBOX=$SHELL_BUSYBOX bash "$here/critest-images.sh" "$KATA_IMAGE" "$IMAGES.tmp" 2>"$LOG_DIR/images.log" ||
        { tail -n 20 "$LOG_DIR/images.log" >&2; rm -rf "$IMAGES.tmp"; die "building the test images failed"; }
    for extra in "$@"; do
        SHELL_BUSYBOX=$SHELL_BUSYBOX bash "$extra" "$IMAGES.tmp" 2>>"$LOG_DIR/images.log" ||
            { tail -n 20 "$LOG_DIR/images.log" >&2; rm -rf "$IMAGES.tmp"; die "building the images of $extra failed"; }
    done
    # Images of older keys: not for this run (another checkout may still use its own key:
    # only the ones more than a day old go).
    find "$CRI_LIB_CACHE" -maxdepth 1 -name 'images-*' -mtime +1 -exec rm -rf {} + 2>/dev/null || true
    mv "$IMAGES.tmp" "$IMAGES"
}

# A free TCP port on 127.0.0.1 in [FROM, FROM+100).
free_port() {
    local p
    for p in $(seq "$1" $(($1 + 99))); do
        [ -z "$(ss -Hltn "sport = :$p")" ] && { echo "$p"; return 0; }
    done
    die "no free port in $1..$(($1 + 99))"
}

# Debian's docker-registry on 127.0.0.1:PORT, storage under $WORK/registry. Sets REGISTRY_PID.
start_registry() { # PORT
    local port=$1 bin
    bin=$(debian_package docker-registry)/usr/bin/docker-registry
    [ -x "$bin" ] || die "Debian's docker-registry package has no $bin"
    mkdir -p "$WORK/registry/data"
    cat >"$WORK/registry/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $WORK/registry/data
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
EOF
    setsid "$bin" serve "$WORK/registry/config.yml" \
        </dev/null >"$LOG_DIR/registry.log" 2>&1 &
    REGISTRY_PID=$!
    for _ in $(seq 100); do
        curl -fsS -o /dev/null "http://127.0.0.1:$port/v2/" 2>/dev/null && return 0
        kill -0 "$REGISTRY_PID" 2>/dev/null || { cat "$LOG_DIR/registry.log" >&2; die "the registry exited"; }
        sleep 0.1
    done
    die "the registry did not answer on 127.0.0.1:$port (log: $LOG_DIR/registry.log)"
}

stop_registry() {
    if [ -n "${REGISTRY_PID:-}" ] && kill -0 "$REGISTRY_PID" 2>/dev/null; then
        kill -TERM "$REGISTRY_PID"
        for _ in $(seq 50); do kill -0 "$REGISTRY_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$REGISTRY_PID" 2>/dev/null
        wait "$REGISTRY_PID" 2>/dev/null
    fi
    REGISTRY_PID=
}

# Pushes the OCI layout archive FILE as REPOSITORY:TAG through the registry API.
push() { # URL REPO:TAG FILE
    local url=$1 name=${2%:*} tag=${2##*:} file=$3 dir digest manifest blob location
    dir=$WORK/push/$(basename -- "$file" .tar)
    if [ ! -d "$dir" ]; then
        mkdir -p "$dir"
        tar -xf "$file" -C "$dir"
    fi
    manifest=$(jq -r '.manifests[0].digest' "$dir/index.json")
    for digest in $(jq -r '.config.digest, .layers[].digest' "$dir/blobs/sha256/${manifest#sha256:}"); do
        blob=$dir/blobs/sha256/${digest#sha256:}
        curl -fsS -o /dev/null -I "$url/v2/$name/blobs/$digest" 2>/dev/null && continue
        location=$(curl -fsS -X POST -D - -o /dev/null "$url/v2/$name/blobs/uploads/" |
            tr -d '\r' | sed -n 's/^[Ll]ocation: //p')
        [ -n "$location" ] || die "registry: no upload location for $name"
        case "$location" in /*) location=$url$location ;; esac
        case "$location" in *\?*) location="$location&digest=$digest" ;; *) location="$location?digest=$digest" ;; esac
        curl -fsS -o /dev/null -X PUT -H 'Content-Type: application/octet-stream' \
            --data-binary "@$blob" "$location" || die "registry: uploading $digest of $name failed"
    done
    curl -fsS -o /dev/null -X PUT -H 'Content-Type: application/vnd.oci.image.manifest.v1+json' \
        --data-binary "@$dir/blobs/sha256/${manifest#sha256:}" "$url/v2/$name/manifests/$tag" ||
        die "registry: putting the manifest of $name:$tag failed"
}

# Pushes every image of $IMAGES/images.list to the registry at URL.
push_images() { # URL
    local start=$SECONDS name file
    while read -r name file; do
        push "$1" "$name" "$IMAGES/$file"
    done <"$IMAGES/images.list"
    rm -rf "$WORK/push"
    log "registry $1 (pid $REGISTRY_PID): $(wc -l <"$IMAGES/images.list") images pushed in $((SECONDS - start)) s"
}

# containerd's hosts.toml in DIR/<host>/ sending each HOST to the registry at URL.
registry_hosts() { # DIR URL HOST...
    local dir=$1 url=$2 host
    shift 2
    for host in "$@"; do
        mkdir -p "$dir/$host"
        printf 'server = "%s"\n' "$url" >"$dir/$host/hosts.toml"
    done
}

# The kata runtimes of deploy/containerd/ for this containerd's config version, as
# shipped. They have no options table (their shims find their configuration by their
# names); the caller exports KATA_CONF_FILE to containerd, whose shims inherit it, to name
# its own configuration.
kata_snippet() { # CONFIG_VERSION
    local snippet repo
    repo=$(dirname -- "$cri_lib_dir")
    # One snippet for config versions 3 (containerd 2.0-2.2) and 4 (2.3 on): the CRI's
    # runtime tables are the same in both.
    case $1 in
    2) snippet=$repo/deploy/containerd/kata-containerd-1.x.toml ;;
    *) snippet=$repo/deploy/containerd/kata-containerd-2.x.toml ;;
    esac
    [ -f "$snippet" ] || die "no deploy snippet for containerd config version $1"
    cat "$snippet"
}

# The config version a containerd binary reads natively: 2 (1.x), 3 (2.0-2.2), 4 (2.3 on).
containerd_config_version() { # CONTAINERD
    "$1" --version | awk '{ v = $3; sub(/^v/, "", v); split(v, p, "."); if (p[1] == 1) print 2; else if (p[2] <= 2) print 3; else print 4 }'
}

# A CNI network list at FILE: the bridge plugin (BRIDGE, gateway SUBNET.1, host-local
# addresses of SUBNET.0/24 kept in $WORK/cni/ipam) and portmap, named NETNAME.
cni_conflist() { # FILE NETNAME BRIDGE SUBNET
    cat >"$1" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$2",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$3",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$4.0/24", "gateway": "$4.1" }]],
        "routes": [{ "dst": "0.0.0.0/0" }],
        "dataDir": "$WORK/cni/ipam"
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
}

# What pods of network NETNAME on SUBNET.0/24 left when they could not be removed: the
# host port rules of CNI's portmap (each names the network in its comment) and their
# network namespaces (those with an address in the subnet, which no other network uses).
cni_leftovers() { # NETNAME SUBNET
    local rule chain m
    iptables -t nat -S CNI-HOSTPORT-DNAT 2>/dev/null | grep -F "dnat name: \\\"$1\\\"" |
        while IFS= read -r rule; do
            log "removing the host port rule of a pod left behind: $rule"
            chain=$(sed -n 's/.* -j \(CNI-DN-[0-9a-f]*\).*/\1/p' <<<"$rule")
            eval "iptables -t nat ${rule/#-A /-D }"
            [ -z "$chain" ] || { iptables -t nat -F "$chain"; iptables -t nat -X "$chain"; }
        done
    [ -n "$2" ] || return 0
    for m in /var/run/netns/*; do
        [ -e "$m" ] || continue
        ip -n "$(basename -- "$m")" -4 -o addr show 2>/dev/null | grep -qF " $2." || continue
        log "removing the network namespace $m of a pod left behind"
        umount -l "$m" && rm -f "$m"
    done
}

# The runtime configuration of the kata handler: ours, as the end-to-end tests write it
# (without debug logs), at FILE.
kata_test_config() { # FILE
    {
        echo '[hypervisor.qemu]'
        echo "kernel = \"$KATA_KERNEL\""
        echo "initrd = \"$KATA_INITRD\""
        echo "vsock_backend = \"$KATA_SHIM_DIR/kata-vsock\""
    } >"$1"
}

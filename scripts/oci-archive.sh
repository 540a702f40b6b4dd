# Sourced by the image scripts (busybox-image.sh, pause-image.sh, k8s-images.sh,
# kata-deploy-image.sh, ...): writes a one-layer OCI image layout archive from a root
# filesystem directory, deterministically (fixed mtime
# SOURCE_DATE_EPOCH, root-owned, sorted, gzip -n), so the same files give the same bytes
# and digests. Needs tar, gzip, sha256sum, jq.
#
#   oci_archive ROOTFS OUTPUT.tar IMAGE_NAME CONFIG_JSON CREATED_BY ENTRY...
#
# CONFIG_JSON is the image config's `config` object (Env, Cmd, Entrypoint, ...); ENTRY...
# the top-level entries of ROOTFS that make the layer. The archive's index names the
# image IMAGE_NAME (io.containerd.image.name, so `ctr images import` uses it).

# Fixed, sorted, root-owned tar of a directory's listed entries.
oci_det_tar() { # DIR OUT ENTRY...
    local dir=$1 out=$2
    shift 2
    find "$dir" -exec touch -h -d "@${SOURCE_DATE_EPOCH:-0}" {} +
    tar -C "$dir" --sort=name --mtime="@${SOURCE_DATE_EPOCH:-0}" --owner=0 --group=0 \
        --numeric-owner --format=gnu -cf "$out" "$@"
}

oci_sha() { sha256sum "$1" | cut -d' ' -f1; }

# Moves FILE into the layout's blobs under its digest; prints "DIGEST SIZE".
oci_blob() { # LAYOUT FILE
    local digest size
    digest=$(oci_sha "$2")
    size=$(stat -c %s "$2")
    mv "$2" "$1/blobs/sha256/$digest"
    echo "$digest $size"
}

oci_archive() {
    local rootfs=$1 output=$2 name=$3 config=$4 created_by=$5
    shift 5
    local work layout created diff_id layer cfg manifest tag out_dir tmp
    work=$(mktemp -d "${TMPDIR:-/tmp}/oci-archive.XXXXXX")
    layout="$work/layout"
    mkdir -p "$layout/blobs/sha256"

    oci_det_tar "$rootfs" "$work/layer.tar" "$@"
    diff_id=$(oci_sha "$work/layer.tar")
    gzip -n -9 <"$work/layer.tar" >"$work/layer.tar.gz"
    layer=$(oci_blob "$layout" "$work/layer.tar.gz")

    created=$(date -u -d "@${SOURCE_DATE_EPOCH:-0}" +%Y-%m-%dT%H:%M:%SZ)
    jq -cn --arg created "$created" --arg diff "sha256:$diff_id" --argjson config "$config" \
        --arg by "$created_by" '{
      created: $created,
      architecture: "amd64",
      os: "linux",
      config: $config,
      rootfs: { type: "layers", diff_ids: [$diff] },
      history: [ { created: $created, created_by: $by } ]
    }' >"$work/config.json"
    cfg=$(oci_blob "$layout" "$work/config.json")

    jq -cn --arg cd "sha256:${cfg% *}" --argjson cs "${cfg#* }" \
        --arg ld "sha256:${layer% *}" --argjson ls "${layer#* }" '{
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: { mediaType: "application/vnd.oci.image.config.v1+json", digest: $cd, size: $cs },
      layers: [ { mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $ld, size: $ls } ]
    }' >"$work/manifest.json"
    manifest=$(oci_blob "$layout" "$work/manifest.json")

    tag=${name##*:}
    case "$tag" in */*) tag=latest ;; esac
    jq -cn --arg md "sha256:${manifest% *}" --argjson ms "${manifest#* }" \
        --arg name "$name" --arg tag "$tag" '{
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.index.v1+json",
      manifests: [ {
        mediaType: "application/vnd.oci.image.manifest.v1+json",
        digest: $md, size: $ms,
        annotations: { "io.containerd.image.name": $name, "org.opencontainers.image.ref.name": $tag },
        platform: { architecture: "amd64", os: "linux" }
      } ]
    }' >"$layout/index.json"
    printf '%s' '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
    chmod 0644 "$layout/index.json" "$layout/oci-layout" "$layout"/blobs/sha256/*
    chmod 0755 "$layout" "$layout/blobs" "$layout/blobs/sha256"

    out_dir=$(dirname -- "$output")
    mkdir -p "$out_dir"
    tmp=$(mktemp "$out_dir/.$(basename -- "$output").XXXXXX")
    oci_det_tar "$layout" "$tmp" oci-layout index.json blobs
    chmod 0644 "$tmp"
    mv -f "$tmp" "$output"
    rm -rf "$work"
    OCI_MANIFEST_DIGEST="sha256:${manifest% *}"
    OCI_DIFF_ID="sha256:$diff_id"
}

# Unpacks the (first) layer of the OCI archive ARCHIVE into DIR, using SCRATCH (removed).
oci_unpack_layer() { # ARCHIVE DIR SCRATCH
    local manifest layer
    mkdir -p "$3" "$2"
    tar -xf "$1" -C "$3"
    manifest=$(jq -r '.manifests[0].digest' "$3/index.json")
    layer=$(jq -r '.layers[0].digest' "$3/blobs/sha256/${manifest#sha256:}")
    tar -xzf "$3/blobs/sha256/${layer#sha256:}" -C "$2"
    rm -rf "$3"
}

# The Kubernetes suite's cases, sourced by scripts/k8s-suite.sh once its node is up.
#
# A case is a function case_NAME run in a subshell with `set -euo pipefail`, once per
# RuntimeClass, in a namespace of its own ($NS), with $RC the RuntimeClass its pods ask for.
# It drives the cluster with kubectl as a user would and fails (non-zero) with a line that
# says what was expected and what it saw; `skip "why"` ends it as skipped. Cases in
# SERIAL_CASES disturb the whole node (kubelet and containerd restarts) and run alone, after
# the others. Every case's log is $LOG_DIR/cases/NAME.RC.log, with the namespace's pods,
# events and the node's kubelet log lines about them appended when it fails.

IMG=registry.k8s.io/e2e-test-images/busybox:1.29-2
TOOLS=registry.k8s.io/kata-k8s/tools:1
WEB=registry.k8s.io/e2e-test-images/nginx:1.14-2
WEB_TEXT="critest web server"

CASES=(
    configmap-update secret-update projected downward-api
    emptydir-shared emptydir-memory hostpath persistent-volume block-volume image-volume
    probes liveness-restart hooks crash-restart init-sidecar graceful-termination job
    exec attach logs-follow cp port-forward debug-ephemeral debug-target
    resources-visible cpu-count resize pod-level-resources qos-classes oom-killed vm-oom-reason
    summary-api
    pod-to-pod service-dns node-port
    run-as-ids readonly-rootfs capabilities seccomp sysctls share-process-namespace
    user-namespaces
)
# Alone: ten pods at once fill the node's CPUs; restarts disturb every pod.
SERIAL_CASES=(deployment-scale kubelet-restart containerd-restart)
# Last, with RuntimeClass kata only: vm-pool runs a VM factory of its own; helm-install
# takes our runtime off the node and puts it back (tests/k8s/helm.sh).
NODE_CASES=(vm-pool helm-install)

# ---- helpers for the cases ----
kn() { kubectl --request-timeout=60s -n "$NS" "$@"; }
apply() { kn apply -f - >/dev/null; }
ready() { kn wait --for=condition=Ready "pod/$1" --timeout="${2:-300s}" >/dev/null; }
# exec in a pod, bounded (kubectl's streams have no timeout of their own).
x() { timeout 120 kubectl -n "$NS" exec "$@"; }
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
eq() { [ "$1" = "$2" ] || fail "${3:-value}: expected '$2', got '$1'"; }
has() { grep -qF -- "$2" <<<"$1" || fail "${3:-output}: expected '$2' in: $(head -c 600 <<<"$1")"; }
# Runs CMD... every second until it succeeds, for at most SECONDS; fails with WHAT.
until_ok() { # SECONDS WHAT CMD...
    local secs=$1 deadline=$((SECONDS + $1)) what=$2
    shift 2
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || fail "$what (after $secs s)"
        sleep 1
    done
}
jp() { kn get "$1" -o jsonpath="$2"; }
# The head of a pod spec: name, RuntimeClass, a short grace period.
pod() { # NAME
    cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, labels: {app: $1}}
spec:
  runtimeClassName: $RC
  terminationGracePeriodSeconds: 3
EOF
}
# Small requests: the node has 2 CPUs; limits (what sizes a kata VM) are each case's own.
RES='resources: {requests: {cpu: 10m, memory: 16Mi}}'

# ---- volumes ----

# A ConfigMap or Secret volume: read, then updated through the API, seen by a reader and
# by an inotify watcher in the container (kubelet swaps the volume's ..data symlink).
volume_update() { # configmap|secret
    local kind=$1 src t0
    if [ "$kind" = configmap ]; then
        kn create configmap vol --save-config --from-literal=key=one --from-literal=other=x >/dev/null
        src="configMap: {name: vol}"
    else
        kn create secret generic vol --save-config --from-literal=key=one --from-literal=other=x >/dev/null
        src="secret: {secretName: vol}"
    fi
    { pod reader; cat <<EOF
  containers:
  - name: c
    image: $TOOLS
    $RES
    command: [sh, -c, 'inotify-watch /vol >/tmp/events 2>&1 & sleep 3600']
    volumeMounts: [{name: vol, mountPath: /vol}]
  volumes:
  - name: vol
    $src
EOF
    } | apply
    ready reader
    eq "$(x reader -- cat /vol/key)" one "/vol/key before the update"
    sleep 2
    if [ "$kind" = configmap ]; then
        kn create configmap vol --from-literal=key=two --from-literal=other=x --dry-run=client -o yaml | apply
    else
        kn create secret generic vol --from-literal=key=two --from-literal=other=x --dry-run=client -o yaml | apply
    fi
    t0=$SECONDS
    until_ok 150 "the update did not reach /vol/key" sh -c "[ \"\$(timeout 60 kubectl -n $NS exec reader -- cat /vol/key)\" = two ]"
    echo "update seen by a reader after $((SECONDS - t0)) s"
    until_ok 15 "no inotify event in the container for the update" sh -c "timeout 60 kubectl -n $NS exec reader -- cat /tmp/events | grep -v -q '^watching'"
    echo "inotify events: $(x reader -- cat /tmp/events | tr '\n' ' ' | head -c 300)"
}
case_configmap-update() { volume_update configmap; }
case_secret-update() { volume_update secret; }

case_projected() {
    kn create configmap cm --from-literal=color=blue >/dev/null
    kn create secret generic sec --from-literal=pass=s3cret >/dev/null
    { pod proj; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sleep, "3600"]
    volumeMounts: [{name: all, mountPath: /all}]
  volumes:
  - name: all
    projected:
      defaultMode: 0440
      sources:
      - configMap: {name: cm}
      - secret: {name: sec}
      - downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}
      - serviceAccountToken: {path: token, expirationSeconds: 3600}
EOF
    } | apply
    ready proj
    eq "$(x proj -- cat /all/color)" blue "configMap item"
    eq "$(x proj -- cat /all/pass)" s3cret "secret item"
    eq "$(x proj -- cat /all/name)" proj "downwardAPI item"
    has "$(x proj -- cat /all/token)" "eyJ" "service account token"
    eq "$(x proj -- stat -L -c %a /all/color)" 440 "defaultMode"
}

case_downward-api() {
    { pod dapi; cat <<EOF
  containers:
  - name: c
    image: $IMG
    resources: {requests: {cpu: 10m, memory: 16Mi}, limits: {memory: 256Mi}}
    command: [sleep, "3600"]
    env:
    - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
    - {name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
    - {name: MEM_LIMIT, valueFrom: {resourceFieldRef: {resource: limits.memory}}}
    volumeMounts: [{name: info, mountPath: /info}]
  volumes:
  - name: info
    downwardAPI:
      items:
      - {path: labels, fieldRef: {fieldPath: metadata.labels}}
EOF
    } | apply
    ready dapi
    eq "$(x dapi -- sh -c 'echo $POD_IP')" "$(jp pod/dapi '{.status.podIP}')" "POD_IP"
    eq "$(x dapi -- sh -c 'echo $NODE_NAME')" "$NODE" "NODE_NAME"
    eq "$(x dapi -- sh -c 'echo $MEM_LIMIT')" 268435456 "MEM_LIMIT"
    has "$(x dapi -- cat /info/labels)" 'app="dapi"' "labels file"
    kn label pod dapi extra=added >/dev/null
    until_ok 120 "the label added did not reach /info/labels" sh -c "timeout 60 kubectl -n $NS exec dapi -- cat /info/labels | grep -q 'extra=\"added\"'"
}

# Two containers of a pod share an emptyDir: a file, a unix socket and a FIFO.
case_emptydir-shared() {
    { pod shared; cat <<EOF
  containers:
  - name: a
    image: $TOOLS
    $RES
    command: [sh, -c, 'echo hello >/shared/file && mkfifo /shared/fifo && exec usock serve /shared/echo.sock']
    volumeMounts: [{name: s, mountPath: /shared}]
  - name: b
    image: $TOOLS
    $RES
    command: [sleep, "3600"]
    volumeMounts: [{name: s, mountPath: /shared}]
  volumes:
  - {name: s, emptyDir: {}}
EOF
    } | apply
    ready shared
    until_ok 30 "no socket /shared/echo.sock" x shared -c b -- test -S /shared/echo.sock
    eq "$(x shared -c b -- cat /shared/file)" hello "a file across containers"
    eq "$(x shared -c b -- usock send /shared/echo.sock ping)" "echo:ping" "a unix socket across containers"
    x shared -c a -- sh -c 'echo through-fifo >/shared/fifo' &
    local writer=$!
    local got
    got=$(x shared -c b -- timeout 30 cat /shared/fifo) || true
    kill "$writer" 2>/dev/null || true
    wait "$writer" 2>/dev/null || true
    eq "$got" through-fifo "a FIFO across containers"
}

case_emptydir-memory() {
    { pod mem; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sleep, "3600"]
    volumeMounts: [{name: m, mountPath: /cache}]
  volumes:
  - {name: m, emptyDir: {medium: Memory, sizeLimit: 64Mi}}
EOF
    } | apply
    ready mem
    local line
    line=$(x mem -- grep ' /cache ' /proc/mounts)
    eq "$(awk '{print $3}' <<<"$line")" tmpfs "file system type of /cache ($line)"
    eq "$(x mem -- df -k /cache | awk 'NR == 2 {print $2}')" 65536 "size of /cache in KiB"
    if x mem -- dd if=/dev/zero of=/cache/fill bs=1M count=80 2>/dev/null; then
        fail "80 MiB fit in a 64 MiB emptyDir"
    fi
}

case_hostpath() {
    local dir=$WORK/hostpath-$NS
    mkdir -p "$dir"
    echo from-host >"$dir/in"
    { pod hp; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sleep, "3600"]
    volumeMounts: [{name: h, mountPath: /h}]
  volumes:
  - {name: h, hostPath: {path: $dir, type: Directory}}
EOF
    } | apply
    ready hp
    eq "$(x hp -- cat /h/in)" from-host "a host file in the pod"
    x hp -- sh -c 'echo from-pod >/h/out'
    eq "$(cat "$dir/out")" from-pod "the pod's file on the host"
    echo changed >"$dir/in"
    until_ok 10 "a host change did not reach the pod" sh -c "[ \"\$(timeout 60 kubectl -n $NS exec hp -- cat /h/in)\" = changed ]"
}

case_persistent-volume() {
    local dir=$WORK/pv-$NS
    mkdir -p "$dir"
    kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-$NS}
spec:
  capacity: {storage: 100Mi}
  accessModes: [ReadWriteOnce]
  storageClassName: manual-$NS
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: $dir}
EOF
    { cat <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: claim}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: manual-$NS
  resources: {requests: {storage: 100Mi}}
---
EOF
      pod pvpod; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sh, -c, 'echo persisted >/data/f && sleep 3600']
    volumeMounts: [{name: d, mountPath: /data}]
  volumes:
  - {name: d, persistentVolumeClaim: {claimName: claim}}
EOF
    } | apply
    ready pvpod
    eq "$(jp pvc/claim '{.status.phase}')" Bound "the claim"
    until_ok 10 "the pod's file is not on the volume" test -f "$dir/f"
    eq "$(cat "$dir/f")" persisted "the volume's file on the host"
    kn delete pod pvpod --wait=true >/dev/null
    kn delete pvc claim --wait=true >/dev/null
    kubectl delete pv "pv-$NS" --wait=false >/dev/null
}

# A raw block volume (volumeDevices): a local PersistentVolume in Block mode on a loop device.
case_block-volume() {
    local img=$WORK/block-$NS.img dev
    truncate -s 32M "$img"
    dev=$(losetup -f --show "$img")
    echo "loop device $dev"
    kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: {name: blk-$NS}
spec:
  capacity: {storage: 32Mi}
  volumeMode: Block
  accessModes: [ReadWriteOnce]
  storageClassName: block-$NS
  persistentVolumeReclaimPolicy: Retain
  local: {path: $dev}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$NODE]}]
EOF
    { cat <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: blk}
spec:
  volumeMode: Block
  accessModes: [ReadWriteOnce]
  storageClassName: block-$NS
  resources: {requests: {storage: 32Mi}}
---
EOF
      pod blkpod; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sleep, "3600"]
    volumeDevices: [{name: b, devicePath: /dev/xvda}]
  volumes:
  - {name: b, persistentVolumeClaim: {claimName: blk}}
EOF
    } | apply
    local ok=0
    ready blkpod || ok=$?
    if [ $ok = 0 ]; then
        x blkpod -- test -b /dev/xvda || fail "/dev/xvda is not a block device in the container"
        x blkpod -- sh -c 'echo kata-block-data | dd of=/dev/xvda bs=512 count=1 conv=sync 2>/dev/null && sync'
        eq "$(x blkpod -- sh -c 'dd if=/dev/xvda bs=512 count=1 2>/dev/null | head -c 15')" kata-block-data "read back in the container"
        sync
        eq "$(dd if="$dev" bs=512 count=1 iflag=direct 2>/dev/null | head -c 15)" kata-block-data "the bytes on the host device"
    fi
    kn delete pod blkpod --wait=true >/dev/null 2>&1 || true
    kn delete pvc blk --wait=true >/dev/null 2>&1 || true
    kubectl delete pv "blk-$NS" --wait=true >/dev/null 2>&1 || true
    losetup -d "$dev" || true
    [ $ok = 0 ] || fail "the pod with a block volume did not become ready"
}

case_image-volume() {
    { pod imgvol; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sleep, "3600"]
    volumeMounts: [{name: i, mountPath: /img}]
  volumes:
  - name: i
    image: {reference: registry.k8s.io/k8s-staging-cri-tools/test-image-1:latest, pullPolicy: IfNotPresent}
EOF
    } | apply
    ready imgvol
    x imgvol -- test -f /img/test-image-1 || fail "the image's file /test-image-1 is not at /img"
    if x imgvol -- touch /img/new 2>/dev/null; then fail "the image volume is writable"; fi
}

# The sandbox of pod NAME (this namespace) as the shim recorded it: its persist.json,
# found by the pod's uid in its cgroup path.
persisted_of() { # NAME
    local uid
    uid=$(jp "pod/$1" '{.metadata.uid}')
    grep -l -- "pod$uid" /run/vc/sbs/*/persist.json 2>/dev/null | head -n 1
}

# RuntimeClass kata-pool: a VM factory (started and ended here by pid) keeps one VM ready.
# A pod of the pool's size (no limits: the default size) with an image volume starts on a
# pooled VM, and so does one whose pod-level limits make the pool's size; one whose
# pod-level limits ask for another size boots cold, with its size.
pool_ready() { # WHAT
    until_ok 120 "the factory did not make $1 VM ready (log: $LOG_DIR/cases/vm-pool.factory.log)" sh -c \
        "'$KATA_SHIM_DIR/kata-vm-factory' status --config '$POOL_CONFIG' | grep -q '^ready VMs: 1'"
}
# Starts pod NAME of RuntimeClass kata-pool from the spec on stdin (after its head); says
# whether it runs on a pooled VM (persist.json has the pooled VM's id).
pool_pod() { # NAME
    local persist
    { pod "$1"; cat; } | sed 's/runtimeClassName: .*/runtimeClassName: kata-pool/' | apply ||
        fail "pod $1 was not created"
    ready "$1" || fail "pod $1 did not become ready"
    persist=$(persisted_of "$1")
    [ -n "$persist" ] || fail "no persist.json names pod $1's cgroup"
    grep -q '"vm_id"' "$persist"
}
case_vm-pool() {
    local log=$LOG_DIR/cases/vm-pool.factory.log
    "$KATA_SHIM_DIR/kata-vm-factory" init --config "$POOL_CONFIG" >"$log" 2>&1 &
    # Not local: the trap runs when the case's subshell exits, after this function.
    VM_POOL_FACTORY=$!
    trap 'kill -TERM "$VM_POOL_FACTORY" 2>/dev/null; wait "$VM_POOL_FACTORY" 2>/dev/null' EXIT
    pool_ready a
    pool_pod pooled <<EOF || fail "the pod did not start on a pooled VM"
  containers:
  - name: c
    image: $IMG
    command: [sleep, "3600"]
    volumeMounts: [{name: i, mountPath: /img}]
  volumes:
  - name: i
    image: {reference: registry.k8s.io/k8s-staging-cri-tools/test-image-1:latest, pullPolicy: IfNotPresent}
EOF
    x pooled -- test -f /img/test-image-1 || fail "the image volume is not at /img on the pooled VM"
    if x pooled -- touch /img/new 2>/dev/null; then fail "the image volume is writable"; fi
    # Pod-level limits whose size is the pool's (1 CPU; (408 + 96) × 64/63 = 512 MiB) take
    # a pooled VM too, once the factory has made the next one.
    pool_ready "the next"
    pool_pod levelled <<EOF || fail "a pod with pod-level limits of the pool's size did not start on a pooled VM"
  resources: {requests: {cpu: 10m, memory: 16Mi}, limits: {cpu: "1", memory: 408Mi}}
  containers:
  - name: c
    image: $IMG
    command: [sleep, "3600"]
EOF
    eq "$(x levelled -- nproc)" 1 "vCPUs of the pooled pod limited to 1 CPU at the pod level"
    if pool_pod sized <<EOF; then fail "a pod of another size took a pooled VM"; fi
  resources: {requests: {cpu: 10m, memory: 16Mi}, limits: {cpu: "2", memory: 512Mi}}
  containers:
  - name: c
    image: $IMG
    command: [sleep, "3600"]
EOF
    eq "$(x sized -- nproc)" 2 "vCPUs of the cold-booted pod limited to 2 CPUs"
    kn delete pod pooled levelled sized --wait=true --timeout=120s >/dev/null
}

# ---- lifecycle ----

case_probes() {
    { pod web; cat <<EOF
  containers:
  - name: web
    image: $WEB
    $RES
    readinessProbe: {httpGet: {path: /, port: 80}, periodSeconds: 2}
    livenessProbe: {tcpSocket: {port: 80}, periodSeconds: 2, failureThreshold: 2}
    startupProbe: {exec: {command: [sh, -c, 'test -d /usr/share/nginx/html']}, periodSeconds: 1}
EOF
    } | apply
    ready web
    sleep 10
    eq "$(jp pod/web '{.status.containerStatuses[0].restartCount}')" 0 "restarts of a healthy container"
    eq "$(jp pod/web '{.status.containerStatuses[0].ready}')" true "readiness"
}

case_liveness-restart() {
    { pod live; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sh, -c, 'touch /tmp/ok; sleep 8; rm /tmp/ok; sleep 3600']
    livenessProbe: {exec: {command: [cat, /tmp/ok]}, initialDelaySeconds: 2, periodSeconds: 2, failureThreshold: 1}
EOF
    } | apply
    ready live
    until_ok 120 "the failing liveness probe did not restart the container" \
        sh -c "[ \"\$(kubectl -n $NS get pod live -o jsonpath='{.status.containerStatuses[0].restartCount}')\" -ge 1 ]"
    has "$(kn get events --field-selector involvedObject.name=live -o jsonpath='{.items[*].message}')" "failed liveness probe" "events"
}

case_hooks() {
    local dir=$WORK/hooks-$NS
    mkdir -p "$dir"
    { pod hooks; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sleep, "3600"]
    volumeMounts: [{name: h, mountPath: /h}]
    lifecycle:
      postStart: {exec: {command: [sh, -c, 'echo post-start >/h/post']}}
      preStop: {exec: {command: [sh, -c, 'echo pre-stop >/h/pre']}}
  volumes:
  - {name: h, hostPath: {path: $dir}}
EOF
    } | apply
    ready hooks
    eq "$(cat "$dir/post" 2>/dev/null)" post-start "the postStart hook's file"
    kn delete pod hooks --wait=true --timeout=60s >/dev/null
    eq "$(cat "$dir/pre" 2>/dev/null)" pre-stop "the preStop hook's file"
}

case_crash-restart() {
    { pod crash; cat <<EOF
  restartPolicy: Always
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sh, -c, 'echo run-at-\$(date +%s); exit 3']
EOF
    } | apply
    until_ok 180 "the crashing container was not restarted twice" \
        sh -c "[ \"\$(kubectl -n $NS get pod crash -o jsonpath='{.status.containerStatuses[0].restartCount}')\" -ge 2 ]"
    eq "$(jp pod/crash '{.status.containerStatuses[0].lastState.terminated.exitCode}')" 3 "the last exit code"
    # kubelet may be swapping the previous container for the next just then: ask again.
    until_ok 20 "logs --previous has no line of the previous run" sh -c "kubectl -n $NS logs crash --previous | grep -q run-at-"
}

case_init-sidecar() {
    { pod initpod; cat <<EOF
  initContainers:
  - name: init
    image: $IMG
    $RES
    command: [sh, -c, 'echo init-done >/w/init']
    volumeMounts: [{name: w, mountPath: /w}]
  - name: sidecar
    image: $IMG
    $RES
    restartPolicy: Always
    command: [sh, -c, 'while true; do date >/w/sidecar; sleep 1; done']
    volumeMounts: [{name: w, mountPath: /w}]
  containers:
  - name: main
    image: $IMG
    $RES
    command: [sleep, "3600"]
    volumeMounts: [{name: w, mountPath: /w}]
  volumes:
  - {name: w, emptyDir: {}}
EOF
    } | apply
    ready initpod
    eq "$(x initpod -c main -- cat /w/init)" init-done "the init container's file"
    local a b
    a=$(x initpod -c main -- cat /w/sidecar)
    sleep 3
    b=$(x initpod -c main -- cat /w/sidecar)
    [ "$a" != "$b" ] || fail "the sidecar does not run beside main (its file did not change: $a)"
    eq "$(jp pod/initpod '{.status.initContainerStatuses[1].started}')" true "the sidecar's started"
}

case_graceful-termination() {
    local dir=$WORK/term-$NS t0
    mkdir -p "$dir"
    { pod term | sed 's/terminationGracePeriodSeconds: 3/terminationGracePeriodSeconds: 60/'; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sh, -c, 'trap "echo got-term >/out/term; exit 0" TERM; echo ready >/out/ready; while true; do sleep 1; done']
    volumeMounts: [{name: o, mountPath: /out}]
  volumes:
  - {name: o, hostPath: {path: $dir}}
EOF
    } | apply
    ready term
    until_ok 30 "the container did not start its loop" test -f "$dir/ready"
    t0=$SECONDS
    kn delete pod term --wait=true --timeout=90s >/dev/null
    eq "$(cat "$dir/term" 2>/dev/null)" got-term "the container's SIGTERM handler"
    [ $((SECONDS - t0)) -lt 45 ] || fail "the pod took $((SECONDS - t0)) s to end after SIGTERM was handled (grace 60 s)"
    echo "deleted in $((SECONDS - t0)) s"
}

case_job() {
    apply <<EOF
apiVersion: batch/v1
kind: Job
metadata: {name: work}
spec:
  completions: 3
  parallelism: 2
  backoffLimit: 2
  template:
    spec:
      runtimeClassName: $RC
      restartPolicy: Never
      containers:
      - name: c
        image: $IMG
        $RES
        command: [sh, -c, 'echo job-ok']
EOF
    kn wait --for=condition=Complete job/work --timeout=400s >/dev/null || fail "the job did not complete"
    eq "$(jp job/work '{.status.succeeded}')" 3 "succeeded pods"
    has "$(kn logs job/work)" job-ok "a job pod's log"
}

case_deployment-scale() {
    apply <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: many}
spec:
  replicas: 1
  selector: {matchLabels: {app: many}}
  template:
    metadata: {labels: {app: many}}
    spec:
      runtimeClassName: $RC
      terminationGracePeriodSeconds: 2
      containers:
      - name: c
        image: $IMG
        command: [sleep, "3600"]
EOF
    kn rollout status deploy/many --timeout=300s >/dev/null || fail "one replica did not start"
    kn scale deploy/many --replicas=10 >/dev/null
    kn rollout status deploy/many --timeout=600s >/dev/null ||
        fail "10 replicas did not become ready: $(kn get pods --no-headers | awk '{print $3}' | sort | uniq -c | tr '\n' ' ')"
    kn scale deploy/many --replicas=1 >/dev/null
    until_ok 300 "scaling back to 1 left more pods" sh -c "[ \"\$(kubectl -n $NS get pods --no-headers | wc -l)\" = 1 ]"
}

# ---- tools ----

case_exec() {
    { pod ex; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sleep, "3600"]
EOF
    } | apply
    ready ex
    eq "$(echo hi | x -i ex -- sh -c 'read l; echo got:$l')" got:hi "stdin through exec -i"
    local code=0
    x ex -- sh -c 'exit 7' || code=$?
    eq "$code" 7 "exec's exit code"
    # kubectl asks for a terminal in the container only when its own stdin is one.
    has "$("$WORK/k8s-pty" 60 kubectl -n "$NS" exec -it ex -- tty)" /dev/pts/ "exec -it's terminal"
}

case_attach() {
    { pod att; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    stdin: true
    command: [sh, -c, 'while read l; do echo "echo:\$l"; done; sleep 3600']
EOF
    } | apply
    ready att
    echo hello-attach | timeout 60 kubectl -n "$NS" attach -i att >/dev/null 2>&1 || true
    until_ok 20 "the attached input did not reach the container" sh -c "kubectl -n $NS logs att | grep -q echo:hello-attach"
}

case_logs-follow() {
    { pod counter; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sh, -c, 'i=0; while true; do i=\$((i+1)); echo line-\$i; sleep 0.5; done']
EOF
    } | apply
    ready counter
    local out n1 n2
    out=$(timeout 6 kubectl -n "$NS" logs -f counter || true)
    n1=$(grep -c '^line-' <<<"$out" || true)
    [ "$n1" -ge 8 ] || fail "logs -f gave $n1 lines in 6 s"
    n2=$(timeout 6 kubectl -n "$NS" logs -f --since=1s counter | grep -c '^line-' || true)
    [ "$n2" -ge 5 ] || fail "logs -f --since=1s gave $n2 lines in 6 s"
}

case_cp() {
    { pod cp; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sleep, "3600"]
EOF
    } | apply
    ready cp
    local d=$WORK/cp-$NS
    mkdir -p "$d"
    head -c 1048576 /dev/urandom >"$d/in"
    timeout 120 kubectl cp "$d/in" "$NS/cp:/tmp/f" >/dev/null 2>&1 || fail "kubectl cp to the pod failed"
    timeout 120 kubectl cp "$NS/cp:/tmp/f" "$d/out" >/dev/null 2>&1 || fail "kubectl cp from the pod failed"
    cmp -s "$d/in" "$d/out" || fail "the file copied back differs"
}

case_port-forward() {
    { pod pf; cat <<EOF
  containers:
  - name: web
    image: $WEB
    $RES
EOF
    } | apply
    ready pf
    local out=$WORK/pf-$NS.log port pid
    kubectl -n "$NS" port-forward pod/pf :80 >"$out" 2>&1 &
    pid=$!
    until_ok 30 "port-forward did not listen" grep -q 'Forwarding from 127.0.0.1:' "$out"
    port=$(sed -n 's/^Forwarding from 127.0.0.1:\([0-9]*\).*/\1/p' "$out" | head -n 1)
    local page
    page=$(curl -fsS --max-time 30 "http://127.0.0.1:$port/") || { kill "$pid"; wait "$pid" 2>/dev/null; fail "curl through the forwarded port failed"; }
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    has "$page" "$WEB_TEXT" "the page through port-forward"
}

case_debug-ephemeral() {
    { pod dbg; cat <<EOF
  containers:
  - name: main
    image: $IMG
    $RES
    command: [sleep, "3601"]
EOF
    } | apply
    ready dbg
    timeout 120 kubectl -n "$NS" debug pod/dbg --image="$IMG" -c debugger -- sleep 3600 >/dev/null
    until_ok 180 "the ephemeral container did not run" \
        sh -c "kubectl -n $NS get pod dbg -o jsonpath='{.status.ephemeralContainerStatuses[0].state.running}' | grep -q started"
    eq "$(x dbg -c debugger -- echo from-debugger)" from-debugger "exec in the ephemeral container"
    eq "$(x dbg -c debugger -- hostname)" dbg "the pod's hostname in the ephemeral container"
}

# kubectl debug --target: the ephemeral container in the target container's PID namespace.
case_debug-target() {
    { pod dbg; cat <<EOF
  containers:
  - name: main
    image: $IMG
    $RES
    command: [sleep, "3601"]
EOF
    } | apply
    ready dbg
    timeout 120 kubectl -n "$NS" debug pod/dbg --image="$IMG" -c debugger --target=main -- sleep 3600 >/dev/null
    until_ok 180 "the ephemeral container did not run" \
        sh -c "kubectl -n $NS get pod dbg -o jsonpath='{.status.ephemeralContainerStatuses[0].state.running}' | grep -q started"
    has "$(x dbg -c debugger -- ps)" "sleep 3601" "the target's process seen from the ephemeral container"
}

# ---- resources ----

case_resources-visible() {
    { pod sized; cat <<EOF
  containers:
  - name: c
    image: $IMG
    resources: {requests: {cpu: 10m, memory: 16Mi}, limits: {cpu: "2", memory: 512Mi}}
    command: [sleep, "3600"]
EOF
    } | apply
    ready sized
    local limit
    limit=$(x sized -- sh -c 'cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes')
    eq "$limit" 536870912 "the container's memory limit"
    eq "$(x sized -- nproc)" 2 "CPUs the container sees"
    if [ "$RC" = kata ]; then
        # The VM is sized by the pod's limits: (512 + 96) MiB x 64/63, less the kernel's own.
        local total
        total=$(x sized -- awk '/^MemTotal/ {print $2}' /proc/meminfo)
        [ "$total" -gt 560000 ] && [ "$total" -lt 640000 ] || fail "MemTotal $total kB is not the size of a 512 MiB pod's VM"
    fi
}

# The CPUs a container sees: with runc, the node's; with kata, the VM's vCPUs, which the
# README's sizing rule makes the pod's CPU limits (rounded up), not Kata's 1 + limits.
case_cpu-count() {
    { pod cpus; cat <<EOF
  containers:
  - name: c
    image: $IMG
    resources: {requests: {cpu: 10m, memory: 16Mi}, limits: {cpu: "1", memory: 256Mi}}
    command: [sleep, "3600"]
EOF
    } | apply
    ready cpus
    if [ "$RC" = kata ]; then
        eq "$(x cpus -- nproc)" 1 "vCPUs of a pod limited to 1 CPU"
    else
        eq "$(x cpus -- nproc)" "$(nproc)" "CPUs a runc container sees"
    fi
}

# In-place resize (kubectl patch --subresource resize, issue 43). RuntimeClass kata-resize
# boots each VM with room for one more vCPU and 1280 MiB (pod_resize_vcpus and
# pod_resize_memory): a pod of 1 CPU / 512Mi grows to 2 CPU / 1536Mi without a restart (the
# guest brings a vCPU online, the balloon lets the memory out), shrinks back (the vCPU
# offline, the memory back to the host) and a resize past the ceiling is refused with our
# reason in the pod's PodResizeInProgress condition. runc side by side: the limits follow
# (its CPUs are the node's). The requests stay small, so kubelet finds every resize feasible.
resize_to() { # CPU MEMORY
    # A strategic merge patch (kubectl's default): a JSON merge patch would replace the
    # container list, dropping the requests, and kubelet refuses a change of QoS class.
    kn patch pod resize --subresource resize -p \
        "{\"spec\":{\"containers\":[{\"name\":\"c\",\"resources\":{\"limits\":{\"cpu\":\"$1\",\"memory\":\"$2\"}}}]}}" >/dev/null
}
memory_limit() {
    x resize -- sh -c 'cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes'
}
limit_is() { [ "$(memory_limit)" = "$1" ]; }
nproc_is() { [ "$(x resize -- nproc)" = "$1" ]; }
guest_memtotal_mib() { x resize -- awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo; }
# The pod's QEMU's resident memory on the host, MiB.
vmm_rss_mib() {
    local persist pid
    persist=$(persisted_of resize)
    pid=$(grep -o '"vmm_pid": *[0-9]*' "$persist" | grep -o '[0-9]*$')
    awk '/^VmRSS:/ { print int($2 / 1024) }' "/proc/$pid/status"
}
memtotal_below() { [ "$(guest_memtotal_mib)" -lt "$1" ]; }
rss_at_least() { [ "$(vmm_rss_mib)" -ge "$1" ]; }
# A figure of the pod's shim's /metrics (what kata-monitor serves Prometheus).
shim_metric() { # NAME
    local persist
    persist=$(persisted_of resize)
    curl -s --max-time 20 --unix-socket "$(dirname "$persist")/shim-monitor.sock" http://shim/metrics |
        awk -v n="$1" '$1 == n || index($1, n "{") == 1 { print $NF }'
}
vm_size_is() { [ "$(shim_metric kata_hypervisor_vm_vcpus) $(shim_metric kata_hypervisor_vm_memory_bytes)" = "$1 $2" ]; }
rss_fell_by() { [ $(($1 - $(vmm_rss_mib))) -ge "$2" ]; }
case_resize() {
    local rc=$RC high msg
    [ "$RC" = kata ] && rc=kata-resize
    { pod resize; cat <<EOF
  containers:
  - name: c
    image: $IMG
    resources: {requests: {cpu: 10m, memory: 16Mi}, limits: {cpu: "1", memory: 512Mi}}
    command: [sleep, "3600"]
EOF
    } | sed "s/runtimeClassName: .*/runtimeClassName: $rc/" | apply
    ready resize
    eq "$(memory_limit)" 536870912 "the container's memory limit at start"
    [ "$RC" = kata ] && eq "$(x resize -- nproc)" 1 "vCPUs at start"
    # Past the boot size (1 vCPU, 618 MiB), within the ceiling.
    resize_to 2 1536Mi
    until_ok 60 "the container's memory limit did not follow the resize to 1536Mi" limit_is 1610612736
    if [ "$RC" = kata ]; then
        until_ok 60 "the guest did not bring a second vCPU online" nproc_is 2
        msg=$(guest_memtotal_mib)
        [ "$msg" -gt 1500 ] || fail "the guest has $msg MiB after the resize to 1536Mi"
        echo "grown to 2 CPU / 1536Mi: nproc 2, MemTotal $msg MiB"
        # The VM's size as metrics report it: 2 vCPUs, (1536 + 96) × 64/63 MiB.
        vm_size_is 2 $((1658 << 20)) ||
            fail "the shim's metrics say $(shim_metric kata_hypervisor_vm_vcpus) vCPUs, $(shim_metric kata_hypervisor_vm_memory_bytes) bytes after growing"
    fi
    x resize -- dd if=/dev/zero of=/dev/null bs=1200M count=1 2>&1 ||
        fail "a process could not touch 1200 MiB after the resize"
    eq "$(jp pod/resize '{.status.containerStatuses[0].resources.limits.cpu}')" 2 "the CPU limit kubelet reports"
    eq "$(jp pod/resize '{.status.containerStatuses[0].resources.limits.memory}')" 1536Mi "the memory limit kubelet reports"
    eq "$(jp pod/resize '{.status.containerStatuses[0].restartCount}')" 0 "restarts after growing"
    if [ "$RC" = kata ]; then
        # 1200 MiB held, then let go; back at 1 CPU / 512Mi the host has the memory back.
        x resize -- sh -c '(dd if=/dev/zero bs=1200M count=1 2>/dev/null | sleep 3600) >/dev/null 2>&1 &'
        until_ok 60 "the VMM never held the 1200 MiB" rss_at_least 1200
        high=$(vmm_rss_mib)
        x resize -- sh -c 'kill $(pidof dd)'
    fi
    resize_to 1 512Mi
    until_ok 60 "the container's memory limit did not follow the resize back to 512Mi" limit_is 536870912
    if [ "$RC" = kata ]; then
        until_ok 60 "the guest did not take its second vCPU offline" nproc_is 1
        vm_size_is 1 $((618 << 20)) ||
            fail "the shim's metrics say $(shim_metric kata_hypervisor_vm_vcpus) vCPUs, $(shim_metric kata_hypervisor_vm_memory_bytes) bytes after shrinking"
        # The guest fills the balloon as it frees memory: a few seconds under TCG.
        until_ok 60 "the guest still has $(guest_memtotal_mib) MiB after the resize back to 512Mi" \
            memtotal_below 700
        until_ok 60 "the VMM's memory did not fall by 500 MiB from $high MiB" rss_fell_by "$high" 500
        echo "back at 1 CPU / 512Mi: nproc 1, MemTotal $(guest_memtotal_mib) MiB"
        echo "VMM RSS: $high MiB holding 1200 MiB at 2 CPU / 1536Mi, $(vmm_rss_mib) MiB back at 1 CPU / 512Mi"
        # Past the ceiling (2 vCPUs): 3 CPUs.
        resize_to 3 512Mi
        for _ in $(seq 60); do
            msg=$(jp pod/resize '{.status.conditions[?(@.type=="PodResizeInProgress")].message}')
            [[ "$msg" == *"pod_resize_vcpus"* ]] && break
            sleep 1
        done
        echo "PodResizeInProgress: $msg"
        [[ "$msg" == *"asks for 3 CPU / 512 MiB"*"can grow to at most 2 vCPUs"*"pod_resize_vcpus"* ]] ||
            fail "the resize past the ceiling is not reported with our reason: '$msg'"
        eq "$(x resize -- nproc)" 1 "vCPUs after a refused resize"
    fi
    eq "$(jp pod/resize '{.status.containerStatuses[0].restartCount}')" 0 "restarts"
}

# Pod-level resources (KEP-2837, beta and on by default since 1.34): limits on the pod
# alone, none on its container. kata sizes the VM by them as by containers' limits.
case_pod-level-resources() {
    { pod podres; cat <<EOF
  resources: {requests: {cpu: 10m, memory: 16Mi}, limits: {cpu: "2", memory: 512Mi}}
  containers:
  - name: c
    image: $IMG
    command: [sleep, "3600"]
EOF
    } | apply
    ready podres
    eq "$(jp pod/podres '{.spec.resources.limits.memory}')" 512Mi "the pod's own limits as the API server kept them"
    if [ "$RC" = kata ]; then
        eq "$(x podres -- nproc)" 2 "vCPUs of a pod limited to 2 CPUs at the pod level"
        local total
        total=$(x podres -- awk '/^MemTotal/ {print $2}' /proc/meminfo)
        [ "$total" -gt 560000 ] && [ "$total" -lt 640000 ] || fail "MemTotal $total kB is not the size of a 512 MiB pod's VM"
    else
        eq "$(x podres -- nproc)" "$(nproc)" "CPUs a runc container sees"
    fi
}

case_qos-classes() {
    { pod guaranteed; cat <<EOF
  containers:
  - name: c
    image: $IMG
    resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {cpu: 50m, memory: 64Mi}}
    command: [sleep, "3600"]
---
EOF
      pod burstable; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sleep, "3600"]
---
EOF
      pod besteffort; cat <<EOF
  containers:
  - name: c
    image: $IMG
    command: [sleep, "3600"]
EOF
    } | apply
    local p
    for p in guaranteed burstable besteffort; do ready "$p"; done
    eq "$(jp pod/guaranteed '{.status.qosClass}')" Guaranteed "QoS class"
    eq "$(jp pod/burstable '{.status.qosClass}')" Burstable "QoS class"
    eq "$(jp pod/besteffort '{.status.qosClass}')" BestEffort "QoS class"
}

case_oom-killed() {
    { pod oom; cat <<EOF
  restartPolicy: Never
  containers:
  - name: c
    image: $IMG
    resources: {requests: {cpu: 10m, memory: 64Mi}, limits: {memory: 64Mi}}
    command: [sh, -c, 'sleep 2; tail /dev/zero']
EOF
    } | apply
    until_ok 180 "the container was not OOM-killed" \
        sh -c "kubectl -n $NS get pod oom -o jsonpath='{.status.containerStatuses[0].state.terminated.reason}' | grep -q ."
    eq "$(jp pod/oom '{.status.containerStatuses[0].state.terminated.reason}')" OOMKilled "the termination reason"
}

# A RuntimeClass whose overhead is far below what the VM costs: kubelet's pod cgroup
# (the containers' limits plus the overhead) cannot hold the VMM once the guest fills its
# memory, and the host kernel's OOM killer ends it. The container must end OOMKilled with
# a message that names the cgroup, its limit and the overhead to set, not a bare 255.
case_vm-oom-reason() {
    [ "$RC" = kata ] || skip "runc has no VM: the pod cgroup holds only the containers"
    local rc=kata-tight-${NS#t-}
    rc=${rc:0:63}
    kubectl apply -f - >/dev/null <<EOF
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: $rc}
handler: kata
overhead: {podFixed: {memory: 8Mi, cpu: 10m}}
EOF
    trap 'kubectl delete runtimeclass "'"$rc"'" --wait=false >/dev/null 2>&1' EXIT
    { pod tight | sed "s/runtimeClassName: kata/runtimeClassName: $rc/"; cat <<EOF
  restartPolicy: Never
  containers:
  - name: hog
    image: $IMG
    resources: {requests: {cpu: 10m, memory: 256Mi}, limits: {memory: 256Mi}}
    command: [sh, -c, 'sleep 3; dd if=/dev/zero of=/dev/null bs=200M count=1; sleep 100000']
EOF
    } | apply
    local q='{.status.containerStatuses[0].state.terminated}'
    until_ok 240 "the hog's VM was not ended by the host's OOM killer" \
        sh -c "kubectl -n $NS get pod tight -o jsonpath='$q' | grep -q reason"
    echo "terminated: $(jp pod/tight "$q")"
    eq "$(jp pod/tight '{.status.containerStatuses[0].state.terminated.reason}')" OOMKilled "the termination reason"
    eq "$(jp pod/tight '{.status.containerStatuses[0].state.terminated.exitCode}')" 137 "the exit code"
    local msg
    msg=$(jp pod/tight '{.status.containerStatuses[0].state.terminated.message}')
    has "$msg" "is too small for its VM" "the message kubelet shows"
    has "$msg" "overhead.podFixed.memory" "the message kubelet shows"
}

# kubelet's Summary API (what kubectl top, metrics-server and the HPA read).
case_summary-api() {
    { pod stats; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sh, -c, 'while true; do i=0; while [ \$i -lt 2000 ]; do i=\$((i+1)); done; sleep 1; done']
EOF
    } | apply
    ready stats
    local q=".pods[] | select(.podRef.name == \"stats\" and .podRef.namespace == \"$NS\")"
    summary() { kubectl get --raw "/api/v1/nodes/$NODE/proxy/stats/summary"; }
    until_ok 120 "the Summary API has no CPU and memory of the pod and its container" sh -c \
        "kubectl get --raw /api/v1/nodes/$NODE/proxy/stats/summary | jq -e '$q | (.cpu.usageNanoCores > 0) and (.memory.workingSetBytes > 0) and ((.containers[] | select(.name == \"c\") | (.cpu.usageNanoCores > 0) and (.memory.workingSetBytes > 0)))'"
    echo "pod stats: $(summary | jq -c "$q | {cpu: .cpu.usageNanoCores, mem: .memory.workingSetBytes, c: [.containers[] | {cpu: .cpu.usageNanoCores, mem: .memory.workingSetBytes}]}")"
}

# ---- network ----

web_and_client() {
    { pod web; cat <<EOF
  containers:
  - name: web
    image: $WEB
    $RES
    ports: [{containerPort: 80}]
    readinessProbe: {httpGet: {path: /, port: 80}, periodSeconds: 2}
---
EOF
      pod client; cat <<EOF
  containers:
  - name: c
    image: $TOOLS
    $RES
    command: [sleep, "3600"]
EOF
    } | apply
    ready web
    ready client
}

case_pod-to-pod() {
    web_and_client
    local ip
    ip=$(jp pod/web '{.status.podIP}')
    has "$(x client -- timeout 20 wget -qO- "http://$ip/")" "$WEB_TEXT" "a page from the other pod"
}

case_service-dns() {
    web_and_client
    kn expose pod web --name=web --port=80 >/dev/null
    has "$(x client -- nslookup "web.$NS.svc.cluster.local")" "$(jp svc/web '{.spec.clusterIP}')" "the service's DNS name"
    until_ok 30 "the ClusterIP service did not answer" x client -- timeout 10 wget -qO- "http://web.$NS.svc.cluster.local/"
    has "$(x client -- timeout 10 wget -qO- http://web/)" "$WEB_TEXT" "a page through the service's short name"
}

case_node-port() {
    web_and_client
    kn expose pod web --name=web --port=80 --type=NodePort >/dev/null
    local port
    port=$(jp svc/web '{.spec.ports[0].nodePort}')
    until_ok 30 "the NodePort $NODE_IP:$port did not answer" curl -fsS --max-time 10 "http://$NODE_IP:$port/"
    has "$(curl -fsS --max-time 10 "http://$NODE_IP:$port/")" "$WEB_TEXT" "a page through the NodePort"
}

# ---- security ----

case_run-as-ids() {
    { pod ids; cat <<EOF
  securityContext: {runAsUser: 1001, runAsGroup: 2002, fsGroup: 3003, supplementalGroups: [4004]}
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sleep, "3600"]
    volumeMounts: [{name: d, mountPath: /data}]
  volumes:
  - {name: d, emptyDir: {}}
EOF
    } | apply
    ready ids
    local id
    id=$(x ids -- id)
    has "$id" "uid=1001" "id"
    has "$id" "gid=2002" "id"
    has "$id" "3003" "id (fsGroup)"
    has "$id" "4004" "id (supplementalGroups)"
    eq "$(x ids -- stat -c %g /data)" 3003 "the emptyDir's group"
    x ids -- sh -c 'echo x >/data/f'
    eq "$(x ids -- stat -c %u:%g /data/f)" 1001:3003 "a new file's owner on the emptyDir"
}

# hostUsers: false. The pod's root is an unprivileged uid of the node (uid_map is kubelet's
# range, not the identity), and its root filesystem and volumes are ID-mapped mounts, as
# kubelet asks in every mount's uidMappings: files owned by root on the node are root's in
# the pod, and what the pod's root (or uid 1000) writes on a hostPath is owned on the node
# by uid 0 (or 1000), the container's uid mapped back through the mount.
case_user-namespaces() {
    local handler supported
    handler=$(kubectl get runtimeclass "$RC" -o jsonpath='{.handler}')
    supported=$(kubectl get node "$NODE" -o jsonpath="{.status.runtimeHandlers[?(@.name==\"$handler\")].features.userNamespaces}")
    if [ "$supported" != true ]; then
        [ "$RC" != kata ] || fail "node's runtimeHandlers: $handler has userNamespaces '$supported', expected true"
        skip "containerd reports no user namespaces for handler $handler on this host (Debian's runc 1.1.5 has no ID-mapped mounts)"
    fi
    local dir=$WORK/userns-$NS
    mkdir -p "$dir/open"
    chmod 0755 "$dir"
    chmod 0777 "$dir/open"
    echo from-host >"$dir/in"
    { pod un; cat <<EOF
  hostUsers: false
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sleep, "3600"]
    volumeMounts: [{name: h, mountPath: /h}]
  - name: u
    image: $IMG
    $RES
    command: [sleep, "3600"]
    securityContext: {runAsUser: 1000, runAsGroup: 1000}
    volumeMounts: [{name: h, mountPath: /h}]
  volumes:
  - {name: h, hostPath: {path: $dir, type: Directory}}
EOF
    } | apply
    ready un
    local map inside outside length
    map=$(x un -c c -- cat /proc/self/uid_map)
    read -r inside outside length <<<"$map"
    eq "$inside" 0 "uid_map's first container uid"
    [ "$outside" -gt 0 ] && [ "$length" -lt 4294967295 ] ||
        fail "uid_map: expected kubelet's range, got '$map'"
    eq "$(x un -c c -- cat /proc/self/gid_map | awk '{print $2}')" "$outside" "gid_map's host gid"
    eq "$(x un -c c -- stat -c %u:%g /h/in /bin/sh | tr '\n' ' ')" "0:0 0:0 " \
        "owners in the pod of a root-owned host file and of the image's /bin/sh"
    x un -c c -- sh -c 'echo from-root >/h/root-out && echo x >/etc/written-by-root'
    eq "$(stat -c %u:%g "$dir/root-out")" 0:0 "owner on the node of the pod's root's file"
    x un -c u -- sh -c 'echo from-1000 >/h/open/user-out'
    eq "$(stat -c %u:%g "$dir/open/user-out")" 1000:1000 "owner on the node of uid 1000's file"
    # The pod's root is not the node's: a host file of an owner outside the mapping is
    # nobody's in the pod, and its root cannot write it.
    # (The guest caches the file's attributes for a moment, as the hostpath case's.)
    chown 70000:70000 "$dir/in"
    until_ok 10 "a host file of an owner outside the mapping is not nobody's in the pod" \
        sh -c "[ \"\$(timeout 60 kubectl -n $NS exec un -c c -- stat -c %u /h/in)\" = 65534 ]"
    if x un -c c -- sh -c 'echo x >>/h/in' 2>/dev/null; then
        fail "the pod's root wrote a host file of an owner outside its mapping"
    fi
}

case_readonly-rootfs() {
    { pod ro; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    securityContext: {readOnlyRootFilesystem: true}
    command: [sleep, "3600"]
    volumeMounts: [{name: t, mountPath: /tmp}]
  volumes:
  - {name: t, emptyDir: {}}
EOF
    } | apply
    ready ro
    if x ro -- touch /file 2>/dev/null; then fail "the read-only root file system took a write"; fi
    x ro -- touch /tmp/file || fail "the emptyDir on a read-only root is not writable"
}

case_capabilities() {
    { pod caps; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    securityContext: {capabilities: {drop: [ALL], add: [NET_ADMIN]}}
    command: [sleep, "3600"]
EOF
    } | apply
    ready caps
    eq "$(x caps -- awk '/^CapEff/ {print $2}' /proc/1/status)" 0000000000001000 "CapEff with only NET_ADMIN"
}

case_seccomp() {
    { pod sec; cat <<EOF
  securityContext: {seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sleep, "3600"]
EOF
    } | apply
    ready sec
    eq "$(x sec -- awk '/^Seccomp:/ {print $2}' /proc/1/status)" 2 "seccomp mode (filter)"
}

case_sysctls() {
    { pod sysctl; cat <<EOF
  securityContext: {sysctls: [{name: kernel.shm_rmid_forced, value: "1"}, {name: net.ipv4.ip_unprivileged_port_start, value: "100"}]}
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sleep, "3600"]
EOF
    } | apply
    ready sysctl
    eq "$(x sysctl -- cat /proc/sys/kernel/shm_rmid_forced)" 1 "kernel.shm_rmid_forced"
    eq "$(x sysctl -- cat /proc/sys/net/ipv4/ip_unprivileged_port_start)" 100 "net.ipv4.ip_unprivileged_port_start"
}

case_share-process-namespace() {
    { pod pidns; cat <<EOF
  shareProcessNamespace: true
  containers:
  - name: a
    image: $IMG
    $RES
    command: [sleep, "3601"]
  - name: b
    image: $IMG
    $RES
    command: [sleep, "3600"]
EOF
    } | apply
    ready pidns
    has "$(x pidns -c b -- ps)" "sleep 3601" "the other container's process"
}

# ---- node events (run alone) ----

running_pod() {
    { pod keep; cat <<EOF
  containers:
  - name: c
    image: $IMG
    $RES
    command: [sh, -c, 'i=0; while true; do i=\$((i+1)); echo tick-\$i; sleep 1; done']
EOF
    } | apply
    ready keep
    BEFORE_ID=$(jp pod/keep '{.status.containerStatuses[0].containerID}')
}

still_running() {
    ready keep 120s || fail "the pod is not ready after the restart"
    eq "$(jp pod/keep '{.status.containerStatuses[0].containerID}')" "$BEFORE_ID" "the container (not restarted)"
    eq "$(jp pod/keep '{.status.containerStatuses[0].restartCount}')" 0 "restarts"
    # kubelet learns the pods again from the CRI within a few seconds of its or
    # containerd's restart; until then it answers "pod does not exist".
    until_ok 60 "exec after the restart" sh -c "[ \"\$(timeout 60 kubectl -n $NS exec keep -- echo alive)\" = alive ]"
    until_ok 30 "logs after the restart" sh -c "kubectl -n $NS logs --tail=5 keep | grep -q tick-"
    # New lines, written after the restart, reach the log too.
    local last
    last=$(kn logs --tail=1 keep)
    until_ok 30 "no new log line after the restart (last: $last)" sh -c "[ \"\$(kubectl -n $NS logs --tail=1 keep)\" != '$last' ]"
    until_ok 90 "no stats of the pod after the restart" sh -c \
        "kubectl get --raw /api/v1/nodes/$NODE/proxy/stats/summary | jq -e '.pods[] | select(.podRef.name == \"keep\" and .podRef.namespace == \"$NS\") | .memory.workingSetBytes > 0'"
}

case_kubelet-restart() {
    running_pod
    stop_proc kubelet 30
    sleep 3
    start_kubelet
    until_ok 120 "the node is not Ready after kubelet's restart" kubectl wait "node/$NODE" --for=condition=Ready --timeout=1s
    still_running
}

case_containerd-restart() {
    running_pod
    local pid
    pid=$(cat "$CD_DIR/containerd.pid")
    kill -KILL "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    sleep 2
    start_containerd
    until_ok 120 "the node is not Ready after containerd's restart" kubectl wait "node/$NODE" --for=condition=Ready --timeout=1s
    still_running
    pid=$(cat "$CD_DIR/containerd.pid")
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    start_containerd
    until_ok 120 "the node is not Ready after containerd's second restart" kubectl wait "node/$NODE" --for=condition=Ready --timeout=1s
    still_running
}

# ---- the runner ----

# The cases running now (their subshells' pids): what an interrupted run ends first.
running=()

# Runs case NAME with RuntimeClass RC; writes RESULT (PASS, FAIL, SKIP) and its seconds.
run_one() { # NAME RC
    local name=$1 rc=$2 ns log status t0
    # A job of its own (a background subshell): a failing step here is recorded, not fatal.
    set +e
    ns=t-$name-$rc
    ns=${ns:0:63}
    log=$LOG_DIR/cases/$name.$rc.log
    t0=$SECONDS
    {
        kubectl create ns "$ns" >/dev/null &&
            until_ok_plain 60 kubectl -n "$ns" get sa default
    } >"$log" 2>&1 || { echo "FAIL 0" >"$LOG_DIR/cases/$name.$rc.result"; return 0; }
    (
        set -euo pipefail
        NS=$ns RC=$rc
        "case_$name"
    ) >>"$log" 2>&1 &
    # A case that hangs (a stuck stream, a tool waiting for input) fails alone, ended by pid
    # with what it started, instead of holding the run until CI's deadline.
    local pid=$! limit=${K8S_CASE_LIMIT:-900} timed_out=0
    mkdir -p "$WORK/case-pids"
    echo "$pid" >"$WORK/case-pids/$name.$rc"
    while kill -0 "$pid" 2>/dev/null; do
        if [ $((SECONDS - t0)) -ge "$limit" ]; then
            echo "FAIL: the case did not end within $limit s (K8S_CASE_LIMIT): ended it" >>"$log"
            kill_tree "$pid"
            timed_out=1
            break
        fi
        sleep 1
    done
    wait "$pid"
    status=$?
    [ $timed_out = 0 ] || status=1
    rm -f "$WORK/case-pids/$name.$rc"
    local result=PASS
    case $status in 0) ;; 77) result=SKIP ;; *) result=FAIL ;; esac
    if [ $result = FAIL ]; then
        {
            echo "---- pods"
            kubectl -n "$ns" get pods -o wide
            echo "---- describe"
            kubectl -n "$ns" describe pods
            echo "---- events"
            kubectl -n "$ns" get events --sort-by=.lastTimestamp
        } >>"$log" 2>&1
    fi
    kubectl delete ns "$ns" --wait=false >/dev/null 2>&1
    echo "$result $((SECONDS - t0))" >"$LOG_DIR/cases/$name.$rc.result"
}
until_ok_plain() { # SECONDS CMD...
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || return 1
        sleep 1
    done
}

run_suite() {
    local selected=() serial=() c rc pending=0 t0=$SECONDS
    mkdir -p "$LOG_DIR/cases"
    for c in "${CASES[@]}"; do
        [ -z "${K8S_CASES:-}" ] || [[ " $K8S_CASES " == *" $c "* ]] && selected+=("$c")
    done
    for c in "${SERIAL_CASES[@]}"; do
        [ -z "${K8S_CASES:-}" ] || [[ " $K8S_CASES " == *" $c "* ]] && serial+=("$c")
    done
    local node_cases=()
    for c in "${NODE_CASES[@]}"; do
        [[ " $RUNTIMES " == *" kata "* ]] || break
        [ -z "${K8S_CASES:-}" ] || [[ " $K8S_CASES " == *" $c "* ]] && node_cases+=("$c")
    done
    log "running ${#selected[@]} cases ($JOBS at a time), ${#serial[@]} node-wide ones with: $RUNTIMES; then ${#node_cases[@]} with kata alone"
    # The node's processes are jobs of this shell too: count and wait for the cases' own.
    local p alive
    running=()
    for c in "${selected[@]}"; do
        for rc in $RUNTIMES; do
            while :; do
                alive=()
                for p in "${running[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
                running=("${alive[@]}")
                [ ${#running[@]} -lt "$JOBS" ] && break
                sleep 1
            done
            run_one "$c" "$rc" &
            running+=($!)
        done
    done
    for p in "${running[@]}"; do wait "$p" || true; done
    for c in "${serial[@]}"; do
        for rc in $RUNTIMES; do run_one "$c" "$rc"; done
    done
    for c in "${node_cases[@]}"; do run_one "$c" kata; done
    report "$((SECONDS - t0))"
}

report() { # SECONDS
    local c rc r passed=0 failed=0 skipped=0 unexpected=() broken=() line
    declare -A REASON=()
    while IFS= read -r line; do
        case "$line" in '' | '#'*) continue ;; esac
        REASON[${line%%[[:space:]]*}]=$(sed 's/^[^#]*#[[:space:]]*//' <<<"$line")
    done <"$EXPECTED"
    echo
    echo "==== Kubernetes suite: $(kubelet --version) on $(containerd --version | awk '{print $1, $3}'), $1 s ===="
    printf '%-26s %-12s %-12s\n' case runc kata
    for c in "${CASES[@]}" "${SERIAL_CASES[@]}" "${NODE_CASES[@]}"; do
        [ -f "$LOG_DIR/cases/$c.${RUNTIMES%% *}.result" ] || [ -f "$LOG_DIR/cases/$c.kata.result" ] || continue
        declare -A R=()
        for rc in runc kata; do
            r=$(cat "$LOG_DIR/cases/$c.$rc.result" 2>/dev/null || echo "- 0")
            R[$rc]=${r% *}
            printf -v "cell_$rc" '%s' "${r% *} (${r#* }s)"
            case ${r% *} in PASS) passed=$((passed + 1)) ;; FAIL) failed=$((failed + 1)) ;; SKIP) skipped=$((skipped + 1)) ;; esac
        done
        local note=
        if [[ " ${NODE_CASES[*]} " == *" $c "* ]]; then
            [ "${R[kata]}" != FAIL ] || { unexpected+=("$c"); note="FAILED (kata alone)"; }
        elif [ "${R[kata]}" = FAIL ] && [ "${R[runc]}" != FAIL ]; then
            if [ -n "${REASON[$c]:-}" ]; then note="expected: ${REASON[$c]}"; else unexpected+=("$c"); note="KATA-ONLY FAILURE"; fi
        fi
        [ "${R[runc]}" = FAIL ] && { broken+=("$c"); note="fails with runc"; }
        printf '%-26s %-12s %-12s %s\n' "$c" "$cell_runc" "$cell_kata" "$note"
    done
    local failing
    for failing in "${unexpected[@]}" "${broken[@]}"; do
        for rc in kata runc; do
            [ "$(cut -d' ' -f1 "$LOG_DIR/cases/$failing.$rc.result" 2>/dev/null)" = FAIL ] || continue
            echo "-- $failing [$rc]: $(grep -m1 -E '^(FAIL|error|Error)' "$LOG_DIR/cases/$failing.$rc.log" | cut -c1-400)"
        done
    done
    echo "logs: $LOG_DIR/cases/"
    echo "k8s: $passed passed, $failed failed, $skipped skipped"
    [ ${#unexpected[@]} -eq 0 ] && [ ${#broken[@]} -eq 0 ]
}

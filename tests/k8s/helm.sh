# The Helm chart's test (deploy/helm/kata-deploy/), sourced by scripts/k8s-suite.sh and run
# after the cases (case name helm-install in K8S_CASES), alone: it changes the node.
#
# From a node without our runtime (containerd restarted without the kata runtimes, the
# suite's RuntimeClasses deleted), as a cluster operator would:
#   helm install    -> the installer pod runs, the node is labelled, a pod with
#                      runtimeClassName kata runs in a VM (its kernel is the guest's);
#                      the time from `helm install` to that pod Ready is reported;
#   helm upgrade    -> a new image tag: the installer pod is replaced, the kata pod keeps
#                      running (same container, no restart, exec works);
#   helm uninstall  -> no kata pod or installer pod left, containerd's configuration byte
#                      for byte as before the install, nothing under the prefix, no label,
#                      no RuntimeClass.
# The installer restarts containerd through the chart's containerd.restartCommand: here a
# script that asks this suite (a request file in $WORK) and waits for its answer, so that
# the suite restarts containerd itself and keeps tracking its pid.
# Cost: about a minute (43-63 s measured on the 2-CPU machine, 13-28 s of it building and
# pushing the image; two containerd restarts, one VM).

HELM_RELEASE=kata-deploy
HELM_NS=kube-system
HELM_LABEL=katacontainers.io/kata-runtime
HELM_CHART=$repo/deploy/helm/kata-deploy

# Restarts containerd when the installer asked (the request file holds an id; the answer
# file gets it back once containerd answers again).
serve_restart() {
    local req=$WORK/containerd-restart.request id pid
    [ -f "$req" ] || return 0
    id=$(cat "$req")
    rm -f "$req"
    pid=$(cat "$CD_DIR/containerd.pid")
    echo "restarting containerd (pid $pid) for the installer"
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    CONTAINERD_KEEP_CONFIG=1 start_containerd
    RESTARTS=$((RESTARTS + 1))
    echo "$id" >"$WORK/containerd-restart.done"
}

# Runs CMD... every second until it succeeds, serving containerd restarts meanwhile.
until_served() { # SECONDS WHAT CMD...
    local secs=$1 deadline=$((SECONDS + $1)) what=$2
    shift 2
    until "$@" >/dev/null 2>&1; do
        serve_restart
        [ $SECONDS -lt $deadline ] || fail "$what (after $secs s)"
        sleep 1
    done
}

helm_kata_pod() { # NAME
    kubectl -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  runtimeClassName: kata
  terminationGracePeriodSeconds: 3
  containers:
  - name: c
    image: $IMG
    resources: {requests: {cpu: 10m, memory: 16Mi}}
    command: [sh, -c, 'i=0; while true; do i=\$((i+1)); echo tick-\$i; sleep 1; done']
EOF
}

helm_labelled() { kubectl get nodes -l "$HELM_LABEL=true" -o name | grep -qxF "node/$NODE"; }
helm_installer_ready() {
    [ "$(kubectl -n "$HELM_NS" get pods -l app.kubernetes.io/name=kata-deploy \
        -o jsonpath='{range .items[*]}{.spec.containers[0].image} {.status.containerStatuses[0].ready}{"\n"}{end}')" = "$1 true" ]
}
helm_no_pods() { # SELECTOR-ARGS...
    [ -z "$(kubectl get pods "$@" --no-headers 2>/dev/null)" ]
}
helm_no_kata_pods() {
    [ -z "$(kubectl get pods -A -o jsonpath='{range .items[?(@.spec.runtimeClassName=="kata")]}{.metadata.name}{"\n"}{end}')" ]
}

case_helm-install() {
    local helm=$K8S_BIN/helm prefix=$WORK/opt-kata img before t0 t_ready guest uninstall_pid id
    local repo_img=registry.k8s.io/kata-k8s/kata-deploy
    RESTARTS=0
    # ---- a node without our runtime ----
    until_ok 180 "kata pods of the cases are still there" helm_no_kata_pods
    kubectl delete runtimeclass kata kata-builtin --ignore-not-found >/dev/null
    pid=$(cat "$CD_DIR/containerd.pid")
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    # As on a node: the installed shims find their configuration by their names among the
    # prefix's defaults, not through the suite's $KATA_CONF_FILE (unset for every
    # containerd from here on; the case is the suite's last).
    unset KATA_CONF_FILE
    KATA_SNIPPET=none start_containerd
    until_ok 120 "the node is not Ready after containerd's restart without kata" kubectl wait "node/$NODE" --for=condition=Ready --timeout=1s
    grep -q 'runtimes\.kata' "$CD_DIR/config.toml" && fail "containerd's configuration still names the kata runtime"
    cp "$CD_DIR/config.toml" "$WORK/containerd-config.before"
    # The restart command the chart runs on the node (chroot into its root).
    cat >"$WORK/restart-containerd.sh" <<EOF
#!/bin/sh
# Asks scripts/k8s-suite.sh to restart containerd and waits until it has.
id=\$\$-\$(date +%s%N)
echo "\$id" >"$WORK/containerd-restart.request.tmp"
mv -f "$WORK/containerd-restart.request.tmp" "$WORK/containerd-restart.request"
i=0
until [ "\$(cat "$WORK/containerd-restart.done" 2>/dev/null)" = "\$id" ]; do
    i=\$((i + 1)); [ \$i -lt 1200 ] || { echo "the suite did not restart containerd within 120 s" >&2; exit 1; }
    sleep 0.1
done
EOF

    # ---- the installer image, as tags 1 and 2 ----
    t0=$SECONDS
    img=$WORK/kata-deploy.tar
    # As `make kata-deploy-image` builds it: on the project's busybox image.
    KUBECTL=$K8S_BIN/kubectl bash "$repo/scripts/kata-deploy-image.sh" "$KATA_IMAGE" \
        "$img" "$repo_img:1" || fail "building the installer image failed"
    push "$registry" kata-k8s/kata-deploy:1 "$img"
    push "$registry" kata-k8s/kata-deploy:2 "$img"
    rm -rf "$WORK/push" "$img"
    echo "installer image built and pushed in $((SECONDS - t0)) s"

    # ---- helm install ----
    local values=(--set "image.repository=$repo_img" --set "prefix=$prefix"
        --set "containerd.configPath=$CD_DIR/config.toml"
        --set "containerd.restartCommand=sh $WORK/restart-containerd.sh")
    t0=$SECONDS
    "$helm" install "$HELM_RELEASE" "$HELM_CHART" -n "$HELM_NS" "${values[@]}" --set image.tag=1 ||
        fail "helm install failed"
    until_served 300 "the installer pod did not become ready" helm_installer_ready "$repo_img:1"
    helm_labelled || fail "the node is not labelled $HELM_LABEL=true"
    echo "installed: node labelled after $((SECONDS - t0)) s, containerd restarted $RESTARTS time(s)"
    [ "$RESTARTS" = 1 ] || fail "containerd restarts for the install: expected 1, got $RESTARTS"
    grep -qF "$prefix/containerd/kata-deploy.toml" "$CD_DIR/config.toml" ||
        fail "containerd's configuration does not import the installer's drop-in"
    for rc in kata kata-builtin; do
        kubectl get runtimeclass "$rc" >/dev/null || fail "no RuntimeClass $rc"
    done
    helm_kata_pod keep
    until_served 300 "the kata pod did not become ready" \
        kubectl -n "$NS" wait --for=condition=Ready pod/keep --timeout=1s
    t_ready=$((SECONDS - t0))
    guest=$(strings "$KATA_KERNEL" | sed -n 's/^Linux version \([^ ]*\).*/\1/p' | head -n 1)
    eq "$(x keep -- uname -r)" "$guest" "the kata pod's kernel (the guest's)"
    # The installed runtime entry has no options table, so containerd 2.3 offers user
    # namespaces for it (kubelet reads that from the node's status).
    until_ok 60 "the node does not report user namespaces for the installed kata runtime" sh -c \
        "kubectl get node $NODE -o jsonpath='{.status.runtimeHandlers[?(@.name==\"kata\")].features.userNamespaces}' | grep -qx true"
    echo "TIME helm install -> first kata pod Ready: $t_ready s"
    echo "$t_ready" >"$LOG_DIR/helm-install-seconds"
    BEFORE_ID=$(jp pod/keep '{.status.containerStatuses[0].containerID}')

    # ---- helm upgrade: a new image ----
    t0=$SECONDS
    "$helm" upgrade "$HELM_RELEASE" "$HELM_CHART" -n "$HELM_NS" "${values[@]}" --set image.tag=2 ||
        fail "helm upgrade failed"
    until_served 300 "the upgraded installer pod did not become ready" helm_installer_ready "$repo_img:2"
    echo "upgraded in $((SECONDS - t0)) s"
    [ "$RESTARTS" = 1 ] || fail "the upgrade (same payload) restarted containerd"
    helm_labelled || fail "the node lost its label in the upgrade"
    eq "$(jp pod/keep '{.status.containerStatuses[0].containerID}')" "$BEFORE_ID" "the kata container after the upgrade (not restarted)"
    eq "$(jp pod/keep '{.status.containerStatuses[0].restartCount}')" 0 "restarts of the kata pod"
    eq "$(x keep -- echo alive)" alive "exec in the kata pod after the upgrade"

    # ---- helm uninstall ----
    kubectl -n "$NS" delete pod keep --wait=false >/dev/null
    until_ok 120 "the kata pod was not removed" helm_no_kata_pods
    t0=$SECONDS
    # helm waits for its pre-delete hook, whose installer pods need containerd restarted:
    # in the background, its pid where the suite's clean-up ends it.
    "$helm" uninstall "$HELM_RELEASE" -n "$HELM_NS" --timeout 10m &
    uninstall_pid=$!
    echo "$uninstall_pid" >"$WORK/case-pids/helm-uninstall"
    until_served 600 "helm uninstall did not end" sh -c "! kill -0 $uninstall_pid"
    wait "$uninstall_pid" || fail "helm uninstall failed"
    rm -f "$WORK/case-pids/helm-uninstall"
    echo "uninstalled in $((SECONDS - t0)) s, containerd restarted $RESTARTS time(s) in all"
    [ "$RESTARTS" = 2 ] || fail "containerd restarts: expected 2 (install, uninstall), got $RESTARTS"
    until_ok 120 "pods of the chart are left" helm_no_pods -n "$HELM_NS" -l "app.kubernetes.io/instance=$HELM_RELEASE"
    until_ok 120 "installer pods are left" helm_no_pods -n "$HELM_NS" -l "app.kubernetes.io/name=kata-deploy"
    helm_no_kata_pods || fail "kata pods are left"
    cmp "$WORK/containerd-config.before" "$CD_DIR/config.toml" ||
        fail "containerd's configuration differs from before the install: $(diff "$WORK/containerd-config.before" "$CD_DIR/config.toml" | head -c 600)"
    [ ! -e "$prefix" ] || fail "left under the prefix: $(find "$prefix" | head -n 20 | tr '\n' ' ')"
    helm_labelled && fail "the node still has the label $HELM_LABEL"
    for rc in kata kata-builtin; do
        kubectl get runtimeclass "$rc" >/dev/null 2>&1 && fail "the RuntimeClass $rc is left"
    done
    [ -z "$("$helm" list -n "$HELM_NS" -q)" ] || fail "helm still lists a release"
    echo "the node is as before the install"
}

# Kata-style VM sandbox runtime. `make demo` and `make test` set up everything they need
# on a Debian bookworm host (as root); caches live outside the repo.

SHELL := /bin/bash
CARGO ?= cargo
TARGET := x86_64-unknown-linux-gnu
AGENT_BIN := target/$(TARGET)/agent/kata-agent
SHIM_BIN := target/release/containerd-shim-kata-v2
VSOCK_BIN := target/release/kata-vsock
VMM_BIN := target/release/kata-vmm
RUNTIME_BIN := target/release/kata-runtime
FACTORY_BIN := target/release/kata-vm-factory
MONITOR_BIN := target/release/kata-monitor
GUEST_CACHE ?= /var/cache/kata-guest
INITRD := $(GUEST_CACHE)/kata-initrd.img
# The same with a shell (busybox) for the debug console: a shell in every guest would cost
# every boot its unpacking (~100 ms under TCG here), so production guests have none.
INITRD_DEBUG := $(GUEST_CACHE)/kata-initrd-debug.img
# The bench's: an agent built with its bench sink (cargo feature bench-sink), which
# production and test guests lack; its own target dir, so neither build undoes the other.
INITRD_BENCH := $(GUEST_CACHE)/kata-initrd-bench.img
AGENT_BENCH_BIN := target/agent-bench/$(TARGET)/agent/kata-agent
IMAGE_TAR := $(GUEST_CACHE)/busybox-image.tar
# The pod sandbox image of the CRI tests: our own static pause (scripts/pause.c).
PAUSE_IMAGE_TAR := $(GUEST_CACHE)/pause-image.tar
PREFIX ?= /usr/local
SHARE_DIR := /usr/share/kata-containers
DEFAULTS_DIR := /usr/share/defaults/kata-containers
DEMO_DIR ?= /tmp/kata-demo
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: all setup build agent agent-bench shim factory vsock vmm runtime monitor install-vsock guest kernel initrd initrd-bench image install uninstall demo test unit e2e lint

all: build

setup:
	bash scripts/setup-host.sh

shim:
	$(CARGO) build --release -p shim

agent:
	RUSTFLAGS='-C target-feature=+crt-static' $(CARGO) build --profile agent -p kata-agent --target $(TARGET)

build: shim factory agent vsock vmm runtime monitor

# kata-vsock, the vhost-user vsock backend QEMU uses (config: hypervisor.qemu.vsock_backend).
vsock:
	$(CARGO) build --release -p vmm --bin kata-vsock

# kata-vmm, the builtin VMM (config: hypervisor.builtin.path, hypervisor_name = "builtin").
vmm:
	$(CARGO) build --release -p vmm --bin kata-vmm

# kata-vm-factory, the VM pool's daemon (`kata-runtime factory` runs it; [factory] config).
factory:
	$(CARGO) build --release -p factory --bin kata-vm-factory

# kata-runtime, the host tool: `kata-runtime check` and `kata-runtime env`.
runtime:
	$(CARGO) build --release -p kata-runtime

# kata-monitor, the node daemon Prometheus scrapes (deploy/monitor/).
monitor:
	$(CARGO) build --release -p kata-monitor

# The default vsock_backend is $(PREFIX)/bin/kata-vsock.
install-vsock: vsock
	install -D -m 0755 $(VSOCK_BIN) $(PREFIX)/bin/kata-vsock

kernel: setup
	@bash guest/build-kernel.sh >/dev/null

# BUSYBOX (a static busybox) is the debug console's shell, in $(INITRD_DEBUG) only.
BUSYBOX ?= /bin/busybox
initrd: agent
	bash guest/build-initrd.sh $(AGENT_BIN) $(INITRD)
	bash guest/build-initrd.sh $(AGENT_BIN) $(INITRD_DEBUG) $(BUSYBOX)

agent-bench:
	RUSTFLAGS='-C target-feature=+crt-static' $(CARGO) build --profile agent -p kata-agent --target $(TARGET) --features bench-sink --target-dir target/agent-bench

initrd-bench: agent-bench
	bash guest/build-initrd.sh $(AGENT_BENCH_BIN) $(INITRD_BENCH)

image:
	@mkdir -p $(GUEST_CACHE)
	bash scripts/busybox-image.sh $(IMAGE_TAR)
	bash scripts/pause-image.sh $(PAUSE_IMAGE_TAR)

guest: kernel initrd initrd-bench

# Installs the runtime where containerd and the default configuration expect it (the kernel
# and the initrds it boots; not the bench's initrd, which only `make bench` uses).
install: build kernel initrd install-vsock
	install -D -m 0755 $(SHIM_BIN) $(PREFIX)/bin/containerd-shim-kata-v2
	ln -sfn containerd-shim-kata-v2 $(PREFIX)/bin/containerd-shim-kata-builtin-v2
	install -D -m 0755 $(VMM_BIN) $(PREFIX)/bin/kata-vmm
	install -D -m 0644 "$$(bash guest/build-kernel.sh)" $(SHARE_DIR)/vmlinux
	install -D -m 0644 $(INITRD) $(SHARE_DIR)/kata-initrd.img
	install -D -m 0644 $(INITRD_DEBUG) $(SHARE_DIR)/kata-initrd-debug.img
	install -D -m 0644 config/configuration.toml $(DEFAULTS_DIR)/configuration.toml
	install -D -m 0755 $(RUNTIME_BIN) $(PREFIX)/bin/kata-runtime
	install -D -m 0755 $(FACTORY_BIN) $(PREFIX)/bin/kata-vm-factory
	install -D -m 0644 deploy/configuration-builtin.toml $(DEFAULTS_DIR)/configuration-builtin.toml
	install -D -m 0644 -t $(SHARE_DIR)/deploy/containerd deploy/containerd/kata-containerd-1.x.toml deploy/containerd/kata-containerd-2.x.toml
	install -D -m 0644 -t $(SHARE_DIR)/deploy/kubernetes deploy/kubernetes/runtimeclass.yaml
	install -D -m 0755 $(MONITOR_BIN) $(PREFIX)/bin/kata-monitor
	install -D -m 0644 -t $(SHARE_DIR)/deploy/monitor deploy/monitor/kata-monitor-daemonset.yaml deploy/monitor/prometheus-scrape.yaml deploy/monitor/grafana-dashboard.json
	sed 's|/usr/local/bin/kata-monitor|$(PREFIX)/bin/kata-monitor|' deploy/monitor/kata-monitor.service >$(SHARE_DIR)/deploy/monitor/kata-monitor.service
	install -d $(SHARE_DIR)/deploy/systemd
	sed 's|/usr/local/bin/kata-runtime|$(PREFIX)/bin/kata-runtime|' deploy/systemd/kata-vm-factory.service >$(SHARE_DIR)/deploy/systemd/kata-vm-factory.service

# Removes everything `make install` (and install-vsock) put down; leaves what the
# administrator wrote: /etc/kata-containers/ and containerd's own configuration.
uninstall:
	rm -f $(PREFIX)/bin/containerd-shim-kata-v2 $(PREFIX)/bin/containerd-shim-kata-builtin-v2 $(PREFIX)/bin/kata-vmm $(PREFIX)/bin/kata-vsock $(PREFIX)/bin/kata-runtime $(PREFIX)/bin/kata-vm-factory $(PREFIX)/bin/kata-monitor
	rm -f $(SHARE_DIR)/vmlinux $(SHARE_DIR)/kata-initrd.img $(SHARE_DIR)/kata-initrd-debug.img
	rm -f $(SHARE_DIR)/deploy/containerd/kata-containerd-1.x.toml $(SHARE_DIR)/deploy/containerd/kata-containerd-2.x.toml
	rm -f $(SHARE_DIR)/deploy/kubernetes/runtimeclass.yaml
	rm -f $(addprefix $(SHARE_DIR)/deploy/monitor/,kata-monitor.service kata-monitor-daemonset.yaml prometheus-scrape.yaml grafana-dashboard.json)
	rm -f $(SHARE_DIR)/deploy/systemd/kata-vm-factory.service
	rm -f $(DEFAULTS_DIR)/configuration.toml $(DEFAULTS_DIR)/configuration-builtin.toml
	rmdir --ignore-fail-on-non-empty $(SHARE_DIR)/deploy/containerd $(SHARE_DIR)/deploy/kubernetes $(SHARE_DIR)/deploy/monitor $(SHARE_DIR)/deploy/systemd $(SHARE_DIR)/deploy $(SHARE_DIR) $(DEFAULTS_DIR) 2>/dev/null || true

# The Helm chart's installer image (deploy/helm/kata-deploy/, README "Install on a
# cluster"): the runtime, guest kernel and initrd, configurations and deploy/kata-deploy.sh
# on the project's busybox image, as an OCI archive to push to a registry. KUBECTL: a
# statically linked kubectl (default: the one in PATH).
KATA_DEPLOY_IMAGE ?= kata-deploy:0.1.0
KATA_DEPLOY_TAR ?= $(GUEST_CACHE)/kata-deploy.tar
.PHONY: kata-deploy-image
kata-deploy-image: build kernel initrd image
	KATA_SHIM_DIR=$(CURDIR)/target/release KATA_KERNEL="$$(bash guest/build-kernel.sh)" \
	KATA_INITRD=$(INITRD) KUBECTL="$${KUBECTL:-$$(command -v kubectl)}" \
	bash scripts/kata-deploy-image.sh $(IMAGE_TAR) $(KATA_DEPLOY_TAR) $(KATA_DEPLOY_IMAGE)

# README command 1: a container in a VM through a private containerd.
demo: setup install image
	bash scripts/demo.sh $(DEMO_DIR) $(IMAGE_TAR)

# containerd 1.7 and 2.1 from Debian trixie's and sid's packages, unpacked (never installed),
# and 2.3 and 2.4 built with `go install` from the Go module proxy (Go's own caches), into
# $(CONTAINERD_CACHE)/<series>/usr/bin for tests/tests/compat.rs. Skips what is there.
CONTAINERD_CACHE ?= /var/cache/kata-containerd
.PHONY: containerd-versions
containerd-versions:
	KATA_CONTAINERD_CACHE=$(CONTAINERD_CACHE) bash scripts/containerd-versions.sh >/dev/null

# CRI conformance: cri-tools' critest (pinned, built from the Go module proxy, cached in
# /var/cache/kata-critest) with the runc handler, then the kata handler, on a private
# containerd $(CRITEST_CONTAINERD) whose registries resolve to a loopback registry of the
# project's own images (scripts/critest.sh). Fails when a spec passes with runc and fails
# with kata, unless tests/critest-kata-expected-failures.txt lists it with its reason.
CRITEST_CONTAINERD ?= 2.3
CRITEST = KATA_KERNEL="$$(bash guest/build-kernel.sh)" KATA_INITRD=$(INITRD) \
	KATA_SHIM_DIR=$(CURDIR)/target/release KATA_IMAGE=$(IMAGE_TAR) \
	KATA_PAUSE_IMAGE=$(PAUSE_IMAGE_TAR) \
	CRITEST_CONTAINERD_BIN=$(CONTAINERD_CACHE)/$(CRITEST_CONTAINERD)/usr/bin \
	bash scripts/critest.sh
.PHONY: critest
critest: setup build guest image containerd-versions
	$(CRITEST)

# The Kubernetes suite: a single-node Kubernetes (pinned; built from the Go module proxy by
# scripts/k8s-build.sh, cached in /var/cache/kata-k8s) on a private containerd 2.3 with the
# deploy/ snippet and RuntimeClasses, and tests/k8s/cases.sh run with RuntimeClass runc and
# kata (scripts/k8s-suite.sh). Fails on a kata-only failure that
# tests/k8s-kata-expected-failures.txt does not list. K8S_HOLD=1 keeps the node up.
K8S_SUITE = KATA_KERNEL="$$(bash guest/build-kernel.sh)" KATA_INITRD=$(INITRD) \
	KATA_SHIM_DIR=$(CURDIR)/target/release KATA_IMAGE=$(IMAGE_TAR) \
	KATA_PAUSE_IMAGE=$(PAUSE_IMAGE_TAR) \
	K8S_CONTAINERD_BIN=$(CONTAINERD_CACHE)/2.3/usr/bin \
	bash scripts/k8s-suite.sh
.PHONY: k8s
k8s: setup build guest image containerd-versions
	$(K8S_SUITE)

# README command 2: every test, unit (`make unit`) then end-to-end (`make e2e`), a bounded
# fuzzing run of each fuzz target, the CRI conformance suite, then the Kubernetes suite
# (each runs even when an earlier one failed; the target fails if any did).
test: setup build guest image containerd-versions
	status=0; \
	python3 scripts/import-cycles.py || status=$$?; \
	$(CARGO) test --workspace --lib --bins --no-fail-fast || status=$$?; \
	$(CARGO) test -p kata-agent --bins --features bench-sink --no-fail-fast || status=$$?; \
	rm -rf $(E2E_FIGURES); \
	$(E2E_ENV) $(CARGO) test --workspace --no-fail-fast --test '*' -- --test-threads=2 || status=$$?; \
	$(SHOW_E2E_FIGURES); \
	KATA_FUZZ_CACHE=$(FUZZ_CACHE) FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh || status=$$?; \
	$(CRITEST) || status=$$?; \
	$(K8S_SUITE) || status=$$?; \
	exit $$status

# What the end-to-end tests are pointed at.
E2E_ENV = KATA_TEST_CONTAINERD_DIR=$(CONTAINERD_CACHE) \
	KATA_TEST_KERNEL="$$(bash guest/build-kernel.sh)" \
	KATA_TEST_INITRD=$(INITRD) \
	KATA_TEST_DEBUG_INITRD=$(INITRD_DEBUG) \
	KATA_TEST_BENCH_INITRD=$(INITRD_BENCH) \
	KATA_TEST_SHIM_DIR=$(CURDIR)/target/release \
	KATA_TEST_IMAGE=$(IMAGE_TAR) \
	KATA_TEST_PAUSE_IMAGE=$(PAUSE_IMAGE_TAR) \
	KATA_TEST_AGENT=$(CURDIR)/$(AGENT_BIN)

# The unit tests alone (every crate's lib and bin tests: no VM, no containerd; about a
# minute once built).
unit:
	$(CARGO) test --workspace --lib --bins --no-fail-fast
	$(CARGO) test -p kata-agent --bins --features bench-sink --no-fail-fast

# The end-to-end tests alone (every crate's tests/ files: real QEMU, containerd, the CRI).
e2e: setup build guest image containerd-versions
	rm -rf $(E2E_FIGURES); \
	status=0; \
	$(E2E_ENV) $(CARGO) test --workspace --no-fail-fast --test '*' -- --test-threads=2 || status=$$?; \
	$(SHOW_E2E_FIGURES); \
	exit $$status

# Figures end-to-end tests measure (the CRI churn soak's before/after counts and rate),
# written there because cargo shows nothing of a test that passes; printed after the run.
E2E_FIGURES := target/e2e-figures
SHOW_E2E_FIGURES = for f in $(E2E_FIGURES)/*.txt; do [ -f "$$f" ] && cat "$$f"; done; true

# Fuzzing (fuzz/, cargo-fuzz with libFuzzer) of what parses guest-controlled bytes: vsock
# packets and the muxer, kata-vmm's virtio-mmio transport and devices, the shim's reading of
# the agent's answers. FUZZ_SECONDS (60) per target; corpora, crashes and logs in
# $(FUZZ_CACHE) (scripts/fuzz.sh). `make test` runs it; longer runs: FUZZ_SECONDS=600.
FUZZ_CACHE ?= /var/cache/kata-fuzz
FUZZ_SECONDS ?= 60
.PHONY: fuzz
fuzz: setup
	KATA_FUZZ_CACHE=$(FUZZ_CACHE) FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	python3 scripts/import-cycles.py

# Benchmarks (bench/bench.py): start-up, phase breakdown, stdout and vsock throughput, exec
# latency, memory and density of our runtime next to runc, through a private containerd.
# Prints a table and writes target/bench/<timestamp>.json and target/bench/latest.json.
# Then vmm/bench.sh: kata-vmm against QEMU on a tiny test guest (exec -> first serial byte,
# RSS with a 128 MiB guest); `make bench-vmm` runs only that part.
# Env: BENCH_RUNS (5), BENCH_DENSITY (10), more in bench/README.md. Not part of `make test`;
# run it on an otherwise idle machine.
.PHONY: bench bench-vmm
bench: shim vsock initrd-bench kernel image
	KATA_KERNEL="$$(bash guest/build-kernel.sh)" KATA_INITRD=$(INITRD_BENCH) IMAGE_TAR=$(IMAGE_TAR) \
	KATA_SHIM_DIR=$(CURDIR)/target/release python3 bench/bench.py
	RUNS=$${BENCH_RUNS:-5} bash vmm/bench.sh

bench-vmm:
	RUNS=$${BENCH_RUNS:-5} bash vmm/bench.sh

# The verbs a person types. `make demo` and `make test` are the quick start.
SHELL := /bin/bash
CARGO ?= cargo
CACHE := $(CURDIR)/.cache
# Cargo's output: target/ in the clone unless CARGO_TARGET_DIR says otherwise (CI keeps it under
# $HOME so a fresh clone reuses the last build).
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
# On x86_64 Linux every make build is static (glibc static-pie): the same binaries serve the tests
# and the FROM scratch image, which has no libc to load; one build, since CI time matters. Naming
# the target keeps the build scripts and proc macros dynamic (they cannot be static) and puts the
# output under <target dir>/x86_64-unknown-linux-gnu/. A plain `cargo build` stays as usual.
HOST_TRIPLE := $(shell rustc -vV 2>/dev/null | sed -n 's/^host: //p')
ifeq ($(HOST_TRIPLE),x86_64-unknown-linux-gnu)
export CARGO_BUILD_TARGET ?= x86_64-unknown-linux-gnu
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS ?= -C target-feature=+crt-static
BIN_DIR := $(TARGET_DIR)/x86_64-unknown-linux-gnu/release
else
BIN_DIR := $(TARGET_DIR)/release
endif
# The test servers' ports (PG_PORT, RABBITMQ_PORT, ...): its NAME=value lines are make's too.
include scripts/services/ports.env
export DATABASE_URL ?= postgres://postgres@127.0.0.1:$(PG_PORT)/test
export AMQP_URL ?= amqp://guest:guest@127.0.0.1:$(RABBITMQ_PORT)/%2f

.PHONY: test-servers test-builds demo-services docs docs-check docs-reference node-check all build release demo test test-rust lint module-check fuzz services image-tools control-plane bench bench-smoke crds chart-check e2e-cluster chaos chaos-smoke scale soak image fmt script-lint cluster cluster-down cluster-release dist release-tools previous-release otel-collector toxiproxy

all: build

build:
	$(CARGO) build --workspace --all-targets

release:
	$(CARGO) build --release -p outbox-relay -p outbox-operator -p outbox-bench -p outbox-tests --bins

services:
	./scripts/services.sh

demo-services:
	./scripts/services.sh demo

## docs: build the book (docs/, mkdocs.yml) into .cache/docs/site/.
docs:
	./scripts/docs.sh build

## docs-reference: regenerate the book's reference pages (docs/reference/api.md, cli.md,
## metrics.md) from the CRD, the binaries' --help and the metric registries; the
## repo_docs_reference test fails when they are stale.
docs-reference:
	$(CARGO) build --release -p outbox-relay -p outbox-operator --bins
	$(CARGO) run --release -p outbox-tests --bin docs-reference

## docs-check: the book built with warnings as errors (links and #anchors included), its links
## into the repository, and its pages opened in headless Chromium.
docs-check:
	./scripts/docs.sh check

## node-check: the machine can run the tests' Kubernetes node (root, cgroup v1), said at once.
node-check:
	@./scripts/node-check.sh

## image-tools: buildah, umoci, runc, containerd, the CNI plugins and iptables from Debian's
## packages, when missing (the image, and the tests' Kubernetes node).
image-tools:
	./scripts/image-tools.sh

## demo: seed 1,000,000 rows into a local table and relay them to RabbitMQ, with live progress.
## Only the two servers it uses (PostgreSQL and RabbitMQ, from apt on a fresh machine) start,
## while the release build compiles; `make services` or `make test` start the tests' others.
demo:
	@$(MAKE) --no-print-directory -j2 demo-services release
	RELAY='$(BIN_DIR)/outbox-relay' ./scripts/demo.sh

## test: everything CI runs: first what the machine lacks (root, cgroups for the node; Go for
## the control plane's build), then lint, the tests, the PostgreSQL matrix, the chart check, the
## book, the smoke runs and the fuzz run.
##
## Three things happen at once first: the control plane's Go build, the servers and tools
## (downloads, on a fresh machine), and lint with the release build of every test target. The Go
## and Rust builds fill each other's idle core; the downloads cost no CPU. Their lines interleave
## (make's --output-sync would hold a build's lines back until it ends, minutes later). The
## release tools (cosign, cargo-cyclonedx), the OpenTelemetry Collector the span tests send to
## and Toxiproxy (each built once, cached) take the first free slots, which are usually the
## downloads': built here, not by the first test that runs make dist or starts a collector or a
## Toxiproxy.
test: node-check
	@$(MAKE) --no-print-directory -j3 control-plane test-servers test-builds release-tools otel-collector toxiproxy
	@$(MAKE) --no-print-directory test-rust chart-check docs-check bench-smoke chaos-smoke fuzz SMOKE_BINARIES=test-rust

## test-servers: the servers and every tool the tests use, one after another (apt runs one at a time).
test-servers:
	./scripts/services.sh
	./scripts/image-tools.sh
	./scripts/docs.sh tools

## test-builds: lint, then the release build of every target the tests run, then the previous
## release's (scripts/previous-release.sh: once per release, cached by its commit; seeded from
## this build's dependencies, so it comes right after them, in the first step's Rust lane).
test-builds: lint
	$(CARGO) build --workspace --all-targets --release
	@./scripts/previous-release.sh >/dev/null

## control-plane: build the tests' Kubernetes (etcd, the control plane, the node's kubelet and
## kube-proxy, kubectl) and the oldest minor the chart supports (etcd, kube-apiserver, kubectl);
## once, cached under ~/.cache/outbox-relay/control-plane, keyed by each module's inputs.
control-plane:
	@./tests/control-plane/build.sh >/dev/null
	@./tests/control-plane/build.sh tests/control-plane/oldest >/dev/null

## otel-collector: the OpenTelemetry Collector the span tests send to (tests/otel-collector/:
## the OTLP receiver and the file exporter, from the Go module proxy); built once, cached under
## ~/.cache/outbox-relay/otel-collector-<hash of its inputs and the Go version>/. Each test
## starts its own (tests/src/otel_collector.rs).
otel-collector:
	@./scripts/otel-collector.sh >/dev/null

## toxiproxy: Toxiproxy v2.12.0 (github.com/Shopify/toxiproxy/v2, Go module proxy), for the
## application-level fault tests (latency, bandwidth, a connection cut mid-frame); built once,
## cached under ~/.cache/outbox-relay/toxiproxy-<hash of its version, the Go version and the
## flags>/. Each test starts its own (tests/src/toxiproxy.rs).
toxiproxy:
	@./scripts/toxiproxy.sh >/dev/null

## test-rust: the test targets' release build, then every test of the workspace
## (scripts/test-suite.py): the end-to-end binaries, which mostly wait, side by side, and beside
## them, two at a time, the PostgreSQL 13-18 and broker matrices, the failover scenarios and the
## tests that watch a relay's log for a minute; then the rest and the run against database
## `postgres`, one at a time.
test-rust:
	$(CARGO) build --workspace --all-targets --release
	CARGO='$(CARGO)' ./scripts/test-suite.py

## lint: formatting, clippy with warnings denied, no import circle between either crate's modules,
## and the scripts' lint. Clippy runs with the release profile: its proc macros and build scripts
## (sqlx's and kube's macros, ring's and mimalloc's C) are then the ones the release build has
## compiled already (module-check, and test-builds after it), not a second, debug set. Measured
## after a release build: 106 s instead of 182 s on 2 cores. The workspace has no
## cfg(debug_assertions) code that the release profile would hide from it.
lint: module-check script-lint
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings

## module-check: no import circle between the modules of either crate, nor between their
## top-level folders. tests/tests/repo_imports.rs reads the sources with syn: seconds once
## built.
module-check:
	$(CARGO) test --release --workspace --test repo_imports

## script-lint: bash -n and shellcheck on every shell script, py_compile and pyflakes on every
## Python file (scripts/lint-scripts.sh; shellcheck from Debian's package, pyflakes from PyPI).
script-lint:
	./scripts/lint-scripts.sh

fmt:
	$(CARGO) fmt --all

## crds: regenerate the CRD from the Rust types (a test fails when they drift).
crds:
	$(CARGO) run -q -p outbox-operator -- crd > crds/outboxrelays.yaml
	cp crds/outboxrelays.yaml charts/outbox-relay-operator/crds/outboxrelays.yaml
	cp crds/outboxrelays.yaml config/crd/outboxrelays.yaml

## chart-check: helm lint/template with the real helm, schema validation of every manifest.
chart-check:
	./scripts/chart-check.sh

bench: services release
	$(BIN_DIR)/outbox-bench $(BENCH_ARGS)

# `make test` names test-rust here: it has just built every binary, and `release` would only
# ask cargo again.
SMOKE_BINARIES ?= release

bench-smoke: services $(SMOKE_BINARIES)
	$(BIN_DIR)/outbox-bench --smoke

# Then the failover run: on a primary and synchronous standby of its own, failed over through one
# address that moves, and on the three-node RabbitMQ cluster, whose nodes 2 and 3 are stopped or
# killed or raise a memory or disk alarm (report-failover.md beside report.md).
CHAOS_FAILOVER_ARGS ?= --rows 200000
chaos: services release
	$(BIN_DIR)/outbox-chaos $(CHAOS_ARGS)
	$(BIN_DIR)/outbox-chaos --faults pg-failover,broker-node-loss,broker-alarm,kill-9,pg-terminate,network-stall $(CHAOS_FAILOVER_ARGS)

## scale: the operator with 1,000 suspended OutboxRelays over 10 databases on the real API server
## (tests/tests/long_operator_scale.rs, which make test runs with 100): time until all are Ready
## and until all are reconciled after their Secrets' rotation, operator RSS, reconcile p99,
## sessions per database (at most 2) and 429s (none). SCALE_RELAYS= to change the count.
SCALE_RELAYS ?= 1000
scale: control-plane services release
	OPERATOR_SCALE_RELAYS=$(SCALE_RELAYS) $(CARGO) test --release -p outbox-tests --test long_operator_scale -- --nocapture

## soak: two relay pods of one OutboxRelay, run by the operator on the real node, at half their
## measured ceiling for MINUTES one-minute periods (90 by default), with a relay pod killed, a
## RabbitMQ node and PostgreSQL restarted and a transaction held open on a schedule
## (tests/tests/long_soak.rs, which make test runs with 18 periods of 6 s). Fails on memory over
## 130 % of minute 10's, a fault-free minute under 85 % of the first one's throughput, a latency
## that does not come back within 10 minutes of the long transaction, or a lost message. The CSV,
## the table and the plot go to target/soak/ (SOAK_DIR=).
MINUTES ?= 90
soak: control-plane services release
	SOAK_MINUTES=$(MINUTES) $(CARGO) test --release -p outbox-tests --test long_soak -- --nocapture

## chaos-smoke: a seconds-long chaos run, unordered and with per-key ordering.
chaos-smoke: services $(SMOKE_BINARIES)
	$(BIN_DIR)/outbox-chaos --smoke
	$(BIN_DIR)/outbox-chaos --smoke --ordering per-key

## fuzz: a longer property-based fuzz of the parsers than the unit tests run.
fuzz:
	PROPTEST_CASES=2000 $(CARGO) test --workspace --release -q fuzz_

e2e-cluster:
	./scripts/e2e-cluster.sh

# make cluster's files (kubeconfig, pid, logs, the control plane's state); OUTBOX_CLUSTER_DIR
# moves them, so a second cluster (a test's) leaves the first alone.
CLUSTER_DIR := $(or $(OUTBOX_CLUSTER_DIR),$(CACHE)/cluster)
# CLUSTER_BIN=<path of an outbox-cluster> runs that build (and the outbox-relay and
# outbox-operator next to it) without building anything; by default the release build.
CLUSTER_BIN ?=

## cluster: a local control plane with the operator installed, in the background; prints
## KUBECONFIG=… and where kubectl and helm are. cluster-down stops it.
cluster: control-plane services image-tools $(if $(CLUSTER_BIN),,cluster-release)
	@CLUSTER_DIR='$(CLUSTER_DIR)' CLUSTER_BIN='$(or $(CLUSTER_BIN),$(BIN_DIR)/outbox-cluster)' \
		./scripts/cluster.sh up

cluster-down:
	@CLUSTER_DIR='$(CLUSTER_DIR)' ./scripts/cluster.sh down

cluster-release:
	$(CARGO) build --release -p outbox-relay -p outbox-operator -p outbox-tests --bins

## image: the release image (FROM scratch, both static binaries) as an OCI layout and archive
## under .cache/image; with docker or podman when one works, else daemonless with buildah.
image: release image-tools
	BIN_DIR='$(BIN_DIR)' ./scripts/image.sh

## release-tools: cosign v2 (Go module proxy) and cargo-cyclonedx (crates.io), which make dist
## signs and describes the image with; built once each, cached under ~/.cache/outbox-relay/.
release-tools:
	@./scripts/cosign.sh >/dev/null
	@./scripts/cyclonedx.sh >/dev/null

## previous-release: the previous release (the newest line of release/releases) built from its
## recorded commit: its static binaries, image and packaged chart, cached under
## ~/.cache/outbox-relay/previous-release/<commit>/ (the upgrade and mixed-version tests use it).
previous-release:
	./scripts/previous-release.sh

## dist: the release artifacts, published as users consume them (scripts/dist.sh): the image by
## digest and the chart (oci://) in an OCI registry (DIST_REGISTRY; by default a local one on
## 127.0.0.1:REGISTRY_PORT, started here by outbox-registry and left running: `outbox-registry
## stop` ends it), the image's CycloneDX SBOM, and, given COSIGN_KEY and COSIGN_PASSWORD, cosign
## signatures of both and the SBOM as a signed attestation.
dist: release image-tools release-tools
	BIN_DIR='$(BIN_DIR)' ./scripts/dist.sh

#!/usr/bin/env bash
# What the tests' Kubernetes node needs from the machine and no package can give it, checked
# before `make test` spends its first build: one line naming what is missing. The tests check it
# again when a node starts (tests/src/node/preflight.rs), for runs that skip make; the programs
# the node runs are image-tools.sh's to install.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
  echo "the tests' Kubernetes node needs root (namespaces, cgroups, a bridge and iptables): run make test as root" >&2
  exit 1
fi
if [ ! -d /sys/fs/cgroup/memory ]; then
  echo "the tests' Kubernetes node needs the cgroup v1 memory controller at /sys/fs/cgroup/memory, which this machine does not have" >&2
  exit 1
fi

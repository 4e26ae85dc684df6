#!/usr/bin/env bash
# Installs the container tools the tests, `make image` and `make cluster` use, when missing, from
# Debian's own packages (nothing runs in the background):
#   buildah, umoci, runc          build the image, unpack it, run it
#   containerd (and its ctr)      the tests' Kubernetes node's container runtime
#   containernetworking-plugins   its pod network (bridge, host-local, loopback in /usr/lib/cni)
#   iptables                      kube-proxy's Service rules and the bridge's masquerade
#   skopeo                        copies the image's OCI layout to a registry (make dist)
set -euo pipefail

missing=()
need() { # need PACKAGE PATH-OR-COMMAND
    command -v "$2" >/dev/null 2>&1 || [ -x "/usr/sbin/$2" ] || [ -x "$2" ] || missing+=("$1")
}
need buildah buildah
need umoci umoci
need runc runc
need containerd containerd
need containernetworking-plugins /usr/lib/cni/bridge
need iptables iptables
need skopeo skopeo
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "image-tools: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null

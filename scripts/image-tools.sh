#!/usr/bin/env bash
# Installs the daemonless image tools the tests and `make image` use, when missing: buildah
# (builds the image), umoci (unpacks it into a runtime bundle) and runc (runs it). Debian's own
# packages; nothing runs in the background.
set -euo pipefail

missing=()
for tool in buildah umoci runc; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || missing+=("$tool")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "image-tools: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null

# shellcheck shell=bash
# Debian's docker-registry (the distribution project's registry 2.8), installed for the OCI
# registries that make dist and the tests that push and pull start themselves
# (tests/src/registry/server.rs). Sourced by scripts/services.sh.

install_registry() {
  command -v docker-registry >/dev/null && command -v curl >/dev/null && return 0
  if ! as_root true 2>/dev/null; then
    echo "docker-registry is missing. Install it with:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y docker-registry curl" >&2
    exit 1
  fi
  echo "installing docker-registry with apt"
  as_root apt-get update -qq
  # The package's own service (port 5000, /var/lib/docker-registry) is not started here: no
  # systemd on these machines, and invoke-rc.d's policy refuses it where one is set.
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq docker-registry curl >/dev/null
}

# shellcheck shell=bash
# shellcheck disable=SC2034 # variables set here, read in the other files scripts/services.sh sources
# What every part of scripts/services.sh uses: root, the host's address for the pods, the
# AMQP 1.0 probe. Sourced by scripts/services.sh.

PGHOST=127.0.0.1
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }

# Where pods and the tests' Kubernetes node reach these servers (tests/src/services.rs): a second
# address of this host, on an interface of its own. The nodes' pods come from 10.213.N.2 (each
# node masquerades its pods to its own address). A bridge without ports holds the address: these
# VMs' kernels have no dummy interfaces. Nothing routes it off the machine.
SERVICES_ADDRESS=10.213.0.1
SERVICES_INTERFACE=outbox-services
NODES_NETWORK=10.213.0.0/16

setup_services_address() {
  ip -4 -o addr show dev "$SERVICES_INTERFACE" 2>/dev/null | grep -q "inet $SERVICES_ADDRESS/" && return 0
  if ! as_root true 2>/dev/null; then
    echo "the host needs address $SERVICES_ADDRESS on an interface $SERVICES_INTERFACE, which needs root: run this script as root once" >&2
    exit 1
  fi
  echo "giving the host $SERVICES_ADDRESS on $SERVICES_INTERFACE, where pods reach the servers"
  ip link show "$SERVICES_INTERFACE" >/dev/null 2>&1 || as_root ip link add "$SERVICES_INTERFACE" type bridge
  as_root ip addr add "$SERVICES_ADDRESS/32" dev "$SERVICES_INTERFACE"
  as_root ip link set "$SERVICES_INTERFACE" up
}

# amqp10_up HOST PORT: the server answers the AMQP 1.0 SASL protocol header (AMQP 3 1 0 0) with an
# AMQP 1.0 header of its own. A RabbitMQ without the plugin answers AMQP 0 0 9 1 instead.
amqp10_up() {
  local reply
  # shellcheck disable=SC2016 # $1 and $2 belong to the inner shell
  reply=$(timeout 5 bash -c 'exec 3<>"/dev/tcp/$1/$2" && printf "AMQP\x03\x01\x00\x00" >&3 && head -c 5 <&3 | od -An -tx1' \
    _ "$1" "$2" 2>/dev/null) || return 1
  [ "${reply//[[:space:]]/}" = 414d515003 ]
}

# Run as postgres, from a directory it may enter.
as_postgres() { (cd / && as_root runuser -u postgres -- "$@"); }

# stamp FUNCTION... [-- VALUE...]: a cache stamp, a short hash of the functions' code (as bash
# prints it back: comments and layout do not count) and of the values given (the settings that
# code reads). Whatever changes them makes the thing again on the next run, as the OpenTelemetry
# Collector's key does; nothing is bumped by hand. A function not defined fails the script.
stamp() {
  local functions=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do functions+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  { declare -f "${functions[@]}" || { echo "stamp: no function among ${functions[*]}" >&2; return 1; }
    printf '%s\n' "$@"; } | sha256sum | cut -c1-16
}

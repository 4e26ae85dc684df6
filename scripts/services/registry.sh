# shellcheck shell=bash
# shellcheck disable=SC2034 # variables set here, read in the other files scripts/services.sh sources
# An OCI registry (make dist, the tests that push and pull). Sourced by scripts/services.sh.

# An OCI registry (Debian's docker-registry, the distribution project's registry 2.8) for
# make dist and the tests that push to and pull from one: plain HTTP on loopback (or on the
# address the tests' node reaches this host at, which nothing routes off the machine), no
# authentication, its blobs under DIR/data. Started only when asked; one per DIR.
registry_dir_default="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}/registry"
registry_up() { curl -fsS -o /dev/null --max-time 2 "http://$1/v2/" 2>/dev/null; }
registry_pid() {
  local pid
  pid=$(cat "$1/registry.pid" 2>/dev/null) && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF "$1/config.yml" \
    && echo "$pid"
}
start_registry() {
  local dir="$1" port="$2" address="$3"
  case "$port" in '' | *[!0-9]*) echo "registry: the port must be a number, not '$port'" >&2; exit 2 ;; esac
  case "$address" in 127.0.0.1 | "$SERVICES_ADDRESS") ;; *) echo "registry: listen on 127.0.0.1 or $SERVICES_ADDRESS, not '$address'" >&2; exit 2 ;; esac
  [ "$address" = 127.0.0.1 ] || setup_services_address
  local at="$address:$port"
  mkdir -p "$dir/data"
  dir=$(cd "$dir" && pwd)
  if registry_pid "$dir" >/dev/null; then
    registry_up "$at" && { echo "services: the registry of $dir is up on $at"; return 0; }
    echo "registry: $dir's registry runs but does not answer on $at (started on another port?); stop it with: $0 stop-registry $dir" >&2
    exit 1
  fi
  if registry_up "$at"; then
    echo "registry: something else answers on $at; pick another port" >&2
    exit 1
  fi
  if ! command -v docker-registry >/dev/null || ! command -v curl >/dev/null; then
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
  fi
  cat >"$dir/config.yml" <<YAML
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
http:
  addr: $at
  # One registry behind no balancer: a fixed secret only quiets its warning about a random one.
  secret: outbox-relay-local-registry
YAML
  # setsid: the registry outlives this script and is not in the caller's process group, so a
  # test's Ctrl-C does not take it down half-written; stop-registry (or the test's guard) ends it.
  setsid docker-registry serve "$dir/config.yml" >>"$dir/registry.log" 2>&1 </dev/null &
  echo $! >"$dir/registry.pid"
  for _ in $(seq 1 100); do
    registry_up "$at" && { echo "services: an OCI registry on $at (plain HTTP), storing under $dir/data"; return 0; }
    # Alive, not registry_pid: just after the fork the child's cmdline is still this shell's,
    # and a check of it there ended the wait at once, an empty log and all.
    kill -0 "$(cat "$dir/registry.pid")" 2>/dev/null || break
    sleep 0.1
  done
  echo "registry: it did not answer on $at; its log ($dir/registry.log) ends:" >&2
  tail -n 20 "$dir/registry.log" >&2
  exit 1
}
stop_registry() {
  local dir="$1" pid
  [ -d "$dir" ] || return 0
  dir=$(cd "$dir" && pwd)
  pid=$(registry_pid "$dir") || return 0
  kill "$pid"
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  rm -f "$dir/registry.pid"
}

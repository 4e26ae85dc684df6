# shellcheck shell=bash
# shellcheck disable=SC2154 # variables set in another of the files scripts/services.sh sources
# RabbitMQ 4 beside the tests' RabbitMQ 3.10 (issue 56): Debian 13's rabbitmq-server, in a
# Debian 13 root of its own, for the tests that need it (only they start it, never the plain run
# of this script). Sourced by scripts/services.sh.
#   scripts/services.sh rabbitmq4          make the root (once: again only when its stamp changes),
#                                          start the broker when it is not running, print its URL
#   scripts/services.sh rabbitmq4-stop     stop the broker (the root and the node's data stay)
#   scripts/services.sh rabbitmq4-cli rabbitmqctl|rabbitmq-diagnostics|rabbitmq-plugins|rabbitmq-queues ARG...
#                                          run one of its CLI tools against the node, in the root
#   scripts/services.sh rabbitmq4-root     make the root (once), print its folder: the three-node
#                                          RabbitMQ 4 cluster (tests/src/rabbit_cluster/) runs from it
#
# Why a root: Erlang 27, which RabbitMQ 4.0 needs, is built against Debian 13's C library, so
# Debian 13's packages do not run on this Debian 12 host. `debootstrap --variant=minbase` makes
# the root under $OUTBOX_CACHE/debian13-root-<stamp>, and apt inside it installs the pinned
# rabbitmq-server (Erlang comes as its dependencies; every package's version is listed in the
# root's /outbox-packages). The stamp hashes the suite, the mirror, the pinned packages and
# r4_make_root: change one and the next run makes a new root (and removes the old ones: a single
# broker runs on these ports).
#
# How it runs: chroot into the root, in a mount namespace of its own (unshare --mount), where
# /proc and (read-only) /sys are mounted, the host's /etc/hosts and /etc/resolv.conf are bound in, and the
# node's folder, $OUTBOX_CACHE/rabbitmq4 (config, data, logs, the TLS copies, the Erlang cookie),
# is bound at /outbox: the root itself is only read, and every mount goes with the namespace's
# last process. The node is rabbit4@$(hostname -s), on an Erlang port mapper of its own
# (RABBITMQ4_EPMD_PORT, so it never meets 3.10's on 4369) and a distribution port of its own;
# AMQP 0-9-1 and 1.0 (core in 4.x) on RABBITMQ4_PORT, AMQPS with the test CA's server certificate
# and certificate login (EXTERNAL, user outbox_cert) on RABBITMQ4_TLS_PORT, on 127.0.0.1, ::1 and
# the pods' address; guest may log in from the pods, as on 3.10; no management plugin.

RABBITMQ4_SUITE=trixie
RABBITMQ4_MIRROR=http://deb.debian.org/debian
# What the root gets, pinned to the version Debian 13 ships (rabbitmq-server 4.0.5, Erlang 27.3).
RABBITMQ4_PACKAGES=(rabbitmq-server=4.0.5-6+deb13u2)
r4_cache="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}"
r4_dir="$r4_cache/rabbitmq4"
r4_node="rabbit4@$(hostname -s)"

# What it says goes to stderr: stdout carries the URL alone.
r4_say() { echo "$*" >&2; }
r4_up() { (exec 3<>"/dev/tcp/127.0.0.1/$RABBITMQ4_PORT") 2>/dev/null; }
r4_tls_up() { (exec 3<>"/dev/tcp/127.0.0.1/$RABBITMQ4_TLS_PORT") 2>/dev/null; }
r4_root() { echo "$r4_cache/debian13-root-$RABBITMQ4_ROOT_VERSION"; }

# r4_enter ROOT COMMAND...: COMMAND inside ROOT (chroot), in a mount namespace of its own with
# /proc, /sys, the host's /etc/hosts and /etc/resolv.conf, and $r4_dir at /outbox.
r4_enter() {
  local root=$1
  shift
  mkdir -p "$r4_dir"
  # shellcheck disable=SC2016 # $1, $2 and $@ belong to the inner shell
  as_root unshare --mount --propagation private -- /bin/sh -c '
    root=$1 data=$2
    shift 2
    mount -t proc proc "$root/proc" && mount -t sysfs -o ro sysfs "$root/sys" &&
      mount --bind /etc/hosts "$root/etc/hosts" && mount --bind /etc/resolv.conf "$root/etc/resolv.conf" &&
      mount --bind "$data" "$root/outbox" || exit 1
    exec chroot "$root" "$@"' sh "$root" "$r4_dir" "$@"
}

# r4_make_root DIR: the Debian 13 root, RabbitMQ installed; the caller moves it into place.
r4_make_root() {
  local root=$1
  as_root debootstrap --variant=minbase "$RABBITMQ4_SUITE" "$root" "$RABBITMQ4_MIRROR"
  as_root mkdir -p "$root/outbox"
  as_root touch "$root/etc/hosts" "$root/etc/resolv.conf"
  # Packages install without starting anything: no init here, the node runs as start_rabbitmq4 says.
  printf '#!/bin/sh\nexit 101\n' | as_root tee "$root/usr/sbin/policy-rc.d" >/dev/null
  as_root chmod 755 "$root/usr/sbin/policy-rc.d"
  r4_enter "$root" apt-get update -qq
  r4_enter "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${RABBITMQ4_PACKAGES[@]}" >/dev/null
  r4_enter "$root" apt-get clean
  # shellcheck disable=SC2016 # dpkg-query's fields, not the shell's
  r4_enter "$root" dpkg-query -W -f '${Package} ${Version}\n' | as_root tee "$root/outbox-packages" >/dev/null
}

# r4_run COMMAND...: COMMAND inside the root with the node's environment (the server and its CLI
# tools alike); nothing of the caller's environment goes in.
# The root is this stamp's, or r4_use_root (r4_stop: the root the node was started from).
r4_run() {
  r4_enter "${r4_use_root:-$(r4_root)}" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/outbox/home \
    RABBITMQ_CONF_ENV_FILE=/dev/null RABBITMQ_NODENAME="$r4_node" RABBITMQ_NODE_PORT="$RABBITMQ4_PORT" \
    RABBITMQ_DIST_PORT="$RABBITMQ4_DIST_PORT" ERL_EPMD_PORT="$RABBITMQ4_EPMD_PORT" \
    RABBITMQ_CONFIG_FILE=/outbox/rabbitmq.conf RABBITMQ_MNESIA_BASE=/outbox/mnesia RABBITMQ_LOG_BASE=/outbox/log \
    RABBITMQ_PID_FILE=/outbox/pid RABBITMQ_ENABLED_PLUGINS_FILE=/outbox/enabled_plugins \
    ERL_CRASH_DUMP=/outbox/log/erl_crash.dump \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none" "$@"
}

# r4_cli TOOL ARG...: rabbitmqctl, rabbitmq-diagnostics, rabbitmq-plugins or rabbitmq-queues
# against the node.
r4_cli() {
  local tool=${1:-}
  case "$tool" in
    rabbitmqctl | rabbitmq-diagnostics | rabbitmq-plugins | rabbitmq-queues) shift ;;
    *) echo "usage: scripts/services.sh rabbitmq4-cli rabbitmqctl|rabbitmq-diagnostics|rabbitmq-plugins|rabbitmq-queues ARG..." >&2
      exit 2 ;;
  esac
  [ -d "${r4_use_root:-$(r4_root)}" ] ||
    { echo "RabbitMQ 4's root ${r4_use_root:-$(r4_root)} is not made: run scripts/services.sh rabbitmq4" >&2; exit 1; }
  r4_run "/usr/lib/rabbitmq/bin/$tool" -n "$r4_node" "$@"
}

# The node's config: listeners on its own ports, the test CA's certificate, certificate login.
r4_config() {
  printf '%s\n' "# scripts/services/rabbitmq4.sh writes this file at each start" \
    "listeners.tcp.loopback = 127.0.0.1:$RABBITMQ4_PORT" \
    "listeners.tcp.loopback_v6 = ::1:$RABBITMQ4_PORT" \
    "listeners.tcp.pods = $SERVICES_ADDRESS:$RABBITMQ4_PORT" \
    "listeners.ssl.loopback = 127.0.0.1:$RABBITMQ4_TLS_PORT" \
    "listeners.ssl.loopback_v6 = ::1:$RABBITMQ4_TLS_PORT" \
    "listeners.ssl.pods = $SERVICES_ADDRESS:$RABBITMQ4_TLS_PORT" \
    "# guest may log in from the pods: the listeners are this machine's addresses only" \
    "loopback_users = none" \
    "ssl_options.cacertfile = /outbox/tls/ca.pem" \
    "ssl_options.certfile = /outbox/tls/server.pem" \
    "ssl_options.keyfile = /outbox/tls/server.key" \
    "ssl_options.verify = verify_peer" \
    "ssl_options.fail_if_no_peer_cert = false" \
    "ssl_cert_login_from = common_name" \
    "auth_mechanisms.1 = PLAIN" \
    "auth_mechanisms.2 = AMQPLAIN" \
    "auth_mechanisms.3 = EXTERNAL" \
    "log.console = false" \
    "log.file.level = info"
}

# The root, made when its stamp's folder is missing. Made under a temporary name and moved into
# place whole: a make cut short leaves nothing that looks made.
r4_ensure_root() {
  local root
  root=$(r4_root)
  [ -f "$root/outbox-packages" ] && return 0
  command -v debootstrap >/dev/null || apt_install debootstrap
  r4_stop
  local started=$SECONDS old
  r4_say "making a Debian 13 root for RabbitMQ 4 in $root (debootstrap $RABBITMQ4_SUITE, ${RABBITMQ4_PACKAGES[*]})"
  as_root rm -rf "$root.tmp"
  if ! r4_make_root "$root.tmp" >"$r4_cache/debian13-root.log" 2>&1; then
    tail -n 30 "$r4_cache/debian13-root.log" >&2
    echo "could not make the Debian 13 root (log: $r4_cache/debian13-root.log)" >&2; exit 1
  fi
  as_root mv "$root.tmp" "$root"
  # A root of another stamp is no longer used: one broker runs on these ports.
  for old in "$r4_cache"/debian13-root-*; do
    [ "$old" = "$root" ] || [ ! -d "$old" ] || as_root rm -rf "$old"
  done
  r4_say "made $root in $((SECONDS - started)) s ($(du -sm "$root" | cut -f1) MB):" \
    "$(grep -E '^(rabbitmq-server|erlang-base) ' "$root/outbox-packages" | paste -sd' ')"
}

# The node's folder: its data belongs to the root it ran from (another RabbitMQ or Erlang may not
# read it), the config and the TLS copies to this script and the test CA. Sets r4_changed to 1
# when a running node must restart to see a change.
r4_changed=0
r4_prepare() {
  mkdir -p "$r4_dir/home" "$r4_dir/log" "$r4_dir/mnesia" "$r4_dir/tls"
  if [ "$(cat "$r4_dir/.root" 2>/dev/null)" != "$RABBITMQ4_ROOT_VERSION" ]; then
    rm -rf "${r4_dir:?}/mnesia" "${r4_dir:?}/log" "$r4_dir/.users"
    mkdir -p "$r4_dir/log" "$r4_dir/mnesia"
    echo "$RABBITMQ4_ROOT_VERSION" >"$r4_dir/.root"
  fi
  if [ ! -s "$r4_dir/home/.erlang.cookie" ]; then
    head -c 32 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$r4_dir/home/.erlang.cookie"
    chmod 400 "$r4_dir/home/.erlang.cookie"
  fi
  # The test CA as the other servers have it (made here only on a machine without one).
  [ -f "$tls_dir/server.pem" ] || setup_tls
  if ! tls_copy_current "$r4_dir/tls"; then
    cp "$tls_dir/server.pem" "$tls_dir/server.key" "$tls_dir/ca.pem" "$r4_dir/tls/"
    chmod 600 "$r4_dir/tls/server.key"
    r4_changed=1
  fi
  if [ "$(r4_config)" != "$(cat "$r4_dir/rabbitmq.conf" 2>/dev/null)" ]; then
    r4_config >"$r4_dir/rabbitmq.conf"
    r4_changed=1
  fi
  if [ "$(cat "$r4_dir/enabled_plugins" 2>/dev/null)" != "[rabbitmq_auth_mechanism_ssl]." ]; then
    echo "[rabbitmq_auth_mechanism_ssl]." >"$r4_dir/enabled_plugins"
    r4_changed=1
  fi
}

start_rabbitmq4() {
  mkdir -p "$r4_cache"
  exec 9>"$r4_cache/rabbitmq4.lock"
  flock 9
  setup_services_address
  r4_ensure_root
  r4_prepare
  if [ "$r4_changed" = 1 ] && r4_up; then
    r4_say "RabbitMQ 4: restarting for a new config or certificate"
    r4_stop
  fi
  if ! r4_up; then
    local started=$SECONDS
    r4_say "starting RabbitMQ 4 ($r4_node, from $(r4_root))"
    rm -f "$r4_dir/pid"
    r4_root >"$r4_dir/.running"
    # The lock's descriptor is closed for the node: a daemon holding it would block every later run.
    r4_run setsid /usr/lib/rabbitmq/bin/rabbitmq-server >"$r4_dir/log/console.log" 2>&1 </dev/null 9>&- &
    if ! r4_cli rabbitmqctl -q wait /outbox/pid --timeout 180 >/dev/null 2>&1; then
      tail -n 20 "$r4_dir/log/console.log" >&2 || true
      echo "RabbitMQ 4 did not start (logs: $r4_dir/log)" >&2; exit 1
    fi
    for _ in $(seq 1 30); do r4_up && r4_tls_up && break; sleep 1; done
    r4_cli rabbitmq-diagnostics -q check_port_connectivity >/dev/null ||
      { echo "RabbitMQ 4 runs but does not listen on its ports (logs: $r4_dir/log)" >&2; exit 1; }
    r4_say "RabbitMQ 4 started in $((SECONDS - started)) s"
  fi
  # The certificate-login user (no password: only EXTERNAL lets it in), once per node's data.
  if [ ! -f "$r4_dir/.users" ]; then
    if ! r4_cli rabbitmqctl -q list_users 2>/dev/null | grep -q '^outbox_cert\b'; then
      r4_cli rabbitmqctl -q add_user outbox_cert "$(head -c 24 /dev/urandom | base64)" >/dev/null
      r4_cli rabbitmqctl -q clear_password outbox_cert >/dev/null
      r4_cli rabbitmqctl -q set_permissions -p / outbox_cert '.*' '.*' '.*' >/dev/null
    fi
    touch "$r4_dir/.users"
  fi
  amqp10_up 127.0.0.1 "$RABBITMQ4_PORT" ||
    { echo "RabbitMQ 4 does not answer AMQP 1.0 on 127.0.0.1:$RABBITMQ4_PORT" >&2; exit 1; }
  r4_say "RabbitMQ 4 ($(sed -n 's/^rabbitmq-server //p' "$(r4_root)/outbox-packages"), $r4_node) on 127.0.0.1 and" \
    "$SERVICES_ADDRESS: AMQP 0-9-1 and 1.0 on :$RABBITMQ4_PORT, AMQPS on :$RABBITMQ4_TLS_PORT (guest/guest;" \
    "EXTERNAL for outbox_cert) is up"
  echo "amqp://guest:guest@127.0.0.1:$RABBITMQ4_PORT/%2f"
}

# Stops the node and its port mapper, with the CLI of the root it runs from (after a new stamp,
# an older one); returns once the VM is gone.
r4_stop() {
  local pid r4_use_root
  r4_use_root=$(cat "$r4_dir/.running" 2>/dev/null) || r4_use_root=$(r4_root)
  pid=$(cat "$r4_dir/pid" 2>/dev/null) || pid=""
  # Only a VM in one of our roots is the node: a pid file left from before a reboot may name a
  # stranger now.
  case "$(readlink "/proc/$pid/root" 2>/dev/null)" in
    "$r4_cache"/debian13-root-*) ;;
    *) pid="" ;;
  esac
  if [ -n "$pid" ] || r4_up; then
    if [ -d "$r4_use_root" ]; then
      r4_cli rabbitmqctl -q stop >/dev/null 2>&1 || true
    fi
    if [ -n "$pid" ]; then
      for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      # Still there (or not ours to ask: a root since removed).
      if kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      fi
    fi
  fi
  rm -f "$r4_dir/pid"
  # The port mapper the node started, on a port of its own: nothing else registers there.
  if [ -d "$r4_use_root" ] && (exec 3<>"/dev/tcp/127.0.0.1/$RABBITMQ4_EPMD_PORT") 2>/dev/null; then
    r4_run epmd -kill >/dev/null 2>&1 || true
  fi
}

stop_rabbitmq4() {
  mkdir -p "$r4_cache"
  exec 9>"$r4_cache/rabbitmq4.lock"
  flock 9
  r4_stop
  r4_say "RabbitMQ 4 ($r4_node) is stopped"
}

# The root's folder on stdout, made first when missing (under the broker's lock: one make at a time).
rabbitmq4_root() {
  mkdir -p "$r4_cache"
  exec 9>"$r4_cache/rabbitmq4.lock"
  flock 9
  r4_ensure_root
  r4_root
}

# The root's stamp: a change to the suite, the mirror, the pinned packages or r4_make_root makes
# a new root on the next run.
RABBITMQ4_ROOT_VERSION=$(stamp r4_make_root -- "$RABBITMQ4_SUITE" "$RABBITMQ4_MIRROR" "${RABBITMQ4_PACKAGES[@]}")

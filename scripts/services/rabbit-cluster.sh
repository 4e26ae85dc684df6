# shellcheck shell=bash
# The three-node RabbitMQ cluster. Sourced by scripts/services.sh.

# A three-node RabbitMQ cluster beside the tests' broker, for the tests of a broker node list and
# quorum queues (issue 44; only those tests start it, never the plain run of this script):
#   scripts/services.sh rabbit-cluster          start it (once made, joined; idempotent when up)
#   scripts/services.sh rabbit-cluster-node stop|kill|start N
#                                               stop one node gracefully, SIGKILL it, or start it
#   scripts/services.sh rabbit-cluster-queue Q [ONLINE [SECONDS]]
#                                               wait until quorum queue Q has a leader and ONLINE (3) members online
#   scripts/services.sh stop-rabbit-cluster     stop every node
# Nodes rt1..rt3@$(hostname -s), AMQP on 127.0.0.1 from RABBIT_CLUSTER_FIRST_PORT on (rc_port),
# distribution RABBIT_CLUSTER_DIST_PORT_OFFSET above, data under $OUTBOX_CACHE/rabbit-cluster,
# one HOME there for the shared Erlang cookie. The nodes run /usr/lib/rabbitmq/bin/rabbitmq-server
# itself (the /usr/sbin wrapper switches user and writes under /var/log), each with a config file
# of its own: the system's rabbitmq.conf pins RABBITMQ_PORT, and in 3.10 listeners.tcp wins over
# RABBITMQ_NODE_PORT.
rabbit_cluster_dir="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}/rabbit-cluster"
rabbit_cluster_host=$(hostname -s)

rc_port() { echo $((RABBIT_CLUSTER_FIRST_PORT - 1 + $1)); }
rc_node_up() { (exec 3<>"/dev/tcp/127.0.0.1/$(rc_port "$1")") 2>/dev/null; }
# rc_env N COMMAND...: COMMAND with node N's environment.
rc_env() {
  local n=$1 dir="$rabbit_cluster_dir/rt$1" port
  port=$(rc_port "$1")
  shift
  env HOME="$rabbit_cluster_dir/home" RABBITMQ_CONF_ENV_FILE=/dev/null \
    RABBITMQ_NODENAME="rt$n@$rabbit_cluster_host" RABBITMQ_NODE_PORT="$port" \
    RABBITMQ_DIST_PORT=$((RABBIT_CLUSTER_DIST_PORT_OFFSET + port)) RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
    RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log" RABBITMQ_PID_FILE="$dir/pid" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+S 1:1 +A 4" "$@"
}
rc_ctl() { local n=$1; shift; rc_env "$n" /usr/lib/rabbitmq/bin/rabbitmqctl -q -n "rt$n@$rabbit_cluster_host" "$@"; }

rc_start_node() {
  local n=$1 dir="$rabbit_cluster_dir/rt$1"
  rc_node_up "$n" && return 0
  mkdir -p "$dir/log" "$dir/mnesia"
  # The lock's descriptor is closed for the node: a daemon holding it would block every later run.
  rc_env "$n" setsid /usr/lib/rabbitmq/bin/rabbitmq-server >"$dir/log/console.log" 2>&1 </dev/null 9>&- &
  if ! rc_ctl "$n" wait "$dir/pid" --timeout 120 >/dev/null 2>&1; then
    tail -n 20 "$dir/log/console.log" >&2 || true
    echo "RabbitMQ node rt$n did not start on 127.0.0.1:$(rc_port "$n") (logs: $dir/log)" >&2; exit 1
  fi
  for _ in $(seq 1 30); do rc_node_up "$n" && return 0; sleep 1; done
  echo "RabbitMQ node rt$n runs but does not listen on 127.0.0.1:$(rc_port "$n")" >&2; exit 1
}

# Returns once the node's VM is gone: `rabbitmqctl stop` answers while the VM still shuts down,
# and its quorum queue members keep voting until then.
rc_stop_node() {
  local pid
  rc_node_up "$1" || [ -f "$rabbit_cluster_dir/rt$1/pid" ] || return 0
  pid=$(cat "$rabbit_cluster_dir/rt$1/pid" 2>/dev/null) || pid=""
  rc_ctl "$1" stop >/dev/null 2>&1 || true
  if [ -n "$pid" ]; then
    for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  fi
  rm -f "$rabbit_cluster_dir/rt$1/pid"
}

rc_kill_node() {
  local pid
  pid=$(cat "$rabbit_cluster_dir/rt$1/pid" 2>/dev/null) || return 0
  # The beam's command line names the cluster's HOME, not the node: enough to know it is ours.
  # shellcheck disable=SC2015 # kill only ours; neither a stranger's pid nor a gone one is an error
  tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "-home $rabbit_cluster_dir/home" && kill -9 "$pid" 2>/dev/null || true
  for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  rm -f "$rabbit_cluster_dir/rt$1/pid"
}

start_rabbit_cluster() {
  command -v /usr/lib/rabbitmq/bin/rabbitmq-server >/dev/null || install_missing
  setup_services_address
  mkdir -p "$rabbit_cluster_dir"
  exec 9>"$rabbit_cluster_dir.lock"
  flock 9
  if [ "$(cat "$rabbit_cluster_dir/.joined" 2>/dev/null)" != "$RABBIT_CLUSTER_VERSION" ]; then
    echo "making a three-node RabbitMQ cluster in $rabbit_cluster_dir"
    local n
    for n in 1 2 3; do rc_kill_node "$n"; done
    rm -rf "${rabbit_cluster_dir:?}"/rt? "${rabbit_cluster_dir:?}/home"
    mkdir -p "$rabbit_cluster_dir/home"
    # Written before the nodes start, so that three starting at once do not race to make it.
    head -c 32 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$rabbit_cluster_dir/home/.erlang.cookie"
    chmod 400 "$rabbit_cluster_dir/home/.erlang.cookie"
    for n in 1 2 3; do
      mkdir -p "$rabbit_cluster_dir/rt$n"
      # On the services address too, where the tests' pods reach the nodes.
      printf '%s\n' "listeners.tcp.default = 127.0.0.1:$(rc_port "$n")" \
        "listeners.tcp.pods = $SERVICES_ADDRESS:$(rc_port "$n")" "loopback_users = none" \
        "log.console = false" "log.file.level = warning" >"$rabbit_cluster_dir/rt$n/rabbitmq.conf"
      echo '[].' >"$rabbit_cluster_dir/rt$n/enabled_plugins"
    done
    rc_start_node 1
    for n in 2 3; do
      rc_start_node "$n"
      # join_cluster prints harmless feature-flag errors on 3.10.
      { rc_ctl "$n" stop_app && rc_ctl "$n" reset && rc_ctl "$n" join_cluster "rt1@$rabbit_cluster_host" \
        && rc_ctl "$n" start_app; } >/dev/null 2>&1 || { echo "node rt$n could not join rt1" >&2; exit 1; }
    done
    echo "$RABBIT_CLUSTER_VERSION" >"$rabbit_cluster_dir/.joined"
  fi
  # Nodes that were stopped start side by side: a node waits for the peers it last saw.
  local pids=() n
  for n in 1 2 3; do rc_start_node "$n" & pids+=("$!"); done
  for n in "${pids[@]}"; do wait "$n" || exit 1; done
  rc_await_cluster
  echo "RabbitMQ cluster: rt1..rt3@$rabbit_cluster_host on 127.0.0.1:$(rc_port 1)-$(rc_port 3) (guest/guest) is up"
}

# A node answers on its AMQP port before its peers count it as running again (after a kill -9,
# mnesia may even see a partition for a while). A quorum queue declared then gets members only on
# the nodes seen running, and losing one of two loses its majority: wait until every node sees
# all three running and no partition.
rc_await_cluster() {
  local n view try
  for try in $(seq 1 120); do
    [ "$try" = 1 ] || sleep 0.5
    for n in 1 2 3; do
      view=$(rc_ctl "$n" cluster_status --formatter json 2>/dev/null |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(len(set(d.get("running_nodes", []))), len(d.get("partitions") or {}))' 2>/dev/null) || view=""
      [ "$view" = "3 0" ] || continue 2
    done
    return 0
  done
  echo "RabbitMQ cluster: a node does not see the other two running, or sees a partition, after 60 s:" >&2
  for n in 1 2 3; do rc_ctl "$n" cluster_status >&2 2>&1 || true; done
  exit 1
}

# Waits until quorum queue $1 has a leader and $2 members online (default 3: all of them), for
# ${3:-60} s at most. Asks the first node that answers: after a loss, not necessarily node 1.
rc_await_queue() {
  local state want=${2:-3} tries=$(( ${3:-60} * 2 )) n
  for _ in $(seq 1 "$tries"); do
    state=""
    for n in 1 2 3; do
      rc_node_up "$n" || continue
      state=$(rc_ctl "$n" list_queues name members online leader --formatter json 2>/dev/null |
        python3 -c 'import json,sys
q=[q for q in json.load(sys.stdin) if q["name"]==sys.argv[1]]
print("members=%d online=%d leader=%s" % (len(q[0]["members"]), len(q[0]["online"]), q[0]["leader"] if q[0]["leader"] in q[0]["online"] else "none") if q else "missing")' "$1" 2>/dev/null) && break
    done
    case "$state" in "members=3 online=$want leader=rt"*) return 0 ;; esac
    sleep 0.5
  done
  echo "quorum queue $1 has no leader with $want members online after ${3:-60} s: ${state:-no answer}" >&2
  exit 1
}

# The cluster's stamp: when its set-up (start_rabbit_cluster, the nodes' environment and ports)
# changes, the cluster is made again.
RABBIT_CLUSTER_VERSION=$(stamp start_rabbit_cluster rc_env rc_port -- "$SERVICES_ADDRESS" "$RABBIT_CLUSTER_FIRST_PORT" \
  "$RABBIT_CLUSTER_DIST_PORT_OFFSET")

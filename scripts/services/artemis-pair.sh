# shellcheck shell=bash
# shellcheck disable=SC2154 # variables set in another of the files scripts/services.sh sources
# An ActiveMQ Artemis primary/backup pair of one test's own. Sourced by scripts/services.sh.

# An ActiveMQ Artemis primary/backup pair of one test's own, on a shared store (issue 44):
#   scripts/services.sh artemis-pair DIR PRIMARY_PORT BACKUP_PORT
#       makes (once; kept for the next run) the instances DIR/primary and DIR/backup, both with
#       their journal in DIR/shared, and starts them fresh (the journal emptied): the primary
#       answers AMQP 1.0 on 127.0.0.1:PRIMARY_PORT; the backup takes the backup lock and waits.
#       A waiting backup does not listen at all (its acceptors start when it activates): a
#       connect to BACKUP_PORT is refused until the primary is gone. The backup activates when
#       it gets the primary's lock on the journal: at once when the primary dies (the kernel
#       drops a dead process's file locks), and on a graceful stop because both are made with
#       failover-on-shutdown (without it a stopping primary leaves the store "paused" and the
#       backup keeps waiting).
#   scripts/services.sh artemis-pair-stop DIR primary|backup [--kill]
#       stops one member (SIGTERM: a graceful shutdown; with --kill: SIGKILL, as a crash)
#   scripts/services.sh artemis-pair-drop DIR
#       SIGKILLs both and empties the journal (the instances stay, for the next pair)
# Each member has a core acceptor ARTEMIS_CORE_PORT_OFFSET above its port, for the cluster
# connection that pairs them (static connectors to each other: artemis create --shared-store
# implies a cluster, by default found by UDP multicast, which would join every pair on this
# machine into one).

# create_pair_member DIR ROLE PORT OTHER_PORT SHARED: the instance of one member.
create_pair_member() {
  local dir=$1 role=$2 port=$3 other=$4 shared=$5
  local core=$((port + ARTEMIS_CORE_PORT_OFFSET)) other_core=$((other + ARTEMIS_CORE_PORT_OFFSET))
  local marker="pair-$ARTEMIS_PAIR_VERSION $role $port $other $shared" backup=() xml="$1/etc/broker.xml"
  [ "$(cat "$dir/.outbox-relay" 2>/dev/null)" = "$marker" ] && return 0
  [ "$role" = backup ] && backup=(--backup)
  echo "creating the Artemis $role instance $dir"
  rm -rf "$dir"
  mkdir -p "$(dirname "$dir")"
  if ! "$artemis_home/bin/artemis" create --silent --user outbox --password outbox --allow-anonymous \
    --host 127.0.0.1 --name "outbox-pair-$role" --mapped --no-fsync --java-memory 128M --no-web --no-autotune \
    --no-hornetq-acceptor --no-mqtt-acceptor --no-stomp-acceptor \
    --shared-store "${backup[@]}" --failover-on-shutdown --data "$shared" \
    --default-port "$core" --static-cluster "tcp://127.0.0.1:$other_core" \
    --cluster-user outbox-cluster --cluster-password outbox-cluster "$dir" >"$dir.create.log" 2>&1; then
    tail -n 20 "$dir.create.log" >&2; echo "artemis create failed (log: $dir.create.log)" >&2; exit 1
  fi
  # AMQP 1.0 alone on PORT, the core protocol alone on its core port; as on the tests' broker, no
  # halt on a slow machine and no blocked producers on a nearly full disk.
  sed -i \
    -e "/<acceptor name=\"amqp\">/s|tcp://127.0.0.1:5672?|tcp://127.0.0.1:$port?|" \
    -e '/<acceptor name="artemis">/s|protocols=[A-Z,]*|protocols=CORE|' \
    -e 's|<critical-analyzer-policy>HALT<|<critical-analyzer-policy>LOG<|' \
    -e 's|<max-disk-usage>90<|<max-disk-usage>-1<|' \
    "$xml"
  sed -i 's|-Xms512M|-Xms64M|' "$dir/etc/artemis.profile"
  if ! grep -q "\"amqp\">tcp://127.0.0.1:$port?" "$xml" || ! grep -q "\"artemis\">tcp://127.0.0.1:$core?" "$xml" \
    || ! grep -q "tcp://127.0.0.1:$other_core<" "$xml" || ! grep -q "<$role>" "$xml" \
    || ! grep -q '<failover-on-shutdown>true<' "$xml" || ! grep -q "<journal-directory>$shared/journal<" "$xml"; then
    echo "could not configure $xml" >&2; exit 1
  fi
  echo "$marker" >"$dir/.outbox-relay"
}

artemis_pair_drop() {
  local pair=$1
  stop_private_artemis "$pair/backup" --kill
  stop_private_artemis "$pair/primary" --kill
  rm -rf "$pair/shared"
}

artemis_pair() {
  local pair=$1 primary_port=$2 backup_port=$3 second pid
  case "$primary_port:$backup_port" in *[!0-9:]* | :* | *:) echo "artemis-pair: the ports must be numbers" >&2; exit 2 ;; esac
  install_artemis
  artemis_pair_drop "$pair"
  create_pair_member "$pair/primary" primary "$primary_port" "$backup_port" "$pair/shared"
  create_pair_member "$pair/backup" backup "$backup_port" "$primary_port" "$pair/shared"
  mkdir -p "$pair/shared"
  launch_artemis "$pair/primary"
  for second in $(seq 1 90); do
    amqp10_up 127.0.0.1 "$primary_port" && break
    pid=$(cat "$pair/primary/data/artemis.pid" 2>/dev/null || echo 0)
    if [ "$second" = 90 ] || { [ "$second" -gt 2 ] && ! kill -0 "$pid" 2>/dev/null; }; then
      tail -n 30 "$pair/primary/log/console.log" >&2 || true
      echo "the Artemis primary in $pair/primary did not answer on 127.0.0.1:$primary_port" >&2; exit 1
    fi
    sleep 1
  done
  # Started second, so that the primary holds the store: the backup then says it waits.
  launch_artemis "$pair/backup"
  for second in $(seq 1 90); do
    grep -q AMQ221109 "$pair/backup/log/console.log" 2>/dev/null && return 0
    pid=$(cat "$pair/backup/data/artemis.pid" 2>/dev/null || echo 0)
    [ "$second" -gt 2 ] && ! kill -0 "$pid" 2>/dev/null && break
    sleep 1
  done
  tail -n 30 "$pair/backup/log/console.log" >&2 || true
  echo "the Artemis backup in $pair/backup did not start waiting for its primary (AMQ221109)" >&2; exit 1
}

artemis_pair_command() {
  local pair
  # The absolute path, as the members' command lines carry it (stop_private_artemis checks).
  mkdir -p "${2:?DIR}"
  pair=$(cd "$2" && pwd)
  case "$1" in
    artemis-pair) artemis_pair "$pair" "${3:?PRIMARY_PORT}" "${4:?BACKUP_PORT}" ;;
    artemis-pair-stop)
      case "${3:-}" in primary | backup) ;; *) echo "usage: $0 artemis-pair-stop DIR primary|backup [--kill]" >&2; exit 2 ;; esac
      stop_private_artemis "$pair/$3" "${4:-}" ;;
    artemis-pair-drop) artemis_pair_drop "$pair" ;;
    *) echo "unknown command $1" >&2; exit 2 ;;
  esac
}

# The members' stamp: when create_pair_member or the offset of their core ports changes, the
# instances are made again.
ARTEMIS_PAIR_VERSION=$(stamp create_pair_member -- "$ARTEMIS_CORE_PORT_OFFSET")

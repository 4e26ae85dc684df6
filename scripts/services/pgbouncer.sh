# shellcheck shell=bash
# shellcheck disable=SC2154 # variables set in another of the files scripts/services.sh sources
# PgBouncer in front of the main cluster. Sourced by scripts/services.sh.

pgbouncer_up() { (exec 3<>"/dev/tcp/127.0.0.1/$PGBOUNCER_PORT") 2>/dev/null; }

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
      "session = host=127.0.0.1 port=$PG_PORT dbname=test pool_mode=session" \
      "transaction = host=127.0.0.1 port=$PG_PORT dbname=test pool_mode=transaction" \
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

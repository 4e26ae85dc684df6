# shellcheck shell=bash
# shellcheck disable=SC2034 # variables set here, read in the other files scripts/services.sh sources
# The test CA and the certificates the servers use. Sourced by scripts/services.sh.

# TLS and real authentication, set up the way managed services are (beside the trust roles most
# tests use): a test CA under $tls_dir signs the servers' certificates (IP 127.0.0.1 and the
# services address the pods use, so `localhost` is a wrong host name) and a client certificate
# for the certificate-login role. TLS_VERSION, their stamp, is at the end of this file.
tls_dir="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}/tls"
PG_TLS_ONLY_PASSWORD='p@ss:w/rd %?&#tls'  # every character a URL must percent-encode
PG_MD5_PASSWORD='md5-Pw/with:colon'

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

# The stamp of the test CA and of every TLS set-up that copies it (the main cluster's, PgBouncer's,
# RabbitMQ's, the other majors'): a change to setup_tls, configure_postgres_tls (and the rules it
# writes), configure_rabbitmq_tls or start_pgbouncer, or to what they read, makes them all again.
# Those functions are defined first (scripts/services.sh sources this file after theirs).
TLS_VERSION=$(stamp setup_tls configure_postgres_tls pg_tls_hba_rules configure_rabbitmq_tls start_pgbouncer \
  -- "$SERVICES_ADDRESS" "$NODES_NETWORK" "$PG_PORT" "$PGBOUNCER_PORT" "$RABBITMQ_PORT" "$RABBITMQ_TLS_PORT" \
  "$PG_TLS_ONLY_PASSWORD" "$PG_MD5_PASSWORD")

# shellcheck shell=bash
# shellcheck disable=SC2154 # variables set in another of the files scripts/services.sh sources
# RabbitMQ, the tests' broker (AMQP 0-9-1 and 1.0 on RABBITMQ_PORT, AMQPS on RABBITMQ_TLS_PORT).
# Sourced by scripts/services.sh.

rabbit_up() { (exec 3<>"/dev/tcp/127.0.0.1/$RABBITMQ_PORT") 2>/dev/null; }

start_rabbitmq() {
  rabbit_up && return 0
  # Enabled before the start (offline: no node to talk to yet), the plugin comes up with the node.
  as_root rabbitmq-plugins -q --offline enable rabbitmq_amqp1_0 >/dev/null || true
  echo "starting RabbitMQ"
  as_root rabbitmq-server -detached
  for _ in $(seq 1 60); do rabbit_up && { sleep 1; return 0; }; sleep 1; done
  echo "RabbitMQ did not start" >&2; exit 1
}

rabbit_tls_up() { (exec 3<>"/dev/tcp/127.0.0.1/$RABBITMQ_TLS_PORT") 2>/dev/null; }

# AMQPS beside plain AMQP: the test CA's server certificate, peers verified when
# they present a certificate, and login by certificate (EXTERNAL, the certificate's CN as the
# user name) through rabbitmq_auth_mechanism_ssl, for the user outbox_cert.
configure_rabbitmq_tls() {
  local dir=/etc/rabbitmq/outbox-relay-tls conf=/etc/rabbitmq/rabbitmq.conf
  if [ "$(as_root cat "$dir/.version" 2>/dev/null)" != "$TLS_VERSION" ] || ! tls_copy_current "$dir" \
    || ! as_root grep -q "outbox-relay tls" "$conf" 2>/dev/null \
    || ! as_root grep -q "listeners.tcp.pods = $SERVICES_ADDRESS:$RABBITMQ_PORT" "$conf" 2>/dev/null; then
    echo "RabbitMQ: AMQPS on $RABBITMQ_TLS_PORT with the test CA, certificate login (EXTERNAL), the pods' listeners"
    as_root mkdir -p "$dir"
    as_root cp "$tls_dir/server.pem" "$tls_dir/server.key" "$tls_dir/ca.pem" "$dir/"
    as_root chown -R rabbitmq:rabbitmq "$dir" 2>/dev/null || true
    as_root chmod 640 "$dir/server.key"
    printf '%s\n' "# outbox-relay tls (scripts/services.sh)" \
      "listeners.tcp.loopback = 127.0.0.1:$RABBITMQ_PORT" \
      "listeners.tcp.loopback_v6 = ::1:$RABBITMQ_PORT" \
      "listeners.tcp.pods = $SERVICES_ADDRESS:$RABBITMQ_PORT" \
      "listeners.ssl.loopback = 127.0.0.1:$RABBITMQ_TLS_PORT" \
      "listeners.ssl.loopback_v6 = ::1:$RABBITMQ_TLS_PORT" \
      "listeners.ssl.pods = $SERVICES_ADDRESS:$RABBITMQ_TLS_PORT" \
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
  echo "RabbitMQ does not listen for AMQPS on 127.0.0.1:$RABBITMQ_TLS_PORT (see /etc/rabbitmq/rabbitmq.conf)" >&2; exit 1
}

enable_rabbitmq_amqp10() {
  # In RabbitMQ 3.10 the plugin shares its port with AMQP 0-9-1: the protocol header decides.
  amqp10_up 127.0.0.1 "$RABBITMQ_PORT" && return 0
  echo "enabling RabbitMQ's AMQP 1.0 plugin (rabbitmq_amqp1_0)"
  if ! as_root rabbitmq-plugins -q enable rabbitmq_amqp1_0 >/dev/null; then
    echo "could not enable the plugin. Enable it with:" >&2
    echo "  sudo rabbitmq-plugins enable rabbitmq_amqp1_0" >&2
    exit 1
  fi
  for _ in $(seq 1 30); do amqp10_up 127.0.0.1 "$RABBITMQ_PORT" && return 0; sleep 1; done
  echo "RabbitMQ does not answer AMQP 1.0 on 127.0.0.1:$RABBITMQ_PORT with rabbitmq_amqp1_0 enabled" >&2; exit 1
}

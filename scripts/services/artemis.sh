# shellcheck shell=bash
# ActiveMQ Artemis, the tests' AMQP 1.0 broker, and the private brokers of single tests. Sourced
# by scripts/services.sh.

ARTEMIS_VERSION=2.40.0 # the newest Maven Central serves as a bin archive; runs on Java 17
artemis_dir="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}/artemis/$ARTEMIS_VERSION"
artemis_home="$artemis_dir/apache-artemis-$ARTEMIS_VERSION"
artemis_instance="$artemis_dir/instance"
artemis_pidfile="$artemis_instance/data/artemis.pid"
# The CA that signed the TLS acceptor's certificate, where the tests look for it.
artemis_ca="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}/artemis/tls-ca.pem"

artemis_up() { amqp10_up 127.0.0.1 "$ARTEMIS_PORT"; }
artemis_current() { [ "$(cat "$artemis_instance/.outbox-relay" 2>/dev/null)" = "$ARTEMIS_INSTANCE_VERSION" ]; }
# The pid of the broker this script started, when it still runs (a pid file can outlive a reboot).
artemis_pid() {
  local pid
  pid=$(cat "$artemis_pidfile" 2>/dev/null) && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF "$artemis_instance" \
    && echo "$pid"
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
  # AMQP 1.0 on 127.0.0.1:ARTEMIS_PORT, and on 127.0.0.1:ARTEMIS_MODIFIED_PORT the same broker
  # answers a full address with modified (delivery-failed) instead of rejected, to a sender whose
  # source lists amqp:modified:list. The core acceptor (for the artemis CLI: queue stat, ...)
  # speaks CORE only, on 127.0.0.1:ARTEMIS_CORE_PORT. Each sed line finds its acceptor by the
  # address `artemis create` gives it, on Artemis' own default ports (5672, 61616), as
  # start_private_artemis and the Artemis pairs (tests/src/artemis_pair/member.rs) do.
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

# A private broker: its own instance, AMQP 1.0 on PORT and its core acceptor
# ARTEMIS_CORE_PORT_OFFSET above, started in a session of its own; the pid file is
# DIR/data/artemis.pid.
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
      -e "/<acceptor name=\"artemis\">/s|tcp://127.0.0.1:61616?|tcp://127.0.0.1:$((port + ARTEMIS_CORE_PORT_OFFSET))?|" \
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

# The instance's stamp: when create_artemis or what it reads changes, an instance made by an
# older script is made again.
ARTEMIS_INSTANCE_VERSION=$(stamp create_artemis -- "$ARTEMIS_PORT" "$ARTEMIS_MODIFIED_PORT" "$ARTEMIS_TLS_PORT" \
  "$ARTEMIS_CORE_PORT" "$SERVICES_ADDRESS")

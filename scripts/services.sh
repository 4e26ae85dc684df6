#!/usr/bin/env bash
# Makes sure the test services run locally: PostgreSQL, RabbitMQ (AMQP 0-9-1 and, through its
# rabbitmq_amqp1_0 plugin, AMQP 1.0 on the same port) and ActiveMQ Artemis (AMQP 1.0). Starts them
# when installed, installs what is missing with apt when we are root (Artemis itself comes from
# Maven Central into the cache), or says exactly what to run otherwise.
#   scripts/services.sh               start whatever is not up
#   scripts/services.sh demo          start (installing, once) only what make demo uses: PostgreSQL
#                                     on 127.0.0.1:PG_PORT (database test) and RabbitMQ on
#                                     RABBITMQ_PORT
#   scripts/services.sh postgres-majors
#                                     start (installing, once) only the PostgreSQL servers of the
#                                     other majors, 13 to 18, on 127.0.0.1, port
#                                     PG_MAJORS_BASE_PORT + the major
#   scripts/services.sh stop-artemis  stop the Artemis broker this script started
#   scripts/services.sh artemis-instance DIR PORT
#                                     make (once) and start a private Artemis broker in DIR, AMQP 1.0
#                                     on 127.0.0.1:PORT, for a test that restarts its own broker
#   scripts/services.sh stop-artemis-instance DIR [--kill]
#                                     stop it (with --kill: SIGKILL, as a crash)
#   scripts/services.sh artemis-home
#                                     print where Artemis is installed, downloading it (once) into
#                                     the cache: the Artemis pairs of single tests are made from it
#   scripts/services.sh rabbitmq4 (and rabbitmq4-stop, rabbitmq4-cli TOOL ARG..., rabbitmq4-root)
#                                     make (once) a Debian 13 root with Debian 13's RabbitMQ 4 and
#                                     start it beside 3.10 on RABBITMQ4_PORT (AMQPS on
#                                     RABBITMQ4_TLS_PORT), printing its URL; only the tests that
#                                     need it start it (see scripts/services/rabbitmq4.sh)
#   scripts/services.sh install-registry
#                                     install Debian's docker-registry (once), for the OCI
#                                     registries of make dist (outbox-registry) and of single tests
#
# The code is in scripts/services/, a file per server or concern, sourced here; the servers'
# ports, by the names used above, in scripts/services/ports.env.
# The servers one test starts for itself are the Rust harness's, beside the code that uses them:
# the PostgreSQL standby pairs (tests/src/standby.rs), the Artemis pairs (tests/src/artemis_pair.rs),
# the OCI registries (tests/src/registry.rs; make dist's too, through outbox-registry) and the
# OpenTelemetry Collectors (tests/src/otel_collector.rs; scripts/otel-collector.sh builds the
# collector, as scripts/cosign.sh fetches cosign).
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

services_dir="$(dirname "${BASH_SOURCE[0]}")/services"
# shellcheck source=services/ports.env
. "$services_dir/ports.env"
# shellcheck source=services/common.sh
. "$services_dir/common.sh"
# shellcheck source=services/install.sh
. "$services_dir/install.sh"
# shellcheck source=services/postgres.sh
. "$services_dir/postgres.sh"
# shellcheck source=services/postgres-majors.sh
. "$services_dir/postgres-majors.sh"
# shellcheck source=services/pgbouncer.sh
. "$services_dir/pgbouncer.sh"
# shellcheck source=services/rabbitmq.sh
. "$services_dir/rabbitmq.sh"
# After the files whose functions its stamp (TLS_VERSION) hashes.
# shellcheck source=services/tls.sh
. "$services_dir/tls.sh"
# shellcheck source=services/artemis.sh
. "$services_dir/artemis.sh"
# shellcheck source=services/rabbitmq4.sh
. "$services_dir/rabbitmq4.sh"
# shellcheck source=services/registry.sh
. "$services_dir/registry.sh"

case "${1:-}" in
  "" | postgres-majors | demo) ;;
  install-registry) install_registry; exit 0 ;;
  rabbitmq4) start_rabbitmq4; exit 0 ;;
  rabbitmq4-root) rabbitmq4_root; exit 0 ;;
  rabbitmq4-stop) stop_rabbitmq4; exit 0 ;;
  rabbitmq4-cli) shift; r4_cli "$@"; exit ;;
  stop-artemis) stop_artemis; exit 0 ;;
  artemis-instance) start_private_artemis "${2:?DIR}" "${3:?PORT}"; exit 0 ;;
  stop-artemis-instance) stop_private_artemis "${2:?DIR}" "${3:-}"; exit 0 ;;
  artemis-home) install_artemis >&2; echo "$artemis_home"; exit 0 ;;
  *) echo "usage: $0 [demo | postgres-majors | stop-artemis | artemis-instance DIR PORT | stop-artemis-instance DIR [--kill] | artemis-home | rabbitmq4 | rabbitmq4-stop | rabbitmq4-cli TOOL ARG... | rabbitmq4-root | install-registry]" >&2; exit 2 ;;
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
pg_majors_summary="PostgreSQL $(printf '%s\n' "${PG_MAJORS[@]}" | cut -d' ' -f1 | paste -sd/) on $PGHOST:$(
  for major in "${PG_MAJORS[@]}"; do pg_major_port "${major%% *}"; done | paste -sd/)"
if [ "${1:-}" = postgres-majors ]; then
  { command -v pg_isready && command -v curl && command -v openssl && id postgres; } >/dev/null 2>&1 || install_missing
  setup_tls
  start_pg_majors
  echo "services: $pg_majors_summary (TLS and roles as on :$PG_PORT; listed in $pg_cache/majors) are up"
  exit 0
fi

# make demo: the two servers it uses, nothing of the tests' set-up (TLS, roles, the pods'
# address, the other clusters, PgBouncer, Artemis), which a plain run adds to them later.
if [ "${1:-}" = demo ]; then
  { pg_up && rabbit_up; } || install_missing demo
  start_postgres
  configure_postgres
  start_rabbitmq
  echo "services: PostgreSQL on $PGHOST:$PG_PORT (database test) and RabbitMQ on 127.0.0.1:$RABBITMQ_PORT are up," \
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
echo "services: PostgreSQL on $PGHOST:$PG_PORT (TLS with CA $tls_dir/ca.pem; TLS-only roles outbox_scram," \
  "outbox_md5, outbox_cert), PostgreSQL without TLS on $PGHOST:$PLAIN_PG_PORT," \
  "PostgreSQL with an expired certificate on $PGHOST:$EXPIRED_PG_PORT," \
  "$pg_majors_summary (TLS and roles as on :$PG_PORT; listed in $pg_cache/majors)," \
  "PgBouncer on 127.0.0.1:$PGBOUNCER_PORT (databases session and transaction), RabbitMQ on 127.0.0.1:$RABBITMQ_PORT (AMQP 0-9-1 and 1.0)" \
  "and $RABBITMQ_TLS_PORT (AMQPS; certificate login for outbox_cert)," \
  "ActiveMQ Artemis $ARTEMIS_VERSION on 127.0.0.1:$ARTEMIS_PORT (AMQP 1.0; on :$ARTEMIS_MODIFIED_PORT a full address answers modified;" \
  "on :$ARTEMIS_TLS_PORT TLS, CA $artemis_ca) are up;" \
  "pods reach PostgreSQL (TLS too), PgBouncer, RabbitMQ (AMQPS too) and Artemis (plain AMQP 1.0) on $SERVICES_ADDRESS"

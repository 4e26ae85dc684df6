#!/usr/bin/env bash
# The broker matrix: the tests of the broker's behaviour, once more against RabbitMQ 4.0 (where
# `make test` runs the whole suite against 3.10). services.sh starts 4.0 beside 3.10; each run
# only sets OUTBOX_TEST_BROKER, which the harness's broker helpers read (tests/src/test_broker.rs),
# so a test reads the same whichever broker it meets and asserts what each does differently.
#   scripts/broker-matrix.sh              the list below against RabbitMQ 4.0
#   scripts/broker-matrix.sh FILTER...    only these filters of the services binary
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}

# What the relay asks of the broker, by test (filters of the services binary): publisher confirms
# with two processes, routing keys and message properties; a missing exchange (and vhost); AMQPS
# with the CA file, the host check, certificate login (EXTERNAL) and password refusals; mandatory
# returns, the dead-letter exchange and the dead-letters commands; per-key ordering behind a
# refused message and a late commit; connections cut mid-run (rabbitmqctl); a full quorum queue's
# nacks (x-overflow reject-publish); AMQP 1.0 to a queue and an exchange in each address format
# the broker takes, a missing one, and a full queue; trace context and CloudEvents read back by the SDK over
# AMQP 0-9-1 and 1.0. Left to 3.10: the alarms, the three-node cluster, the once-a-minute causes.
broker_tests=(
  relay_delivery::two_relay_processes relay_delivery::delete_mode
  relay_delivery::messages_carry_the_amqp_properties
  exchange_not_found::a_missing_exchange exchange_not_found::connecting_names
  secure_broker::amqps_trusts secure_broker::a_certificate_for_another_host
  secure_broker::certificate_login secure_broker::twenty_thousand
  relay_faults::poison_rows relay_faults::broker_connections_cut
  dead_letters::two_causes settling_claim::refused_rows
  per_key_ordering::a_refused_message per_key_ordering::a_blocked_key
  per_key_ordering::a_late_commit
  broker_cluster::a_full_reject_publish_queue
  amqp10_delivery::rows_reach_rabbitmq_ amqp10_delivery::an_address_rabbitmq_does_not_have
  amqp10_delivery::a_full_rabbitmq_queue
  trace_context::trace_context_reaches trace_context::cloudevents_binary_mode_is_decoded_by_the_sdk_from_rabbitmq
  trace_context::cloudevents_binary_mode_over_amqp10
)
[ $# -eq 0 ] || broker_tests=("$@")

services=(-p outbox-tests --test services)
# A filter that matches no test would pass unseen (a test renamed): each must match one.
listed=$($CARGO test -q --release "${services[@]}" -- --list "${broker_tests[@]}" | sed -n 's/: test$//p')
for filter in "${broker_tests[@]}"; do
  grep -qF -- "$filter" <<<"$listed" || { echo "broker-matrix: no test of the services binary matches $filter" >&2; exit 1; }
done

started=$SECONDS
./scripts/services.sh rabbitmq4 >/dev/null
echo "== RabbitMQ 4.0: $(wc -l <<<"$listed") tests (broker up in $((SECONDS - started)) s)"
OUTBOX_TEST_BROKER=rabbitmq4 $CARGO test -q --release "${services[@]}" -- --test-threads=4 "${broker_tests[@]}"
echo "broker matrix passed: RabbitMQ 4.0 in $((SECONDS - started)) s"

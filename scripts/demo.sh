#!/usr/bin/env bash
# make demo: a 1,000,000-row outbox relayed to RabbitMQ on this machine, with a consumer that
# counts what arrives. Needs PostgreSQL and RabbitMQ (scripts/services.sh demo) and a release build.
set -euo pipefail
cd "$(dirname "$0")/.."

ROWS=${ROWS:-1000000}
TABLE=${TABLE:-demo_outbox}
WORKERS=${WORKERS:-4}
RELAY="${RELAY:-./target/release/outbox-relay}"
# The relay's log; target/ may not exist when CARGO_TARGET_DIR builds elsewhere.
LOG=${DEMO_LOG:-target/demo-relay.log}
mkdir -p "$(dirname "$LOG")"
# The servers scripts/services.sh demo starts, where it starts them.
# shellcheck source-path=SCRIPTDIR source=services/ports.env
. scripts/services/ports.env
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:$PG_PORT/test}
export AMQP_URL=${AMQP_URL:-amqp://guest:guest@127.0.0.1:$RABBITMQ_PORT/%2f}

echo "== 1. a fresh outbox table with $ROWS rows (the reference article's shape)"
psql "$DATABASE_URL" -qc "DROP TABLE IF EXISTS $TABLE" 2>/dev/null
"$RELAY" seed --table "$TABLE" --create-table --rows "$ROWS"

echo "== 2. the migration: pending-row index, report table, autovacuum, NOTIFY trigger"
"$RELAY" migrate --table "$TABLE" --notify

echo "== 3. a fanout exchange and a durable queue for the counting consumer"
"$RELAY" consume --exchange "$TABLE" --queue "$TABLE.demo" --setup-only --fresh

echo "== 4. the relay ($WORKERS workers, metrics on http://127.0.0.1:9090/metrics) and the consumer"
"$RELAY" run --table "$TABLE" --exchange "$TABLE" --workers "$WORKERS" --metrics-addr 127.0.0.1:9090 \
  --log-format text 2> "$LOG" &
relay_pid=$!
trap 'kill -TERM $relay_pid 2>/dev/null || true' EXIT
started=$(date +%s.%N)
"$RELAY" consume --exchange "$TABLE" --queue "$TABLE.demo" --expect "$ROWS" --distinct
finished=$(date +%s.%N)
kill -TERM "$relay_pid"
wait "$relay_pid" && echo "relay stopped cleanly (exit 0)"
trap - EXIT

echo "== 5. what is left in the table"
"$RELAY" lag --table "$TABLE"
awk -v n="$ROWS" -v a="$started" -v b="$finished" 'BEGIN { printf "relayed %d rows end to end in %.1f s: %.0f rows/s\n", n, b - a, n / (b - a) }'
echo "relay log: $LOG"

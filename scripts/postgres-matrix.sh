#!/usr/bin/env bash
# The PostgreSQL version matrix: the tests that touch PostgreSQL's behaviour, once against each
# major scripts/services.sh runs besides the main server (where `make test` runs the whole
# suite). The servers and their URLs come from the list services.sh writes; each run only
# points DATABASE_URL elsewhere, so a test reads the same whichever server it meets.
#   scripts/postgres-matrix.sh          every major in the list but the main one
#   scripts/postgres-matrix.sh 13 17    only these majors
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
list="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}/postgres/majors"
# The main server's line of the list, as services.sh writes it (the whole suite runs on it).
# shellcheck source-path=SCRIPTDIR source=services/ports.env
. scripts/services/ports.env
main_url=postgres://postgres@127.0.0.1:$PG_PORT/test
[ -s "$list" ] || { echo "$list is missing: run ./scripts/services.sh" >&2; exit 1; }

# What the relay asks of PostgreSQL, by test (names are filters of the services binary): the
# migration (index build and INVALID repair, the report table, autovacuum settings, the NOTIFY
# trigger, the unique-id check), claim and settle in both delivery modes and the settling claim,
# poison rows, per-key ordering's lanes and blocked keys, table health's catalog views, `lag`,
# LISTEN/NOTIFY wake-up, and TLS with SCRAM, md5 and certificate logins.
services_tests=(
  migration:: claim_seek:: settling_claim:: hostile_rows:: reports:: table_health::
  per_key_ordering::a_ relay_delivery::delete_mode relay_delivery::a_listening
  cli::lag cli::migrate_says secure_postgres::scram_md5 secure_postgres::twenty_thousand
)

want=("$@")
ran=()
while read -r major version url; do
  [ "$url" = "$main_url" ] && continue
  if [ ${#want[@]} -gt 0 ] && [[ " ${want[*]} " != *" $major "* ]]; then continue; fi
  echo "== PostgreSQL $version ($url)"
  started=$SECONDS
  DATABASE_URL=$url $CARGO test -q --release -p outbox-tests --test services -- \
    --test-threads=4 "${services_tests[@]}"
  # The operator's database step (PostgresDatabase): migration, reports and health as it reads them.
  DATABASE_URL=$url $CARGO test -q --release -p outbox-operator --test services_postgres_database
  ran+=("$major in $((SECONDS - started)) s")
done <"$list"
[ ${#ran[@]} -gt 0 ] || { echo "no PostgreSQL major to test in $list" >&2; exit 1; }
echo "PostgreSQL matrix passed: ${ran[*]}"

#!/usr/bin/env bash
# End to end on a real Kubernetes cluster (`make e2e-cluster`):
#   install the chart -> Secrets + an OutboxRelay in a fresh namespace -> wait for Ready ->
#   insert rows with psql -> wait until the relay drained them -> clean up.
#
# Needs:
#   KUBECONFIG          a kubeconfig for the cluster (without it the suite is skipped, exit 0)
#   E2E_DATABASE_URL    PostgreSQL URL reachable from the cluster's pods (and from here, for psql)
#   E2E_AMQP_URL        RabbitMQ URL reachable from the cluster's pods
# Optional:
#   E2E_PSQL_URL        the database URL as seen from this machine (default: E2E_DATABASE_URL)
#   E2E_IMAGE_REPOSITORY, E2E_IMAGE_TAG   image of the operator (and so of the relay pods)
#   E2E_IMAGE_PULL_POLICY                 e.g. Never for an image loaded into kind
#   E2E_ROWS (default 1000), E2E_TIMEOUT (seconds per wait, default 300), E2E_KEEP=1 (no cleanup)
#   HELM, KUBECTL       binaries (default: the ones chart-check caches, else from PATH)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHART="$ROOT/charts/outbox-relay-operator"

if [ -z "${KUBECONFIG:-}" ]; then
    echo "e2e-cluster: skipped: KUBECONFIG is not set (give it a kubeconfig, E2E_DATABASE_URL and E2E_AMQP_URL to run)"
    exit 0
fi
if [ ! -r "${KUBECONFIG%%:*}" ]; then
    echo "e2e-cluster: KUBECONFIG=$KUBECONFIG is not a readable file" >&2
    exit 2
fi
: "${E2E_DATABASE_URL:?e2e-cluster: set E2E_DATABASE_URL (PostgreSQL reachable from the cluster)}"
: "${E2E_AMQP_URL:?e2e-cluster: set E2E_AMQP_URL (RabbitMQ reachable from the cluster)}"
PSQL_URL="${E2E_PSQL_URL:-$E2E_DATABASE_URL}"
ROWS="${E2E_ROWS:-1000}"
TIMEOUT="${E2E_TIMEOUT:-300}"

cached_tool() {
    local found
    found="$(find "$ROOT/.cache/chart-check" -path "*/$1/$1" -type f -perm -u+x 2>/dev/null | sort | tail -n 1)"
    if [ -n "$found" ]; then
        echo "$found"
    else
        command -v "$1" || true
    fi
}
HELM="${HELM:-$(cached_tool helm)}"
KUBECTL="${KUBECTL:-$(cached_tool kubectl)}"
for tool in "$HELM" "$KUBECTL"; do
    if [ -z "$tool" ] || [ ! -x "$tool" ]; then
        echo "e2e-cluster: helm and kubectl are needed (run \`make chart-check\` once to cache them)" >&2
        exit 2
    fi
done
if ! command -v psql >/dev/null; then
    echo "e2e-cluster: psql is needed (apt-get install postgresql-client)" >&2
    exit 2
fi

SUFFIX="$(date +%s)-$$"
NS="obr-e2e-$SUFFIX"
OPERATOR_NS="obr-e2e-operator-$SUFFIX"
RELEASE="obr-e2e"
RELAY="e2e"
SCHEMA="obr_e2e_${SUFFIX//-/_}"
TABLE="$SCHEMA.outbox_messages"

log() { echo "e2e-cluster: $*"; }

cleanup() {
    local rc=$?
    if [ -n "${E2E_KEEP:-}" ]; then
        log "E2E_KEEP set: leaving namespaces $NS and $OPERATOR_NS and schema $SCHEMA"
        exit "$rc"
    fi
    log "cleaning up"
    "$KUBECTL" delete namespace "$NS" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    "$HELM" uninstall "$RELEASE" -n "$OPERATOR_NS" >/dev/null 2>&1 || true
    "$KUBECTL" delete namespace "$OPERATOR_NS" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    psql "$PSQL_URL" -v ON_ERROR_STOP=1 -qc "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1 || true
    exit "$rc"
}
trap cleanup EXIT

diagnose() {
    log "--- diagnostics ---"
    "$KUBECTL" -n "$NS" get obr,deployments,pods -o wide || true
    "$KUBECTL" -n "$NS" describe obr "$RELAY" || true
    "$KUBECTL" -n "$OPERATOR_NS" logs deployment/"$RELEASE-outbox-relay-operator" --tail=100 || true
    "$KUBECTL" -n "$NS" logs -l "app.kubernetes.io/instance=$RELAY" --tail=50 --prefix || true
}

log "cluster: $("$KUBECTL" config current-context)"
"$KUBECTL" create namespace "$OPERATOR_NS"
"$KUBECTL" create namespace "$NS"

log "outbox table $TABLE (the reference article's shape)"
psql "$PSQL_URL" -v ON_ERROR_STOP=1 -q <<SQL
CREATE SCHEMA $SCHEMA;
CREATE TABLE $TABLE (
    id uuid PRIMARY KEY,
    type varchar(255) NOT NULL,
    content jsonb NOT NULL,
    occurred_on_utc timestamptz NOT NULL DEFAULT now(),
    processed_on_utc timestamptz NULL,
    error text NULL
);
SQL

log "installing the chart in $OPERATOR_NS (watching $NS)"
helm_args=(--set "watchNamespaces={$NS}")
[ -n "${E2E_IMAGE_REPOSITORY:-}" ] && helm_args+=(--set-string "image.repository=$E2E_IMAGE_REPOSITORY")
[ -n "${E2E_IMAGE_TAG:-}" ] && helm_args+=(--set-string "image.tag=$E2E_IMAGE_TAG")
[ -n "${E2E_IMAGE_PULL_POLICY:-}" ] && helm_args+=(--set-string "image.pullPolicy=$E2E_IMAGE_PULL_POLICY")
"$HELM" upgrade --install "$RELEASE" "$CHART" -n "$OPERATOR_NS" "${helm_args[@]}" \
    --wait --timeout "${TIMEOUT}s"

log "Secrets and the OutboxRelay in $NS"
"$KUBECTL" -n "$NS" create secret generic e2e-db --from-literal=url="$E2E_DATABASE_URL" >/dev/null
"$KUBECTL" -n "$NS" create secret generic e2e-amqp --from-literal=url="$E2E_AMQP_URL" >/dev/null
"$KUBECTL" -n "$NS" apply -f - <<YAML
apiVersion: outboxrelay.io/v1beta1
kind: OutboxRelay
metadata:
  name: $RELAY
spec:
  database:
    urlSecretRef: {name: e2e-db, key: url}
    table: $TABLE
  broker:
    urlSecretRef: {name: e2e-amqp, key: url}
    exchange: amq.topic
  relay:
    batchSize: 200
    workersPerPod: 2
  scaling:
    minReplicas: 1
    maxReplicas: 3
    targetBacklogPerReplica: 500
YAML

if ! "$KUBECTL" -n "$NS" wait --for=condition=Ready "obr/$RELAY" --timeout="${TIMEOUT}s"; then
    diagnose
    exit 1
fi
"$KUBECTL" -n "$NS" get obr "$RELAY"

log "inserting $ROWS rows"
psql "$PSQL_URL" -v ON_ERROR_STOP=1 -q <<SQL
INSERT INTO $TABLE (id, type, content, occurred_on_utc)
SELECT gen_random_uuid(), 'E2E.OrderCreated', jsonb_build_object('OrderId', gen_random_uuid()),
       now() + (g * interval '1 microsecond')
FROM generate_series(1, $ROWS) AS g;
SQL

log "waiting until the relay drained the table (timeout ${TIMEOUT}s)"
deadline=$((SECONDS + TIMEOUT))
while :; do
    pending="$(psql "$PSQL_URL" -v ON_ERROR_STOP=1 -tAc "SELECT count(*) FROM $TABLE WHERE processed_on_utc IS NULL")"
    failed="$(psql "$PSQL_URL" -v ON_ERROR_STOP=1 -tAc "SELECT count(*) FROM $TABLE WHERE error IS NOT NULL")"
    backlog="$("$KUBECTL" -n "$NS" get obr "$RELAY" -o jsonpath='{.status.backlog}' 2>/dev/null || true)"
    log "pending rows: $pending, rows with an error: $failed, status.backlog: ${backlog:-?}"
    if [ "$pending" = 0 ] && [ "${backlog:-0}" = 0 ]; then
        break
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
        log "FAILED: $pending rows still pending after ${TIMEOUT}s"
        diagnose
        exit 1
    fi
    sleep 5
done
if [ "$failed" != 0 ]; then
    log "FAILED: $failed rows were marked with an error"
    diagnose
    exit 1
fi
"$KUBECTL" -n "$NS" get obr "$RELAY"
log "passed: $ROWS rows relayed, backlog 0"

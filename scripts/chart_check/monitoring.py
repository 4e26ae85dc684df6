"""The Prometheus Operator kinds the chart renders, the alert rules and their unit tests, and the
Grafana dashboard."""
import json
import os
import re

import yaml

from common import (ALERTS, ALERTS_TEST, METRICS, OBSERVABILITY, POD_TO_RELAY, RELAY_METRICS_SRC,
                    ROOT, RUNBOOK_BASE, SEVERITIES, alert_rules, attempt, load, result,
                    unknown_metrics)

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

    def prometheusrule_shape():
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

    attempt("PrometheusRule shape (monitoring.coreos.com/v1; not known to kubernetes-validate)", prometheusrule_shape)

    def groups_equal_the_plain_rule_file():
        rendered = docs[0]["spec"]["groups"]
        plain = yaml.safe_load(open(ALERTS))["groups"]
        if rendered == plain:
            return True
        if "{{" not in json.dumps(rendered):
            return "the rendered annotations lost their {{ }} templates: Helm expanded them"
        diff = [r.get("alert") for g1, g2 in zip(plain, rendered) for r, r2 in zip(g1["rules"], g2["rules"]) if r != r2]
        return f"rendered groups differ from {os.path.relpath(ALERTS, ROOT)} (rules {diff or 'count'})"

    attempt("PrometheusRule: spec.groups equal config/prometheus/outbox-relay-alerts.yaml, templates literal", groups_equal_the_plain_rule_file)
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

    def servicemonitor_shape():
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

    attempt("ServiceMonitor shape (monitoring.coreos.com/v1; not known to kubernetes-validate)", servicemonitor_shape)


def dashboard_files():
    a = os.path.join(ROOT, "config/grafana/outbox-relay-dashboard.json")
    b = os.path.join(ROOT, "charts/outbox-relay-operator/dashboards/outbox-relay-dashboard.json")

    def chart_copy_equals_config_copy():
        return open(a).read() == open(b).read() or "charts/.../dashboards/ and config/grafana/ copies differ"

    attempt("dashboard: the chart's copy equals config/grafana/outbox-relay-dashboard.json", chart_copy_equals_config_copy)

    def every_relay_metric_and_only_exported_ones():
        dash = json.load(open(a))
        exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))
        missing = [m for m in METRICS if m not in exprs]
        # Every metric the dashboard names must be one the relay exports (or kube-state-metrics).
        unknown = unknown_metrics(set(re.findall(r"outbox_relay_[a-z_]+", exprs)))
        return (not missing and not unknown) or f"missing {missing}, unknown to {RELAY_METRICS_SRC} {unknown}"

    attempt("dashboard: panels use every relay metric and only metrics the relay exports", every_relay_metric_and_only_exported_ones)

    def panel_titles():
        dash = json.load(open(a))
        got = " | ".join(p["title"] for p in dash["panels"]).lower()
        want = ["backlog", "oldest", "publish rate", "replicas", "stage latency", "dead-letter",
                "horizon", "holder", "dead vs live tuples", "last vacuum", "pending index", "autovacuum",
                "last lag report", "blocked keys"]
        absent = [w for w in want if w not in got]
        return not absent or f"no title with {absent} in: {got}"

    attempt("dashboard: backlog, oldest age, publish rate, replicas, stage latencies, dead-letters, "
            "table health (horizon and holder, tuples, vacuum, index, autovacuum), report age, blocked keys", panel_titles)

    def panels_on_the_grid_apart():
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

    attempt("dashboard: panel ids unique, panels inside the grid and not overlapping", panels_on_the_grid_apart)


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

        def runbook_is_a_page(ann=ann):
            url = ann.get("runbook_url", "")
            if not url.startswith(RUNBOOK_BASE):
                return f"runbook_url {url!r} does not start with {RUNBOOK_BASE}"
            page = url[len(RUNBOOK_BASE):]
            folder = os.path.join(ROOT, "docs/operations")
            return os.path.isfile(os.path.join(folder, page)) or f"{page} is no page of docs/operations/ ({sorted(os.listdir(folder))})"

        attempt(f"alert {name}: runbook_url {ann.get('runbook_url', '')[len(RUNBOOK_BASE):] or '?'} is a page of docs/operations/", runbook_is_a_page)

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

    def fires_and_stays_quiet_in_unit_tests():
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

    attempt("alert unit tests: every alert has a firing and a not-firing case", fires_and_stays_quiet_in_unit_tests)

    def listed_in_observability_page():
        text = open(OBSERVABILITY).read()
        absent = [n for n in names if f"`{n}`" not in text]
        return not absent or f"not listed in docs/observability.md: {absent}"

    attempt("docs/observability.md lists every alert", listed_in_observability_page)


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


def dashboard_rules(path):
    """The dashboard's PromQL as recording rules, its Grafana variables replaced by values, for
    promtool check rules."""
    dash = json.load(open(path))
    subst = {"$__rate_interval": "1m", "$__range": "1h", "$namespace": ".+", "$relay": "(orders|billing)"}
    rules = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for key, value in subst.items():
                expr = expr.replace(key, value)
            rules.append({"record": f"dashboard:panel{panel['id']}:{target['refId']}", "expr": expr})
    print(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))

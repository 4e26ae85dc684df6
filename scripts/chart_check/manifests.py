"""The operator's manifests, rendered by the chart (default and ci values) and built from config/:
the Deployment, its RBAC against the contract, leader election, the flags it passes."""
import json
import os
import re

import yaml

from common import (IMAGE, LEASE_RULES, NAMESPACED_RULES, ROOT, attempt, by_kind, container,
                    expect_rules, load, one)


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
    def crd_role_names_only_the_crd():
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
            + (" and its status" if cluster_wide else ""), crd_role_names_only_the_crd)


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
    def flags_defined_by_outbox_operator_run():
        flags, envs = operator_cli()
        c = container(one(docs, "Deployment"))
        args = c["args"]
        assert args[0] == "run", f"first argument {args[0]!r}, not run"
        unknown = [a for a in args[1:] if a.startswith("--") and a[2:].split("=", 1)[0] not in flags]
        unknown += [e["name"] for e in c.get("env", []) if e["name"].startswith("OUTBOX_OPERATOR_") and e["name"] not in envs]
        return not unknown or f"not defined by `outbox-operator run` in operator/src/main.rs: {unknown} (known flags {sorted(flags)}, env {sorted(envs)})"

    attempt(f"{prefix}: every flag and OUTBOX_OPERATOR_* variable is one `outbox-operator run` defines", flags_defined_by_outbox_operator_run)


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

    def dashboard_configmap():
        cm = one(docs, "ConfigMap")
        assert cm["metadata"]["labels"].get("grafana_dashboard") == "1", cm["metadata"]["labels"]
        data = json.loads(cm["data"]["outbox-relay-dashboard.json"])
        shipped = json.load(open(os.path.join(ROOT, "config/grafana/outbox-relay-dashboard.json")))
        return data == shipped or "the ConfigMap's dashboard differs from config/grafana/outbox-relay-dashboard.json"

    attempt(f"{p}: dashboard ConfigMap labelled grafana_dashboard=\"1\" holds the shipped dashboard", dashboard_configmap)

    def prometheusrule_labels():
        pr = one(docs, "PrometheusRule")
        want = values["prometheusRule"]["labels"]
        return (pr["metadata"]["labels"].items() >= want.items()
                and pr["metadata"]["namespace"] == os.environ["RELEASE_NS"]) or pr["metadata"]

    attempt(f"{p}: PrometheusRule in the release namespace with the extra labels (ruleSelector)", prometheusrule_labels)


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

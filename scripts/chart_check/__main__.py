"""Structural checks of the rendered chart, the config/ manifests, the dashboard and the example
relay config. Prints one "PASS\tname" or "FAIL\tname\tdetail" line per check."""
import sys

from common import split
from examples import relay_example, samples
from manifests import chart_ci, chart_default, config_manifests
from monitoring import (alert_mutants, alerts, dashboard_files, dashboard_rules, horizon_threshold,
                        prometheusrule, servicemonitor)

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
    elif cmd == "dashboard-rules":
        dashboard_rules(args[0])
    else:
        sys.exit(f"unknown command {cmd}")

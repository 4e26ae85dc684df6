"""The examples users copy: config/samples/ and config/relay.example.yaml."""
import os
import re

import yaml

from common import ROOT, attempt, by_kind, load

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

    def every_key_accepted():
        doc = yaml.safe_load(open(path))
        bad = sorted(set(doc) - top) + sorted("columns." + k for k in set(doc.get("columns") or {}) - cols)
        return not bad or f"keys the relay rejects: {bad}"

    attempt("config/relay.example.yaml: every key is one the relay accepts", every_key_accepted)

    def every_key_shown():
        text = open(path).read()
        absent = sorted(k for k in top if not re.search(r"^#? ?" + k + r":", text, re.M))
        absent += sorted("columns." + k for k in cols if not re.search(r"^\s+#? ?" + k + r":", text, re.M))
        return not absent or f"keys not shown in the example: {absent}"

    attempt("config/relay.example.yaml: shows every key the relay accepts", every_key_shown)

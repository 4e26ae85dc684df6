#!/usr/bin/env python3
"""One CycloneDX SBOM for the image, from cargo-cyclonedx's SBOMs of the crates it holds.

The image carries two programs (outbox-relay and outbox-operator), and cargo-cyclonedx writes
one SBOM per crate. This document's subject (metadata.component) is the image itself, pinned
by its digest; each crate becomes one of its components, with its dependencies beside it (one
entry per bom-ref: the crates share most of theirs) and the dependency graphs joined.

The crates' own bom-refs name the directory they were built in (path+file:///…); that prefix
is cut to the repository's root, so a published SBOM shows no build machine's paths.

Usage: sbom-merge.py ROOT IMAGE_REPOSITORY VERSION DIGEST CRATE_SBOM.json… > image.cdx.json
"""

import json
import sys
import uuid


def main():
    root, repository, version, digest, *inputs = sys.argv[1:]
    if not inputs or not digest.startswith("sha256:"):
        sys.exit(__doc__)
    image_ref = f"{repository}@{digest}"
    name = repository.rsplit("/", 1)[-1]
    image = {
        "type": "container",
        "bom-ref": image_ref,
        "name": name,
        "version": version,
        # The package URL of an OCI image: its digest, and where it was pushed.
        "purl": f"pkg:oci/{name}@{digest.replace(':', '%3A')}"
        f"?repository_url={repository}&tag={version}",
    }
    components = {}
    dependencies = {image_ref: set()}
    tools = []
    spec = None
    for path in inputs:
        text = open(path, encoding="utf-8").read()
        text = text.replace(f"file://{root.rstrip('/')}/", "file:///")
        bom = json.loads(text)
        if bom.get("bomFormat") != "CycloneDX":
            sys.exit(f"{path} is not a CycloneDX document")
        spec = spec or bom.get("specVersion")
        crate = bom["metadata"]["component"]
        components[crate["bom-ref"]] = crate
        dependencies[image_ref].add(crate["bom-ref"])
        for component in bom.get("components", []):
            components.setdefault(component["bom-ref"], component)
        for dep in bom.get("dependencies", []):
            dependencies.setdefault(dep["ref"], set()).update(dep.get("dependsOn", []))
        for tool in bom["metadata"].get("tools", []):
            if tool not in tools:
                tools.append(tool)
    merged = {
        "bomFormat": "CycloneDX",
        "specVersion": spec,
        # The same image always gets the same serial number.
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, image_ref)}",
        "version": 1,
        "metadata": {"tools": tools, "component": image},
        "components": sorted(components.values(), key=lambda c: c["bom-ref"]),
        "dependencies": [
            {"ref": ref, "dependsOn": sorted(deps)} for ref, deps in sorted(dependencies.items())
        ],
    }
    json.dump(merged, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

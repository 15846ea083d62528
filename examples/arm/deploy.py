#!/usr/bin/env python3
"""Deploys an ARM template's Fleet Manager resources to a Flotilla server.

    deploy.py --server https://flotilla.example:8443 --subscription SUB --resource-group RG \
        [--token-file FILE | FLOTILLA_TOKEN=...] [--ca-file ca.pem] TEMPLATE.json

Flotilla serves Fleet Manager's ARM paths but is not Azure Resource Manager: there is no
deployment engine. This script does what one would for a template whose resources are
Microsoft.ContainerService/fleets and its children: each resource is PUT at its ARM path
(`/subscriptions/SUB/resourceGroups/RG/providers/<type>/<name>`, child names split on `/`) with
its `apiVersion`, after the resources it `dependsOn`. The one template expression understood is
`[resourceId('<type>', '<name>', ...)]`, anywhere in a string; anything else in brackets is
refused with its resource and field. Python's standard library only. Exits 1 on the first
refusal, printing the server's error.
"""

import argparse
import json
import os
import re
import ssl
import sys
import urllib.error
import urllib.request

RESOURCE_ID = re.compile(r"^\[resourceId\(\s*'([^']+)'((?:\s*,\s*'[^']*')+)\s*\)\]$")


def resource_id(sub, rg, rtype, names):
    """The ARM id of a resource of type `rtype` (provider/type/child...) named `names`."""
    namespace, *types = rtype.split("/")
    if len(types) != len(names):
        raise ValueError(f"type {rtype!r} needs {len(types)} name segments, got {names!r}")
    path = f"/subscriptions/{sub}/resourceGroups/{rg}/providers/{namespace}"
    for t, n in zip(types, names):
        path += f"/{t}/{n}"
    return path


def resolve(value, sub, rg, where):
    """The value with every `[resourceId(...)]` string made an id; other expressions refused."""
    if isinstance(value, dict):
        return {k: resolve(v, sub, rg, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, sub, rg, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str) and value.startswith("[") and not value.startswith("[["):
        m = RESOURCE_ID.match(value)
        if not m:
            raise ValueError(f"{where}: {value!r}: only [resourceId('type', 'name', ...)] is understood")
        names = re.findall(r"'([^']*)'", m.group(2))
        return resource_id(sub, rg, m.group(1), names)
    return value


def ordered(resources, sub, rg):
    """The resources, each after what it depends on (as listed otherwise)."""
    ids = [resource_id(sub, rg, r["type"], r["name"].split("/")) for r in resources]
    index = {i.lower(): n for n, i in enumerate(ids)}
    done, out = set(), []

    def visit(n, path):
        if n in done:
            return
        if n in path:
            raise ValueError(f"resources[{n}]: a dependsOn cycle")
        for d, dep in enumerate(resources[n].get("dependsOn", [])):
            target = resolve(dep, sub, rg, f"resources[{n}].dependsOn[{d}]").lower()
            if target in index:
                visit(index[target], path | {n})
        done.add(n)
        out.append(n)

    for n in range(len(resources)):
        visit(n, frozenset())
    return [(ids[n], resources[n]) for n in out]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", required=True)
    p.add_argument("--subscription", required=True)
    p.add_argument("--resource-group", required=True)
    p.add_argument("--token-file")
    p.add_argument("--ca-file")
    p.add_argument("template")
    a = p.parse_args()
    token = open(a.token_file).read().strip() if a.token_file else os.environ.get("FLOTILLA_TOKEN", "")
    if not token:
        sys.exit("deploy.py: give --token-file or FLOTILLA_TOKEN")
    context = ssl.create_default_context(cafile=a.ca_file) if a.ca_file else None
    with open(a.template) as f:
        template = json.load(f)
    try:
        plan = ordered(template.get("resources", []), a.subscription, a.resource_group)
    except (KeyError, ValueError) as e:
        sys.exit(f"deploy.py: {a.template}: {e}")
    for n, (rid, resource) in enumerate(plan):
        body = {k: v for k, v in resource.items() if k in ("location", "tags", "identity", "properties")}
        try:
            body = resolve(body, a.subscription, a.resource_group, resource["name"])
        except ValueError as e:
            sys.exit(f"deploy.py: {a.template}: {e}")
        url = f"{a.server.rstrip('/')}{rid}?api-version={resource['apiVersion']}"
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="PUT", headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, context=context) as response:
                print(f"{response.status} {resource['type']} {resource['name']}")
        except urllib.error.HTTPError as e:
            print(f"{e.code} {resource['type']} {resource['name']}: {e.read().decode(errors='replace')}")
            sys.exit(1)


if __name__ == "__main__":
    main()

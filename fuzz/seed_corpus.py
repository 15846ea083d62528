#!/usr/bin/env python3
"""Writes seed inputs for the fuzz targets from the repository's real inputs.

    python3 fuzz/seed_corpus.py OUT_DIR

writes OUT_DIR/<target>/<sha1> for every target: the scenario files of tests/conformance,
tests/scenarios and examples; the strategies, run bodies, maintenance windows, selectors and
versions found in them; examples/fleet-stages.json; and the JSON literals of the engine's unit
tests. The committed corpus (fuzz/corpus) is this, minimised with `cargo fuzz cmin`, plus
what fuzzing found; run this only to seed it again. Needs PyYAML.
"""

import hashlib
import json
import pathlib
import re
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = pathlib.Path(sys.argv[1])
TARGETS = ["strategy_body", "run_body", "selector", "window", "version", "scenario"]
seeds = {t: set() for t in TARGETS}


def add(target, text):
    if isinstance(text, str):
        text = text.encode()
    if text:
        seeds[target].add(text)


def dump(value):
    return json.dumps(value, separators=(",", ":"), default=str)


def walk(value, key=None):
    """Yields (key, value) for every mapping entry, recursively."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k, v
            yield from walk(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from walk(v, key)


scenario_files = sorted(
    list((ROOT / "tests/conformance").glob("*.yaml"))
    + list((ROOT / "tests/scenarios").glob("*.yaml"))
    + list((ROOT / "examples").glob("*.yaml"))
)
kube_versions, image_versions = set(), set()
for path in scenario_files:
    text = path.read_text()
    add("scenario", text)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        continue
    if not isinstance(doc, dict):
        continue
    strategies = [doc["strategy"]] if isinstance(doc.get("strategy"), dict) else []
    strategies += [s for s in (doc.get("strategies") or {}).values() if isinstance(s, dict)]
    for s in strategies:
        add("strategy_body", dump(s))
        add("strategy_body", dump({"properties": {"strategy": s}}))
    update = doc.get("update")
    if isinstance(update, dict):
        props = {"managedClusterUpdate": update}
        if isinstance(doc.get("strategy"), dict):
            props["strategy"] = doc["strategy"]
        add("run_body", dump({"properties": props}))
    for k, v in walk(doc):
        if k == "byLabel" and isinstance(v, str):
            add("selector", v)
            add("selector", dump({"byLabel": v}))
        elif k in ("kubernetes", "nodeOS") and isinstance(v, dict) and "schedule" in v:
            add("window", dump(v))
        elif k == "kubernetesVersion" and isinstance(v, str):
            kube_versions.add(v)
        elif k in ("nodeImageVersion", "version") and isinstance(v, str):
            (kube_versions if v.count(".") == 2 and len(v) < 9 else image_versions).add(v)

add("strategy_body", (ROOT / "examples/fleet-stages.json").read_text())

# JSON literals of the engine's unit tests: strategies, upgrades, windows.
literal = re.compile(r'r#"(\{.*?\})"#')
for name, target in [("strategy.rs", "strategy_body"), ("window.rs", "window")]:
    for m in literal.finditer((ROOT / "crates/flotilla-engine/src" / name).read_text()):
        text = m.group(1)
        if '"upgrade"' in text:
            add("run_body", dump({"properties": {"managedClusterUpdate": json.loads(text)}}))
        elif "{" in text and "{{" not in text:
            add(target, text)

# Selectors of the selector unit tests.
for m in re.finditer(r'\("([^"]*)", (?:true|false)\)', (ROOT / "crates/flotilla-engine/src/selector.rs").read_text()):
    add("selector", m.group(1))

# Versions: pairs and triples, one per line, plus the family-version form.
kube = sorted(kube_versions)
image = sorted(image_versions)
for i, v in enumerate(kube):
    add("version", v + "\n" + kube[(i + 1) % len(kube)])
for i, v in enumerate(image):
    add("version", v + "\n" + image[(i + 1) % len(image)] + "\n" + v)
    add("version", "AKSUbuntu-2204gen2containerd-" + v)

for target, items in seeds.items():
    directory = OUT / target
    directory.mkdir(parents=True, exist_ok=True)
    for item in items:
        (directory / hashlib.sha1(item).hexdigest()).write_bytes(item)
    print(f"{target}: {len(items)} seeds")

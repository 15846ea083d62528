#!/usr/bin/env bash
# The Kubernetes manifests of deploy/kubernetes/ (issue #42): every document validated, strictly
# (no unknown field), against the Kubernetes schemas that kubernetes-validate ships (pinned, in a
# virtual environment made by the script; nothing is downloaded at run time), for the oldest and
# newest Kubernetes versions we mean to support; then what the deployment relies on: probes on
# /healthz and /readyz at the container's port, the PostgreSQL URL from a Secret, the
# configuration from the ConfigMap, the workload identity annotation and label, a Service and a
# PodDisruptionBudget that select the pods. Fails on any failure, a warning included.
#
#   scripts/kubernetes-tests.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version=1.37.0
kubernetes_versions=(1.30.0 1.37.0)
venv="${FLOTILLA_KUBERNETES_VALIDATE_VENV:-target/kubernetes-validate-venv}"
if ! "$venv/bin/kubernetes-validate" --version 2>/dev/null | grep -qF "$version"; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "kubernetes-validate==$version"
fi

manifests=(deploy/kubernetes/*.yaml)
for k in "${kubernetes_versions[@]}"; do
    out="$("$venv/bin/kubernetes-validate" --strict -k "$k" "${manifests[@]}" 2>&1)" || { echo "$out" >&2; exit 1; }
    echo "$out"
    # A kind it has no schema for is only a warning: here it is a failure.
    if grep -qv '^INFO .* passed for resource ' <<<"$out"; then
        echo "kubernetes-tests: FAILED: not every document passed against $k" >&2
        exit 1
    fi
done

"$venv/bin/python" - "${manifests[@]}" <<'PY'
import sys, tomllib, yaml

docs = {}
for path in sys.argv[1:]:
    for doc in yaml.safe_load_all(open(path)):
        if doc:
            docs[doc["kind"]] = doc

def check(cond, what):
    if not cond:
        sys.exit(f"kubernetes-tests: FAILED: {what}")

for kind in ["Namespace", "ServiceAccount", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget"]:
    check(kind in docs, f"no {kind} in deploy/kubernetes")
dep, svc, pdb, sa, cm = (docs[k] for k in ["Deployment", "Service", "PodDisruptionBudget", "ServiceAccount", "ConfigMap"])
namespace = docs["Namespace"]["metadata"]["name"]
for doc in docs.values():
    if doc["kind"] != "Namespace":
        check(doc["metadata"].get("namespace") == namespace, f"{doc['kind']} is not in namespace {namespace}")

pod = dep["spec"]["template"]
labels = pod["metadata"]["labels"]
for name, doc in [("Deployment", dep), ("PodDisruptionBudget", pdb)]:
    sel = doc["spec"]["selector"]["matchLabels"]
    check(all(labels.get(k) == v for k, v in sel.items()), f"the {name}'s selector does not select its pods")
check(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()), "the Service does not select the pods")
check(dep["spec"]["replicas"] > pdb["spec"]["minAvailable"], "the PodDisruptionBudget allows no disruption")

[c] = pod["spec"]["containers"]
ports = {p["name"]: p["containerPort"] for p in c["ports"]}
check(ports.get("http") == 8080, "the container's http port is not 8080")
check(c["livenessProbe"]["httpGet"]["path"] == "/healthz", "liveness is not /healthz")
check(c["startupProbe"]["httpGet"]["path"] == "/healthz", "startup is not /healthz")
check(c["readinessProbe"]["httpGet"]["path"] == "/readyz", "readiness is not /readyz")
for probe in ["livenessProbe", "readinessProbe", "startupProbe"]:
    check(c[probe]["httpGet"]["port"] in ("http", 8080), f"{probe} is not on the http port")
check(svc["spec"]["ports"][0]["targetPort"] in ("http", 8080), "the Service does not reach the http port")

env = {e["name"]: e for e in c["env"]}
ref = env.get("FLOTILLA_DATABASE", {}).get("valueFrom", {}).get("secretKeyRef")
check(ref and ref["name"] and ref["key"], "FLOTILLA_DATABASE does not come from a Secret")

volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
config_volume = volumes[mounts["/etc/flotilla"]]
check(config_volume["configMap"]["name"] == cm["metadata"]["name"], "/etc/flotilla is not the ConfigMap")
check(c["args"] == ["--config", "/etc/flotilla/flotilla.toml"], f"args: {c['args']}")
config = tomllib.loads(cm["data"]["flotilla.toml"])
check(config["listen"].endswith(":8080"), "the ConfigMap's listen is not port 8080")
check("database" not in config, "the ConfigMap names a database (the Secret does)")
svc_name = svc["metadata"]["name"]
check(f"{svc_name}.{namespace}.svc" in config.get("allowed-hosts", []), "the Service's name is not an allowed host")

check(pod["spec"]["serviceAccountName"] == sa["metadata"]["name"], "the pods do not use the ServiceAccount")
check("azure.workload.identity/client-id" in sa["metadata"].get("annotations", {}), "no workload identity client id")
check(labels.get("azure.workload.identity/use") == "true", "the pods do not ask for workload identity")

sc = c["securityContext"]
check(sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, "container security context")
check(pod["spec"]["securityContext"]["runAsNonRoot"] is True, "pods may run as root")
print(f"kubernetes-tests: {len(docs)} manifests consistent: probes, Secret, ConfigMap, workload identity, PDB")
PY

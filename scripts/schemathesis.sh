#!/usr/bin/env bash
# Schemathesis against a live server (Hardening, item 10): every route of /openapi.json is called
# with generated requests, and every answer must be no server error, a status code the document
# lists, the content type it lists, and a body that matches its schema. Bounded: a few examples
# an operation, one worker, a fixed seed.
#
#   scripts/schemathesis.sh [path/to/flotilla]     (default: target/release/flotilla)
#
# Installs a pinned schemathesis into target/schemathesis-venv when it is not there yet.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version=4.32.5
bin="${1:-target/release/flotilla}"
examples="${FLOTILLA_SCHEMATHESIS_EXAMPLES:-25}"
venv="${FLOTILLA_SCHEMATHESIS_VENV:-target/schemathesis-venv}"
if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -q "$version"; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "schemathesis==$version"
fi

dir="$(mktemp -d)"
server=""
cleanup() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
    rm -rf "$dir"
}
trap cleanup EXIT

db="$dir/flotilla.db"
token="$("$bin" token create --role admin --subject schemathesis --database "$db" | grep -o 'flt_[A-Za-z0-9_]*' | head -1)"
port=$((20000 + RANDOM % 20000))
base="http://127.0.0.1:$port"
"$bin" serve --database "$db" --listen "127.0.0.1:$port" >"$dir/serve.log" 2>&1 &
server=$!
for _ in $(seq 1 100); do
    curl -sf "$base/healthz" >/dev/null && break
    sleep 0.1
done
curl -sf "$base/healthz" >/dev/null || { cat "$dir/serve.log"; exit 1; }

# A fleet with a simulated member, a strategy and a run, so that named paths have something.
call() {
    curl -sf -X "$1" "$base$2" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' ${3:+-d "$3"} >/dev/null
}
call PUT /v1/fleets/f1 '{"properties":{"driver":{"type":"sim","clusters":{"c1":{"region":"eastus","kubernetesVersion":"1.30.5"}},"catalog":{"eastus":{"kubernetes":[{"version":"1.30.5"},{"version":"1.31.2"}]}}}}}'
call PUT /v1/fleets/f1/members/m1 '{"properties":{"clusterResourceId":"c1","group":"g1"}}'
call PUT /v1/fleets/f1/updateStrategies/s1 '{"properties":{"strategy":{"stages":[{"name":"a","groups":[{"name":"g1"}]}]}}}'
call PUT /v1/fleets/f1/updateRuns/r1 '{"properties":{"updateStrategyId":"/v1/fleets/f1/updateStrategies/s1","managedClusterUpdate":{"upgrade":{"type":"ControlPlaneOnly","kubernetesVersion":"1.31.2"}}}}'
# Generated requests name these, so that they reach what exists as well as what does not.
cat >"$dir/schemathesis.toml" <<'TOML'
[parameters]
"path.fleet" = "f1"
"path.member" = "m1"
"path.strategy" = "s1"
"path.run" = "r1"
TOML

"$venv/bin/schemathesis" --config-file "$dir/schemathesis.toml" run "$base/openapi.json" \
    -H "Authorization: Bearer $token" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
    --phases examples,coverage,fuzzing \
    --max-examples "$examples" \
    --workers 1 \
    --seed 1 \
    --exclude-path-regex '/events$' \
    --no-color

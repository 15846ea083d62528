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
"$bin" serve --database "$db" --listen 127.0.0.1:0 >"$dir/serve.log" 2>&1 &
server=$!
# The port the kernel gave, from the server's first line.
base=""
for _ in $(seq 1 100); do
    base="$(grep -o 'serving http://127.0.0.1:[0-9]*' "$dir/serve.log" | head -1 | cut -d' ' -f2 || true)"
    [ -n "$base" ] && curl -sf "$base/healthz" >/dev/null && break
    sleep 0.1
done
[ -n "$base" ] && curl -sf "$base/healthz" >/dev/null || { cat "$dir/serve.log"; exit 1; }

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

# Replacing or deleting the fleet, and revoking tokens (the run's own among them), would leave
# the other operations nothing but 404s and 401s: those three run last, on their own.
last=(--include-operation-id put_v1_fleets_fleet --include-operation-id delete_v1_fleets_fleet
    --include-operation-id delete_v1_tokens_id)
# The dashboard's sign-in steps send the browser to an identity provider (one the fuzzing may
# have declared, at a made-up host): they are tested against a real provider by
# scripts/oidc-tests.sh, and not called here, so that no request leaves the machine.
first=(--exclude-operation-id put_v1_fleets_fleet --exclude-operation-id delete_v1_fleets_fleet
    --exclude-operation-id delete_v1_tokens_id --exclude-path-regex '/events$|^/auth/(login|callback)$')
for pass in first last; do
    declare -n filters="$pass"
    "$venv/bin/schemathesis" --config-file "$dir/schemathesis.toml" run "$base/openapi.json" \
        -H "Authorization: Bearer $token" \
        --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
        --phases examples,coverage,fuzzing \
        --max-examples "$examples" \
        --workers 1 \
        --seed 1 \
        "${filters[@]}" \
        --no-color
done

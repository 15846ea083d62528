#!/usr/bin/env bash
# The real Azure SDK for Python against a live server's Fleet Manager (ARM) paths, over HTTPS:
# tests/azure-sdk/test_sdk.py creates a fleet, members, strategies and a run with gates, starts,
# approves, skips, stops, starts and finishes it, pages through lists, generates a run from an
# auto-upgrade profile and deletes everything, all with azure-mgmt-containerservicefleet.
#
#   scripts/azure-sdk.sh [path/to/flotilla]     (default: target/release/flotilla)
#
# Installs the pinned SDK (tests/azure-sdk/requirements.txt) into
# ${FLOTILLA_AZURE_SDK_VENV:-target/azure-sdk-venv} when it is not there yet. The server gets a
# certificate signed by a CA made here, which the SDK trusts through its CA setting.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bin="${1:-target/release/flotilla}"
venv="${FLOTILLA_AZURE_SDK_VENV:-target/azure-sdk-venv}"
requirements=tests/azure-sdk/requirements.txt
[ -x "$bin" ] || { echo "no flotilla binary at $bin" >&2; exit 1; }

# The venv is reused when it was made from these very pins.
if ! cmp -s "$requirements" "$venv/requirements.txt" \
    || ! "$venv/bin/python" -c 'import azure.mgmt.containerservicefleet' 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$venv/requirements.txt"
fi

dir="$(mktemp -d)"
server=""
cleanup() {
    status=$?
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
    if [ "$status" -ne 0 ]; then
        echo "--- the SDK's last requests" >&2
        grep -E "Request URL|Request method|Response status" "$dir/http.log" 2>/dev/null | tail -n 24 >&2 || true
        echo "--- server log" >&2
        tail -n 30 "$dir/serve.log" >&2 2>/dev/null || true
    fi
    rm -rf "$dir"
    exit "$status"
}
trap cleanup EXIT

# A CA, and a server certificate it signs for 127.0.0.1 and localhost (not a CA itself).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj "/CN=Flotilla azure-sdk test CA" -keyout "$dir/ca.key" -out "$dir/ca.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/CN=localhost" -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
cat >"$dir/server.ext" <<'EXT'
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
EXT
openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -set_serial 1 -days 2 \
    -extfile "$dir/server.ext" -out "$dir/server.pem" 2>/dev/null

db="$dir/flotilla.db"
"$bin" token create --role admin --subject azure-sdk-test --database "$db" \
    | grep -o 'flt_[A-Za-z0-9_]*' | head -1 >"$dir/token"
[ -s "$dir/token" ] || { echo "no token from flotilla token create" >&2; exit 1; }
"$bin" serve --database "$db" --listen 127.0.0.1:0 --tls-cert "$dir/server.pem" --tls-key "$dir/server.key" \
    --default-driver tests/azure-sdk/driver.json >"$dir/serve.log" 2>&1 &
server=$!
# The port the kernel gave, from the server's first line.
base=""
for _ in $(seq 1 100); do
    base="$(grep -o 'serving https://127.0.0.1:[0-9]*' "$dir/serve.log" | head -1 | cut -d' ' -f2 || true)"
    [ -n "$base" ] && curl -sf --cacert "$dir/ca.pem" "$base/healthz" >/dev/null && break
    sleep 0.1
done
[ -n "$base" ] && curl -sf --cacert "$dir/ca.pem" "$base/healthz" >/dev/null || { echo "server did not come up" >&2; exit 1; }

FLOTILLA_AZURE_SDK_LOG="$dir/http.log" timeout 150 \
    "$venv/bin/python" tests/azure-sdk/test_sdk.py "$base" "$dir/ca.pem" "$dir/token"

# An ARM template's resources, deployed with examples/arm/deploy.py (as the README shows), and
# deployed again: a redeployment changes nothing and is refused nothing.
for attempt in first again; do
    "$venv/bin/python" examples/arm/deploy.py --server "$base" --subscription 11111111-2222-3333-4444-555555555555 \
        --resource-group templates --token-file "$dir/token" --ca-file "$dir/ca.pem" examples/arm/fleet.template.json \
        | tee "$dir/deploy.out"
    [ "$(grep -c '^20[01] ' "$dir/deploy.out")" = 5 ] || { echo "the template's $attempt deployment did not write all 5 resources" >&2; exit 1; }
done
run_url="$base/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/templates/providers/Microsoft.ContainerService/fleets/retail/updateRuns/upgrade-1-31-2?api-version=2026-06-01"
curl -sf --cacert "$dir/ca.pem" -H "Authorization: Bearer $(cat "$dir/token")" "$run_url" >"$dir/run.json"
grep -q '"updateStrategyId":"/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/templates/providers/Microsoft.ContainerService/fleets/retail/updateStrategies/canary-first"' "$dir/run.json" \
    || { echo "the deployed run does not name its strategy by ARM id: $(cat "$dir/run.json")" >&2; exit 1; }
echo "PASS: the ARM template deployed, twice"

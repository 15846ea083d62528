#!/usr/bin/env bash
# The OpenID Connect tests against a real provider: oidc-provider from the npm registry (pinned in
# tests/oidc/package-lock.json; `npm ci` when node_modules is missing or older than the lock file),
# started on loopback by the tests themselves:
# - crates/flotilla/tests/oidc.rs: a pipeline's client-credentials JWT, key rotation, altered
#   tokens refused, `flotilla login --oidc` with the device flow and its renewal;
# - tests/browser/oidc.test.mjs: the dashboard's sign-in through the provider's login page in
#   headless Chromium (scripts/browser-tests.sh installs Chromium and playwright-core).
#
#   scripts/oidc-tests.sh             # uses target/release/flotilla, building it if missing
#   FLOTILLA_BIN=target/debug/flotilla scripts/oidc-tests.sh
set -euo pipefail
cd "$(dirname "$0")/.."

CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$CHROMIUM" ]; then
    echo "oidc-tests: installing Debian's chromium"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium >/dev/null 2>&1 || {
        apt-get update -q >/dev/null
        apt-get install -y -q chromium >/dev/null
    }
fi

command -v node >/dev/null || {
    echo "oidc-tests: node is missing (apt-get install nodejs npm)" >&2
    exit 1
}

# npm ci only when the installed tree is not the lock file's.
install() {
    local dir="$1"
    local want have
    want="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
    have="$(cat "$dir/node_modules/.flotilla-lock-sha256" 2>/dev/null || true)"
    if [ "$want" != "$have" ]; then
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
        echo "$want" >"$dir/node_modules/.flotilla-lock-sha256"
    else
        echo "oidc-tests: $dir/node_modules is current"
    fi
}
install tests/oidc
install tests/browser

# The provider is required here: a missing node or node_modules fails instead of skipping.
FLOTILLA_REQUIRE_OIDC=1 cargo test -p flotilla --test oidc

FLOTILLA_BIN="${FLOTILLA_BIN:-target/release/flotilla}"
if [ ! -x "$FLOTILLA_BIN" ]; then
    cargo build --release -p flotilla
fi
FLOTILLA_BIN="$(cd "$(dirname "$FLOTILLA_BIN")" && pwd)/$(basename "$FLOTILLA_BIN")"
ARTIFACTS="$(pwd)/target/browser-artifacts"
mkdir -p "$ARTIFACTS"
FLOTILLA_BIN="$FLOTILLA_BIN" CHROMIUM="$CHROMIUM" ARTIFACTS="$ARTIFACTS" \
    node --test --test-concurrency=1 --test-timeout=300000 tests/browser/oidc.test.mjs
echo "oidc-tests: screenshots in $ARTIFACTS (oidc-*)"

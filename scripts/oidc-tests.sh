#!/usr/bin/env bash
# The OpenID Connect tests against a real provider: oidc-provider from the npm registry (pinned in
# tests/oidc/package-lock.json; `npm ci` when node_modules is missing or older than the lock file),
# started on loopback by the tests themselves:
# - crates/flotilla/tests/oidc.rs: a pipeline's client-credentials JWT, key rotation, altered
#   tokens refused, `flotilla login --oidc` with the device flow and its renewal;
# - tests/browser/oidc.test.mjs: the dashboard's sign-in through the provider's login page in
#   headless Chromium (scripts/browser-tests.sh installs Chromium and playwright-core).
#
#   scripts/oidc-tests.sh             # FLOTILLA_BIN as scripts/browser-tests.sh takes it
set -euo pipefail
cd "$(dirname "$0")/.."

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

# The provider is required here: a missing node or node_modules fails instead of skipping.
FLOTILLA_REQUIRE_OIDC=1 cargo test -p flotilla --test oidc

#!/usr/bin/env bash
# The dashboard's browser tests: Debian's headless Chromium driven by playwright-core (from npm,
# pinned in tests/browser/package-lock.json), against `flotilla demo` on a free loopback port
# with a temporary database. Screenshots and the demo's output land in target/browser-artifacts/.
#
#   scripts/browser-tests.sh            # uses target/release/flotilla, building it if missing
#   FLOTILLA_BIN=target/debug/flotilla scripts/browser-tests.sh
#
# No browser is downloaded: Playwright's own browser builds are never installed; Chromium comes
# from Debian's package (installed here if missing; needs root, as CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."

CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$CHROMIUM" ]; then
    echo "browser-tests: installing Debian's chromium"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium >/dev/null 2>&1 || {
        apt-get update -q >/dev/null
        apt-get install -y -q chromium >/dev/null
    }
fi
"$CHROMIUM" --version

command -v node >/dev/null || {
    echo "browser-tests: node is missing (apt-get install nodejs npm)" >&2
    exit 1
}

FLOTILLA_BIN="${FLOTILLA_BIN:-target/release/flotilla}"
if [ ! -x "$FLOTILLA_BIN" ]; then
    cargo build --release -p flotilla
fi
FLOTILLA_BIN="$(cd "$(dirname "$FLOTILLA_BIN")" && pwd)/$(basename "$FLOTILLA_BIN")"

ARTIFACTS="$(pwd)/target/browser-artifacts"
rm -rf "$ARTIFACTS"
mkdir -p "$ARTIFACTS"

cd tests/browser
npm ci --no-audit --no-fund --loglevel=error
FLOTILLA_BIN="$FLOTILLA_BIN" CHROMIUM="$CHROMIUM" ARTIFACTS="$ARTIFACTS" \
    node --test --test-concurrency=1 --test-timeout=600000 dashboard.test.mjs
echo "browser-tests: screenshots in $ARTIFACTS"

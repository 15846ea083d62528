#!/usr/bin/env bash
# Installs Debian's prometheus package when it is missing (needs root, as CI runs): the health
# check test (crates/flotilla/tests/prometheus.rs) runs a real Prometheus.
set -euo pipefail
if [ -x "${PROMETHEUS:-/usr/bin/prometheus}" ]; then
    exit 0
fi
echo "install-prometheus: installing Debian's prometheus"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q prometheus >/dev/null 2>&1 || {
    apt-get update -q >/dev/null
    apt-get install -y -q prometheus >/dev/null
}
# The package's own service is not wanted: the test starts its own on a free port.
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
    systemctl stop prometheus || true
fi
"${PROMETHEUS:-/usr/bin/prometheus}" --version | head -1

#!/bin/sh
# Flotilla exec driver, example "cluster" kept in files: prints MEMBER's cluster as JSON.
# Usage: observe.sh STATE_DIR MEMBER
set -eu
state=$1 member=$2
version=$(cat "$state/clusters/$member" 2>/dev/null || echo 1.30.5)
printf '{"region":"eastus","kubernetesVersion":"%s","nodePools":[]}\n' "$version"

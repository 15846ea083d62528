#!/bin/sh
# Flotilla exec driver, example "cluster" kept in files: prints MEMBER's cluster as JSON, with
# one node pool. A cluster never upgraded is at 1.30.5 with the node image of January.
# Usage: observe.sh STATE_DIR MEMBER
set -eu
state=$1 member=$2
version=$(cat "$state/clusters/$member" 2>/dev/null || echo 1.30.5)
image=$(cat "$state/images/$member" 2>/dev/null || echo AKSUbuntu-2204gen2containerd-202601.05.0)
family=${image%-*}
printf '{"region":"eastus","kubernetesVersion":"%s","nodePools":[{"name":"nodepool1","family":"%s","os":"Linux","nodeImageVersion":"%s"}]}\n' \
  "$version" "$family" "$image"

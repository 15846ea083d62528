#!/bin/sh
# Flotilla exec driver for EKS: starts an upgrade (update-cluster-version, then each node
# group's update-nodegroup-version) without waiting; poll.sh takes the next steps.
# Usage: upgrade.sh EKS_CLUSTER_ARN KEY UPGRADE_TYPE KUBERNETES_VERSION
set -eu
. "$(dirname "$0")/lib.sh"
key=$2 type=$3 version=$4
minor=$(printf %s "$version" | cut -d. -f1,2)
step "$type" "${minor:-none}" "$key" >/dev/null
printf '{"operationId":"%s:%s"}\n' "$type" "${minor:-none}"

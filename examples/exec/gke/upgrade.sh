#!/bin/sh
# Flotilla exec driver for GKE: starts an upgrade (gcloud container clusters upgrade --async)
# without waiting; poll.sh takes the next steps. Sent again, it starts nothing new: a step waits
# for the cluster's running operation and starts only what the cluster still lacks.
# Usage: upgrade.sh projects/P/locations/L/clusters/C UPGRADE_TYPE KUBERNETES_VERSION
set -eu
. "$(dirname "$0")/lib.sh"
type=$2 version=$3
step "$type" "${version:-none}" >/dev/null
printf '{"operationId":"%s:%s"}\n' "$type" "${version:-none}"

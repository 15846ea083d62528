#!/bin/sh
# Flotilla exec driver for AKS: the state of the operation KEY, from the cluster's provisioning
# state and the operation tag written by upgrade.sh.
# Usage: poll.sh CLUSTER_RESOURCE_ID KEY
set -eu
id=$1 key=$2
show=$(az aks show --ids "$id" -o json)
tag=$(echo "$show" | jq -r '.tags."flotilla-operation" // ""')
state=$(echo "$show" | jq -r '.provisioningState')
if [ "$tag" != "$key" ]; then echo '{"state":"Unknown"}'; exit 0; fi
case "$state" in
  Succeeded) echo '{"state":"Succeeded"}' ;;
  Failed|Canceled) printf '{"state":"Failed","message":"AKS provisioning state %s"}\n' "$state" ;;
  *) echo '{"state":"Running"}' ;;
esac

#!/bin/sh
# Flotilla exec driver for AKS: starts an upgrade without waiting for it. KEY names the attempt;
# it is recorded as a tag so that asking again with the same KEY starts nothing new.
# Usage: upgrade.sh CLUSTER_RESOURCE_ID KEY UPGRADE_TYPE KUBERNETES_VERSION
set -eu
id=$1 key=$2 type=$3 version=$4
current=$(az aks show --ids "$id" --query 'tags."flotilla-operation"' -o tsv 2>/dev/null || true)
if [ "$current" != "$key" ]; then
  az aks update --ids "$id" --tags "flotilla-operation=$key" -o none
  case "$type" in
    Full)             az aks upgrade --ids "$id" --kubernetes-version "$version" --yes --no-wait -o none ;;
    ControlPlaneOnly) az aks upgrade --ids "$id" --kubernetes-version "$version" --control-plane-only --yes --no-wait -o none ;;
    NodeImageOnly)    az aks upgrade --ids "$id" --node-image-only --yes --no-wait -o none ;;
  esac
fi
printf '{"operationId":"%s"}\n' "$key"

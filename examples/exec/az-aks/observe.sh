#!/bin/sh
# Flotilla exec driver for AKS through the Azure CLI: prints a cluster as Flotilla reads it.
# Usage: observe.sh CLUSTER_RESOURCE_ID        (needs az, logged in, and jq)
set -eu
id=$1
az aks show --ids "$id" -o json | jq '{
  region: .location,
  kubernetesVersion: .currentKubernetesVersion,
  nodePools: [.agentPoolProfiles[] | {
    name: .name,
    family: (.nodeImageVersion | sub("-[0-9.]+$"; "")),
    os: .osType,
    nodeImageVersion: .nodeImageVersion }]
}'

#!/bin/sh
# Flotilla exec driver for EKS: prints the cluster as Flotilla reads it. A node group is a pool
# whose image family is its AMI type and whose image version is its AMI release's date; the
# control plane's rollback is offered as EKS allows it (lib.sh, rollback_offer).
# Usage: observe.sh EKS_CLUSTER_ARN
set -eu
. "$(dirname "$0")/lib.sh"
version=$(eks describe-cluster --name "$name" --query cluster.version)
pools=""
groups=$(eks list-nodegroups --cluster-name "$name" --query 'nodegroups[]')
for ng in $groups; do
  out=$(eks describe-nodegroup --cluster-name "$name" --nodegroup-name "$ng" --query 'nodegroup.[amiType,releaseVersion,version]')
  set -- $out
  os=Linux
  case "$1" in WINDOWS*) os=Windows ;; esac
  # A node group has its own Kubernetes version: a ControlPlaneOnly upgrade leaves it behind.
  pools="$pools${pools:+,}{\"name\":\"$ng\",\"family\":\"$1\",\"os\":\"$os\",\"nodeImageVersion\":\"$1-${2##*-}\",\"orchestratorVersion\":\"$3.0\"}"
done
offer=$(rollback_offer "$version")
printf '{"region":"%s","kubernetesVersion":"%s.0","nodePools":[%s],"rollback":[%s]}\n' \
  "$region" "$version" "$pools" "$offer"

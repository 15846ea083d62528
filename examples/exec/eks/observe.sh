#!/bin/sh
# Flotilla exec driver for EKS: prints the cluster as Flotilla reads it. A node group is a pool
# whose image family is its AMI type and whose image version is its AMI release's date.
# Usage: observe.sh EKS_CLUSTER_ARN
set -eu
. "$(dirname "$0")/lib.sh"
version=$(eks describe-cluster --name "$name" --query cluster.version)
pools=""
groups=$(eks list-nodegroups --cluster-name "$name" --query 'nodegroups[]')
for ng in $groups; do
  out=$(eks describe-nodegroup --cluster-name "$name" --nodegroup-name "$ng" --query 'nodegroup.[amiType,releaseVersion]')
  set -- $out
  os=Linux
  case "$1" in WINDOWS*) os=Windows ;; esac
  pools="$pools${pools:+,}{\"name\":\"$ng\",\"family\":\"$1\",\"os\":\"$os\",\"nodeImageVersion\":\"$1-${2##*-}\"}"
done
printf '{"region":"%s","kubernetesVersion":"%s.0","nodePools":[%s]}\n' "$region" "$version" "$pools"

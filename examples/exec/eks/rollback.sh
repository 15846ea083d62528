#!/bin/sh
# Flotilla exec driver for EKS: rolls the control plane back to the previous minor, as EKS
# documents it (https://docs.aws.amazon.com/eks/latest/userguide/rollback-cluster.html): the
# same `aws eks update-cluster-version` as an upgrade, with the version to go back to. Its
# reply is an update (type VersionRollback) followed with `describe-update` (poll.sh). The
# client request token is the attempt's key, so asking again returns the same update.
# EKS refuses what it does not allow (past 7 days, a cluster created at its version, more than
# one minor back) with InvalidRequestException: a definitive no (exit 2) with EKS's words.
# Another update in progress (ResourceInUseException), throttling and other errors are asked
# again. Node groups are not rolled back by EKS: observe.sh offers no NodePool rollback.
# Usage: rollback.sh EKS_CLUSTER_ARN KEY SCOPE KUBERNETES_VERSION
set -eu
. "$(dirname "$0")/lib.sh"
key=$2 scope=$3 version=$4
if [ "$scope" != ControlPlane ]; then
  printf '{"message":"EKS rolls back only a control plane, not %s"}\n' "$scope"
  exit 2
fi
minor=$(printf %s "$version" | cut -d. -f1,2)
err=$(mktemp)
trap 'rm -f "$err"' EXIT
if ! out=$(eks update-cluster-version --name "$name" --kubernetes-version "$minor" \
  --client-request-token "$key" --query 'update.[id,status]' 2>"$err"); then
  said=$(tr -c '[:print:]' ' ' < "$err" | tr '"\\' "''" | sed 's/ *$//')
  case "$said" in
    *InvalidRequestException*|*InvalidParameterException*)
      printf '{"message":"EKS refused the rollback to %s: %s"}\n' "$minor" "$said"
      exit 2 ;;
    *) echo "$said" >&2; exit 1 ;;
  esac
fi
set -- $out
printf '{"operationId":"Rollback:%s"}\n' "$1"

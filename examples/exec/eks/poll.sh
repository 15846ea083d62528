#!/bin/sh
# Flotilla exec driver for EKS: the state of an upgrade, taking its next step (the control plane
# first, then the node groups one by one), or of a rollback (rollback.sh: its EKS update).
# Usage: poll.sh EKS_CLUSTER_ARN OPERATION_ID KEY
set -eu
. "$(dirname "$0")/lib.sh"
op=$2 key=$3
case "$op" in
  Full:*|ControlPlaneOnly:*|NodeImageOnly:*) step "${op%%:*}" "${op#*:}" "$key" ;;
  Rollback:*)
    out=$(eks describe-update --name "$name" --update-id "${op#Rollback:}" \
      --query 'update.[status,errors[0].errorMessage]')
    if settle "control plane rollback" $out; then echo '{"state":"Succeeded"}'; fi ;;
  *) echo '{"state":"Unknown"}' ;;
esac

#!/bin/sh
# Flotilla exec driver for GKE: the state of an upgrade, taking its next step.
# Usage: poll.sh projects/P/locations/L/clusters/C OPERATION_ID
set -eu
. "$(dirname "$0")/lib.sh"
op=$2
case "$op" in
  Full:*|ControlPlaneOnly:*|NodeImageOnly:*) step "${op%%:*}" "${op#*:}" ;;
  *) echo '{"state":"Unknown"}' ;;
esac

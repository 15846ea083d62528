#!/bin/sh
# Flotilla exec driver, example: reports the state of operation KEY; an upgrade takes
# DURATION_MS milliseconds, then the cluster has what its type changes: the Kubernetes version
# (Full, ControlPlaneOnly) and the node image (Full, NodeImageOnly).
# Usage: poll.sh STATE_DIR MEMBER KEY DURATION_MS
set -eu
state=$1 key=$3 duration_ms=$4
dir="$state/ops/$key"
if [ ! -f "$dir/started" ]; then
  echo '{"state":"Unknown"}'
  exit 0
fi
started=$(cat "$dir/started")
now=$(date +%s%N)
if [ $(( (now - started) / 1000000 )) -lt "$duration_ms" ]; then
  echo '{"state":"Running"}'
  exit 0
fi
read -r member type version image < "$dir/target"
if [ "$type" != NodeImageOnly ] && [ "$version" != - ]; then
  echo "$version" > "$state/clusters/$member"
fi
if [ "$type" != ControlPlaneOnly ] && [ "$image" != - ]; then
  echo "$image" > "$state/images/$member"
fi
echo '{"state":"Succeeded"}'

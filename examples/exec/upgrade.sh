#!/bin/sh
# Flotilla exec driver, example: starts an upgrade of MEMBER. TYPE is Full (the default),
# ControlPlaneOnly or NodeImageOnly; VERSION is the Kubernetes version (empty for
# NodeImageOnly), IMAGE the node image to move to (empty: the node image stays). The same KEY
# twice starts nothing new (the server may ask again after a crash). Every request received is
# appended to STATE_DIR/received.log (with the sending server's pid and the time in ns), and
# every upgrade actually started to STATE_DIR/upgrades.log.
# Usage: upgrade.sh STATE_DIR MEMBER KEY VERSION [TYPE [IMAGE]]
set -eu
state=$1 member=$2 key=$3 version=$4 type=${5:-Full} image=${6:-}
case "$type" in
  Full|ControlPlaneOnly|NodeImageOnly) ;;
  *) echo "{\"message\":\"unknown upgrade type $type\"}"; exit 2 ;;
esac
if [ "$type" != NodeImageOnly ] && [ -z "$version" ]; then
  echo "{\"message\":\"a $type upgrade needs a Kubernetes version\"}"
  exit 2
fi
mkdir -p "$state/ops" "$state/clusters" "$state/images"
echo "$member $key $version $PPID $(date +%s%N)" >> "$state/received.log"
tmp=$(mktemp -d "$state/tmp.XXXXXX")
echo "$member $type ${version:--} ${image:--}" > "$tmp/target"
date +%s%N > "$tmp/started"
# The rename is atomic: exactly one caller with this KEY wins.
if mv -T "$tmp" "$state/ops/$key" 2>/dev/null; then
  echo "$member $key $version" >> "$state/upgrades.log"
else
  rm -rf "$tmp"
fi
printf '{"operationId":"%s"}\n' "$key"

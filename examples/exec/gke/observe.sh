#!/bin/sh
# Flotilla exec driver for GKE: prints the cluster as Flotilla reads it. A node pool's image
# family is its image type and its image version its GKE version (1.30.5-gke.1014001 as
# 1.30.5.1014001).
# Usage: observe.sh projects/P/locations/L/clusters/C
set -eu
. "$(dirname "$0")/lib.sh"
master=$(gc clusters describe "$name" --format "value(currentMasterVersion)")
list=$(gc node-pools list --cluster "$name" --format "value(name)")
pools=""
for np in $list; do
  out=$(gc node-pools describe "$np" --cluster "$name" --format "value(config.imageType,version)")
  set -- $out
  os=Linux
  case "$1" in WINDOWS*) os=Windows ;; esac
  image=$(printf %s "$2" | sed 's/-gke\././')
  pools="$pools${pools:+,}{\"name\":\"$np\",\"family\":\"$1\",\"os\":\"$os\",\"nodeImageVersion\":\"$1-$image\"}"
done
printf '{"region":"%s","kubernetesVersion":"%s","nodePools":[%s]}\n' "$location" "$(plain "$master")" "$pools"

# Shared by the GKE scripts (sourced): the cluster an id projects/P/locations/L/clusters/C
# names, and one step of an upgrade toward its target. Needs gcloud, logged in. GKE runs one
# operation at a time on a cluster: a step waits for the running one, then starts the next
# (the control plane first, then the node pools one by one) until the cluster is at target.
# Versions compare without GKE's suffix (1.31.2-gke.1200000 is 1.31.2).
id=$1
case "$id" in
  projects/?*/locations/?*/clusters/?*) ;;
  *) printf '{"message":"%s is not a GKE cluster id (projects/P/locations/L/clusters/C)"}\n' "$id"; exit 2 ;;
esac
project=$(printf %s "$id" | cut -d/ -f2)
location=$(printf %s "$id" | cut -d/ -f4)
name=$(printf %s "$id" | cut -d/ -f6)

gc() { gcloud container "$@" --project "$project" --location "$location"; }
plain() { printf %s "$1" | cut -d- -f1; }

# One step toward TYPE at VERSION; prints the poll answer. (A failing gcloud ends the script
# with its exit status: asked again later. A failed GKE operation leaves the cluster where it
# was, so the next step sends it again; the member fails at operationDeadlineSeconds.)
step() {
  type=$1 version=$2
  running=$(gc operations list --filter "targetLink~/clusters/$name\$ AND status!=DONE" --format "value(name)")
  if [ -n "$running" ]; then
    echo '{"state":"Running"}'
    return 0
  fi
  master=$(gc clusters describe "$name" --format "value(currentMasterVersion)")
  if [ "$type" != NodeImageOnly ] && [ "$(plain "$master")" != "$version" ]; then
    gc clusters upgrade "$name" --master --cluster-version "$version" --quiet --async >/dev/null
    echo '{"state":"Running"}'
    return 0
  fi
  if [ "$type" = ControlPlaneOnly ]; then
    echo '{"state":"Succeeded"}'
    return 0
  fi
  pools=$(gc node-pools list --cluster "$name" --format "value(name)")
  for np in $pools; do
    at=$(gc node-pools describe "$np" --cluster "$name" --format "value(version)")
    if [ "$type" = Full ]; then
      [ "$(plain "$at")" = "$version" ] && continue
      gc clusters upgrade "$name" --node-pool "$np" --cluster-version "$version" --quiet --async >/dev/null
    else
      # A node pool's image follows its version: NodeImageOnly brings it to the control plane's.
      [ "$at" = "$master" ] && continue
      gc clusters upgrade "$name" --node-pool "$np" --quiet --async >/dev/null
    fi
    echo '{"state":"Running"}'
    return 0
  done
  echo '{"state":"Succeeded"}'
}

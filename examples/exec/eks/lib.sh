# Shared by the EKS scripts (sourced): the cluster an EKS ARN names, and one step of an
# upgrade toward its target. Needs the AWS CLI, with credentials for the cluster's account.
# EKS versions have no patch: a cluster at EKS 1.30 is observed as 1.30.0, and a target's
# patch is ignored.
arn=$1
region=$(printf %s "$arn" | cut -d: -f4)
name=${arn##*/}
case "$arn" in
  arn:aws*:eks:*:*:cluster/?*) ;;
  *) printf '{"message":"%s is not the ARN of an EKS cluster"}\n' "$arn"; exit 2 ;;
esac

eks() { aws eks "$@" --region "$region" --output text; }

# One step toward TYPE at MINOR for the attempt KEY; prints the poll answer. Every request
# carries a client request token derived from KEY, so asking again never starts a second update.
step() {
  type=$1 minor=$2 key=$3
  # (A failing `aws` ends the script with its exit status: asked again later.)
  if [ "$type" != NodeImageOnly ]; then
    current=$(eks describe-cluster --name "$name" --query cluster.version)
    if [ "$current" != "$minor" ]; then
      out=$(eks update-cluster-version --name "$name" --kubernetes-version "$minor" \
        --client-request-token "$key" --query 'update.[status,errors[0].errorMessage]')
      settle "control plane" $out || return 0
    fi
  fi
  if [ "$type" = ControlPlaneOnly ]; then
    echo '{"state":"Succeeded"}'
    return 0
  fi
  groups=$(eks list-nodegroups --cluster-name "$name" --query 'nodegroups[]')
  for ng in $groups; do
    if [ "$type" = Full ]; then
      at=$(eks describe-nodegroup --cluster-name "$name" --nodegroup-name "$ng" --query nodegroup.version)
      [ "$at" = "$minor" ] && continue
      out=$(eks update-nodegroup-version --cluster-name "$name" --nodegroup-name "$ng" \
        --kubernetes-version "$minor" --client-request-token "$key-$ng" --query 'update.[status,errors[0].errorMessage]')
    else
      # The latest AMI release for the node group's version.
      out=$(eks update-nodegroup-version --cluster-name "$name" --nodegroup-name "$ng" \
        --client-request-token "$key-$ng" --query 'update.[status,errors[0].errorMessage]')
    fi
    settle "node group $ng" $out || return 0
  done
  echo '{"state":"Succeeded"}'
}

# An update's status: returns 0 when it is done; otherwise prints the poll answer, returns 1.
settle() {
  what=$1 status=$2
  shift 2
  case "$status" in
    Successful) return 0 ;;
    Failed|Cancelled) printf '{"state":"Failed","message":"EKS %s update %s: %s"}\n' "$what" "$status" "$*" ;;
    *) echo '{"state":"Running"}' ;;
  esac
  return 1
}

# The control plane rollback EKS offers the cluster now at MINOR, as Flotilla's `rollback` JSON
# (empty: none). EKS rolls a control plane back to the previous minor within 7 days of an
# in-place upgrade, and not a cluster created at its version or rolled back to it
# (https://docs.aws.amazon.com/eks/latest/userguide/rollback-cluster.html). Nothing in
# describe-cluster says so; it is read from the cluster's updates: the latest successful
# Kubernetes version change must be a VersionUpdate to MINOR. An update records when it was
# created, not when it ended, so the offer ends 7 days after its creation: a little before
# EKS's own window (7 days from the end of the upgrade) closes, never after.
rollback_offer() {
  minor=$1
  latest=0 latest_type= latest_version=
  for id in $(eks list-updates --name "$name" --query 'updateIds[]'); do
    out=$(eks describe-update --name "$name" --update-id "$id" \
      --query 'update.[type,status,createdAt,params[?type==`Version`].value|[0]]')
    set -- $out
    [ "${2:-}" = Successful ] || continue
    case "$1" in VersionUpdate|VersionRollback) ;; *) continue ;; esac
    at=$(date -u -d "$3" +%s)
    if [ "$at" -gt "$latest" ]; then
      latest=$at latest_type=$1 latest_version=${4:-}
    fi
  done
  [ "$latest_type" = VersionUpdate ] && [ "$latest_version" = "$minor" ] || return 0
  until=$((latest + 7 * 86400))
  [ "$(date -u +%s)" -lt "$until" ] || return 0
  major=${minor%%.*} previous=$((${minor#*.} - 1))
  [ "$previous" -ge 0 ] || return 0
  printf '{"scope":"ControlPlane","to":{"kubernetesVersion":"%s.%s.0"},"until":"%s"}' \
    "$major" "$previous" "$(date -u -d "@$until" +%Y-%m-%dT%H:%M:%SZ)"
}

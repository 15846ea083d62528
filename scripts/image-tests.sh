#!/usr/bin/env bash
# The OCI image, built and run without a Docker daemon (issue #42): buildah makes it FROM
# scratch with the release binary and the glibc libraries it links (ldd), CA certificates and a
# configuration file; its entrypoint is `flotilla serve`. podman runs it with a token made on
# the host, and /healthz and an authenticated GET /v1/fleets are reached from the host through
# a published port; then it is stopped (SIGTERM: exit 0) and removed. Fails on any failure.
#
#   scripts/image-tests.sh        (root; the release binary is built when missing)
#
# Writes the image as target/flotilla-VERSION.oci.tar (`skopeo copy oci-archive:… docker://…`
# or `podman load -i …` to push or load it). Installs Debian's buildah, podman and runc when
# missing. Containers' storage and configuration are the script's own, under the target
# directory: nothing of the machine's is used or changed. The recipe that makes podman run here
# (no systemd, cgroup v1, no permission to set rlimits) is containers.conf below:
# `default_ulimits = []`, runc, cgroupfs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { echo "image-tests: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }
[ "$(id -u)" = 0 ] || fail "must run as root (buildah and podman's storage, the container network)"

metadata="$(cargo metadata --format-version 1 --no-deps)"
target_dir="$(python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])' <<<"$metadata")"
version="$(python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "flotilla"))' <<<"$metadata")"
bin="$target_dir/release/flotilla"
if [ ! -x "$bin" ]; then
    say "no release binary at $bin: building it"
    cargo build --release -p flotilla
fi

missing=()
for pkg in buildah podman runc ca-certificates; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

store="$target_dir/containers"
mkdir -p "$store"
export CONTAINERS_CONF="$store/containers.conf"
cat >"$CONTAINERS_CONF" <<'CONF'
[containers]
# The default ulimits (nofile, nproc) cannot be set by runc where the process may not raise
# them: "error setting rlimits for ready process: ... operation not permitted".
default_ulimits = []

[engine]
# Debian's runc; cgroupfs, as systemd is not running.
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
# vfs: no overlay mount needed, whatever the filesystem under the target directory.
storage=(--root "$store/storage" --runroot "$store/run" --storage-driver vfs)
bah() { buildah "${storage[@]}" "$@"; }
pod() { podman "${storage[@]}" --runtime runc --cgroup-manager cgroupfs "$@"; }

image="localhost/flotilla:$version"
name="flotilla-image-test-$$"
work="$(mktemp -d)"
ctr=""
cleanup() {
    local status=$?
    pod rm -f -t 5 "$name" >/dev/null 2>&1 || true
    if [ -n "$ctr" ]; then bah rm "$ctr" >/dev/null 2>&1 || true; fi
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT

# --- Build ----------------------------------------------------------------------------------------
pod rm -f -a >/dev/null 2>&1 || true
bah rm --all >/dev/null
bah rmi -f "$image" >/dev/null 2>&1 || true
ctr="$(bah from scratch)"
root="$(bah mount "$ctr")"

install -D -m 0755 "$bin" "$root/usr/bin/flotilla"
strip --strip-debug "$root/usr/bin/flotilla"
# The shared libraries it links, at the paths the loader looks for them (the loader too).
ldd "$bin" >"$work/ldd.txt"
! grep -q 'not found' "$work/ldd.txt" || fail "ldd: $(cat "$work/ldd.txt")"
libs="$(grep -o '/[^ ]*' "$work/ldd.txt")"
[ -n "$libs" ] || fail "ldd found no libraries: $(cat "$work/ldd.txt")"
for lib in $libs; do install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"; done
say "libraries: $(tr '\n' ' ' <<<"$libs")"
# Authorities for HTTPS (Azure Resource Manager, PostgreSQL with sslmode=verify-full).
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
install -D -m 0644 packaging/image/flotilla.toml "$root/etc/flotilla/flotilla.toml"
printf 'root:x:0:0:root:/:/sbin/nologin\nflotilla:x:65532:65532:Flotilla:/var/lib/flotilla:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nflotilla:x:65532:\n' >"$root/etc/group"
printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
install -d -m 0750 -o 65532 -g 65532 "$root/var/lib/flotilla"
install -d -m 1777 "$root/tmp"
bah umount "$ctr" >/dev/null

bah config \
    --entrypoint '["/usr/bin/flotilla", "serve"]' \
    --env FLOTILLA_SERVE_CONFIG=/etc/flotilla/flotilla.toml \
    --user 65532:65532 \
    --workingdir /var/lib/flotilla \
    --volume /var/lib/flotilla \
    --port 8080 \
    --stop-signal SIGTERM \
    --label org.opencontainers.image.title=flotilla \
    --label "org.opencontainers.image.version=$version" \
    --label org.opencontainers.image.description="Flotilla: staged upgrades for fleets of Kubernetes clusters" \
    "$ctr"
bah commit --quiet "$ctr" "$image" >/dev/null
bah rm "$ctr" >/dev/null
ctr=""
archive="$target_dir/flotilla-$version.oci.tar"
rm -f "$archive"
bah push --quiet "$image" "oci-archive:$archive:$image"
say "built $image ($(du -h "$archive" | cut -f1) as $archive)"

bah inspect --type image "$image" >"$work/inspect.json"
python3 - "$work/inspect.json" <<'PY' || fail "the image's configuration: $(cat "$work/inspect.json")"
import json, sys
c = json.load(open(sys.argv[1]))["OCIv1"]["config"]
assert c["Entrypoint"] == ["/usr/bin/flotilla", "serve"], c["Entrypoint"]
assert "FLOTILLA_SERVE_CONFIG=/etc/flotilla/flotilla.toml" in c["Env"], c["Env"]
assert c["User"] == "65532:65532", c["User"]
PY

# --- Run ------------------------------------------------------------------------------------------
# The configuration it would run with, from the image's own file.
pod run --rm "$image" --print-config >"$work/config.toml"
grep -qx 'listen = "0.0.0.0:8080"' "$work/config.toml" || fail "the image's configuration: $(cat "$work/config.toml")"
grep -qx 'database = "/var/lib/flotilla/flotilla.db"' "$work/config.toml" || fail "the image's database: $(cat "$work/config.toml")"

# Its database on a volume, with the first admin token made by the same binary on the host.
mkdir "$work/data"
token="$("$bin" token create --role admin --subject image-test --database "$work/data/flotilla.db" \
    | grep -o 'flt_[A-Za-z0-9_]*' | head -1)"
[ -n "$token" ] || fail "token create printed no token"
chown -R 65532:65532 "$work/data"

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
pod run -d --name "$name" -p "127.0.0.1:$port:8080" -v "$work/data:/var/lib/flotilla" "$image" >/dev/null
base="http://127.0.0.1:$port"
for _ in $(seq 1 100); do
    curl -sf "$base/healthz" >/dev/null && break
    [ "$(pod inspect --format '{{.State.Running}}' "$name")" = true ] || break
    sleep 0.2
done
curl -sf "$base/healthz" >/dev/null || { pod logs "$name" >&2 || true; fail "no /healthz from the container"; }
say "GET $base/healthz (podman, published port): $(curl -sf "$base/healthz")"
code="$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/fleets")"
[ "$code" = 401 ] || fail "GET /v1/fleets without a token answered $code, not 401"
fleets="$(curl -sf -H "Authorization: Bearer $token" "$base/v1/fleets")" || { pod logs "$name" >&2; fail "authenticated GET /v1/fleets"; }
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["value"] == [], d' "$fleets" || fail "GET /v1/fleets answered $fleets"
say "GET $base/v1/fleets with the admin token: $fleets"

pod stop -t 30 "$name" >/dev/null
exit_code="$(pod inspect --format '{{.State.ExitCode}}' "$name")"
pod logs "$name" >"$work/serve.log" 2>&1
[ "$exit_code" = 0 ] || { cat "$work/serve.log" >&2; fail "the container exited $exit_code on stop"; }
grep -q '"shutting down"' "$work/serve.log" || { cat "$work/serve.log" >&2; fail "no clean shutdown in the JSON log"; }
pod rm "$name" >/dev/null
say "stopped cleanly (SIGTERM, exit 0); all checks passed"

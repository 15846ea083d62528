#!/usr/bin/env bash
# The Debian package, end to end on this machine (issue #42): build the .deb from the release
# binary with cargo-deb, check what it holds, install it with dpkg, check the installed unit
# with `systemd-analyze verify` (and its hardening with `systemd-analyze security`), create an
# admin token in the installed configuration's database as the flotilla user, serve from the
# installed unit's own ExecStart as that user (systemd is not PID 1 here, so the unit cannot be
# started), reach /healthz and an authenticated GET /v1/fleets, stop it (SIGTERM, as systemd
# would), purge the package and check that nothing of it is left. Fails on any failure.
#
#   scripts/package-tests.sh        (root; the release binary is built when missing)
#
# Installs cargo-deb (pinned) when it is not there. Refuses to run over a flotilla package it
# did not install, except in CI (CI=true), where a leftover of an interrupted run is purged.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cargo_deb_version=3.8.0
unit=/usr/lib/systemd/system/flotilla.service
say() { echo "package-tests: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

[ "$(id -u)" = 0 ] || fail "must run as root (dpkg -i, a system user)"

target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
bin="$target_dir/release/flotilla"
if [ ! -x "$bin" ]; then
    say "no release binary at $bin: building it"
    cargo build --release -p flotilla
fi

if ! cargo deb --version 2>/dev/null | grep -qF "$cargo_deb_version"; then
    say "installing cargo-deb $cargo_deb_version"
    cargo install cargo-deb --locked --version "$cargo_deb_version"
fi

server=""
installed=false
user_existed=false
id flotilla >/dev/null 2>&1 && user_existed=true
work="$(mktemp -d)"
cleanup() {
    local status=$?
    if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then kill -TERM "$server"; wait "$server" 2>/dev/null || true; fi
    if [ "$installed" = true ]; then dpkg --purge flotilla >/dev/null 2>&1 || status=1; fi
    if [ "$user_existed" = false ] && id flotilla >/dev/null 2>&1; then
        userdel flotilla 2>/dev/null || true
        if getent group flotilla >/dev/null; then groupdel flotilla 2>/dev/null || true; fi
    fi
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT

# --- Build and inspect the package -------------------------------------------------------------
rm -rf "$target_dir/debian"
deb="$(cargo deb -p flotilla --no-build --strip --output "$target_dir/debian/" 2>"$target_dir/cargo-deb.log" | tail -1)" \
    || { cat "$target_dir/cargo-deb.log" >&2; fail "cargo deb"; }
[ -f "$deb" ] || { cat "$target_dir/cargo-deb.log" >&2; fail "cargo deb printed no package path"; }
say "built $deb"

contents="$(dpkg-deb --contents "$deb")"
for path in ./usr/bin/flotilla ./usr/lib/systemd/system/flotilla.service ./usr/lib/sysusers.d/flotilla.conf \
    ./etc/flotilla/flotilla.toml ./usr/share/doc/flotilla/README.Debian ./usr/share/doc/flotilla/README.md \
    ./usr/share/doc/flotilla/docs/install.md ./usr/share/doc/flotilla/docs/operate.md; do
    grep -qE " $path\$" <<<"$contents" || fail "the package lacks $path"
done
control="$work/control"
dpkg-deb --control "$deb" "$control"
grep -qx /etc/flotilla/flotilla.toml "$control/conffiles" || fail "/etc/flotilla/flotilla.toml is not a conffile"
grep -q 'systemd-sysusers' "$control/postinst" || fail "postinst does not create the flotilla user"
grep -q '^Depends:.*libc6' "$control/control" || fail "Depends lacks libc6: $(grep ^Depends "$control/control")"

# --- Install ------------------------------------------------------------------------------------
if dpkg-query -W -f='${Status}' flotilla 2>/dev/null | grep -q 'install ok installed'; then
    [ "${CI:-}" = true ] || fail "a flotilla package is already installed; this test installs and purges its own: remove it first"
    say "CI: purging a flotilla package left by an interrupted run"
    dpkg --purge flotilla
    user_existed=false # the leftover's
fi

# What the package may touch, to compare after the purge.
snapshot() { { find /etc/systemd /var/lib/systemd /usr/lib/systemd/system /usr/lib/sysusers.d /etc/flotilla \
    /var/lib/flotilla 2>/dev/null || true; } | sort; }
snapshot >"$work/before.txt"

installed=true
dpkg -i "$deb" | tee "$work/dpkg-install.log"
grep -q 'runuser -u flotilla -- flotilla token create --role admin' "$work/dpkg-install.log" \
    || fail "postinst did not print the first-run note"
id flotilla >/dev/null || fail "installing did not create the flotilla user"
# Stripped (--strip): the release profile's line tables would make it 187 MB.
[ "$(stat -c %s /usr/bin/flotilla)" -lt 100000000 ] || fail "/usr/bin/flotilla is $(stat -c %s /usr/bin/flotilla) bytes: not stripped"
[ "$(stat -c %U:%G:%a /var/lib/flotilla)" = flotilla:flotilla:750 ] \
    || fail "/var/lib/flotilla is $(stat -c %U:%G:%a /var/lib/flotilla), not flotilla:flotilla:750"

# --- The installed unit -------------------------------------------------------------------------
[ -f "$unit" ] || fail "no $unit"
# verify exits 0 on a misspelt key or a bad value ("ignoring"): any word from it fails here.
verify="$(systemd-analyze verify --man=no "$unit" 2>&1)" || fail "systemd-analyze verify $unit: $verify"
[ -z "$verify" ] || fail "systemd-analyze verify $unit: $verify"
say "systemd-analyze verify: ok (no warning)"
# The hardening stays where it is: exposure 1.4 "OK" when written, 10 is unprotected; the
# threshold counts in tenths (20 is 2.0).
systemd-analyze security --offline=yes --threshold=20 --no-pager "$unit" >"$work/security.log" 2>&1 \
    || { cat "$work/security.log" >&2; fail "systemd-analyze security: exposure above 2.0"; }
say "$(grep -o 'Overall exposure level.*' "$work/security.log")"
for directive in 'User=flotilla' 'NoNewPrivileges=yes' 'ProtectSystem=strict' 'ProtectHome=yes' \
    'PrivateTmp=yes' 'StateDirectory=flotilla'; do
    grep -qx "$directive" "$unit" || fail "$unit lacks $directive"
done

# The unit's own command line, user and working directory, as systemd would run them.
exec_start="$(sed -n 's/^ExecStart=//p' "$unit")"
user="$(sed -n 's/^User=//p' "$unit")"
workdir="$(sed -n 's/^WorkingDirectory=//p' "$unit")"
[ "$exec_start" = "/usr/bin/flotilla serve --config /etc/flotilla/flotilla.toml" ] \
    || fail "unexpected ExecStart: $exec_start"
read -ra command <<<"$exec_start"
# Simple commands, so that a background one's $! is the server itself (setpriv, env and sh exec).
as_service=(setpriv --reuid="$user" --regid="$user" --init-groups --
    env -i -C "$workdir" PATH=/usr/local/bin:/usr/bin:/bin HOME="$workdir" USER="$user" LOGNAME="$user")
with_umask=(/bin/sh -c 'umask 0027 && exec "$@"' sh)

# The database the installed configuration names, as the server would resolve it.
"${as_service[@]}" "${with_umask[@]}" "${command[@]}" --print-config >"$work/config.toml"
database="$(sed -n 's/^database = "\(.*\)"$/\1/p' "$work/config.toml")"
listen="$(sed -n 's/^listen = "\(.*\)"$/\1/p' "$work/config.toml")"
[ "$database" = /var/lib/flotilla/flotilla.db ] || fail "the installed configuration's database is '$database'"
[ "$listen" = 127.0.0.1:8080 ] || fail "the installed configuration listens on '$listen'"

# The first admin token, as the first-run note says.
token="$("${as_service[@]}" "${with_umask[@]}" /usr/bin/flotilla token create --role admin --subject package-test --database "$database" \
    | grep -o 'flt_[A-Za-z0-9_]*' | head -1)"
[ -n "$token" ] || fail "token create printed no token"
[ "$(stat -c %U "$database")" = "$user" ] || fail "$database is not owned by $user"

# Serve. Where something else holds the configured port, the environment moves it (as a
# drop-in's Environment= would); everything else is the file's.
if (exec 3<>"/dev/tcp/${listen%:*}/${listen##*:}") 2>/dev/null; then
    say "$listen is taken on this machine: serving on a free port instead (FLOTILLA_LISTEN)"
    "${as_service[@]}" FLOTILLA_LISTEN=127.0.0.1:0 "${with_umask[@]}" "${command[@]}" >"$work/serve.log" 2>&1 &
else
    "${as_service[@]}" "${with_umask[@]}" "${command[@]}" >"$work/serve.log" 2>&1 &
fi
server=$!
base=""
for _ in $(seq 1 100); do
    base="$(grep -o 'serving http://[0-9.:]*' "$work/serve.log" | head -1 | cut -d' ' -f2 || true)"
    [ -n "$base" ] && curl -sf "$base/healthz" >/dev/null && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
done
curl -sf "$base/healthz" >/dev/null || { cat "$work/serve.log" >&2; fail "no /healthz from the installed service"; }
[ "$(ps -o user=,args= -p "$server")" = "$user $exec_start" ] \
    || fail "the server is not the unit's command as $user: $(ps -o user=,args= -p "$server")"
say "served by $(ps -o pid=,user=,args= -p "$server")"
say "GET $base/healthz: $(curl -sf "$base/healthz")"

code="$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/fleets")"
[ "$code" = 401 ] || fail "GET /v1/fleets without a token answered $code, not 401"
curl -sf -H "Authorization: Bearer $token" "$base/v1/fleets" >"$work/fleets.json" \
    || { cat "$work/serve.log" >&2; fail "authenticated GET /v1/fleets"; }
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["value"] == [], d' "$work/fleets.json" \
    || fail "GET /v1/fleets answered $(cat "$work/fleets.json")"
say "GET $base/v1/fleets with the admin token: $(cat "$work/fleets.json")"

# Stop it as systemd would (KillSignal=SIGTERM): a clean shutdown, exit status 0.
kill -TERM "$server"
status=0
wait "$server" || status=$?
server=""
[ "$status" = 0 ] || { cat "$work/serve.log" >&2; fail "the server exited $status on SIGTERM"; }
grep -q 'shutting down' "$work/serve.log" || { cat "$work/serve.log" >&2; fail "no clean shutdown logged"; }
say "stopped cleanly"

# --- Purge: nothing of the package is left ------------------------------------------------------
dpkg --purge flotilla
installed=false
for path in /usr/bin/flotilla "$unit" /etc/flotilla /var/lib/flotilla /usr/share/doc/flotilla; do
    [ ! -e "$path" ] || fail "$path is left after purge"
done
if dpkg-query -W -f='${Status}' flotilla 2>/dev/null | grep -q 'install ok installed'; then fail "flotilla is still installed"; fi
# The system user stays after a purge (as Debian does); this test removes the one it made.
if [ "$user_existed" = false ]; then
    userdel flotilla
    if getent group flotilla >/dev/null; then groupdel flotilla; fi
    ! getent passwd flotilla >/dev/null || fail "the flotilla user is left"
fi
snapshot >"$work/after.txt"
diff "$work/before.txt" "$work/after.txt" >&2 || fail "the purge left the files above"
say "purged"
say "all checks passed"

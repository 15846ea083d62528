#!/bin/sh
# Flotilla exec driver, example: prints the release catalog, STATE_DIR/catalog.json if there is
# one (to publish a release, write it there), else the one below: what the server checks a
# run's target against and where NodeImageOnly runs find the latest node image.
# Usage: catalog.sh STATE_DIR
set -eu
state=$1
if [ -f "$state/catalog.json" ]; then
  cat "$state/catalog.json"
  exit 0
fi
cat <<'JSON'
{"eastus": {"kubernetes": [{"version": "1.30.5"}, {"version": "1.31.1"}, {"version": "1.31.2"}],
            "nodeImages": {"AKSUbuntu-2204gen2containerd": [{"version": "202601.05.0"}, {"version": "202602.10.0"}]}}}
JSON

#!/usr/bin/env bash
# Runs LabOverWire's mqtt5-conformance-cli against statehub (tests/conformance.toml).
# Build the runner from a checkout of github.com/LabOverWire/mqtt-lib with
#   cargo build --profile conformance -p mqtt5-conformance-cli
# and pass the binary's path:
#   scripts/interop/conformance.sh /path/to/mqtt5-conformance [filter...]
# SECURITY=rules adds security as far as the suite allows (scripts/interop/security.sh):
# its SUT file has no credentials and its raw CONNECTs carry none.
set -u
RUNNER=${1:?path to the mqtt5-conformance binary}
shift
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN=${BIN:-$ROOT/target/release/statehub}
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release -p statehub)
CONFIG="$ROOT/tests/conformance.toml"
. "$ROOT/scripts/interop/security.sh"
# MQTT over WebSocket on the HTTP listener: ws://127.0.0.1:19601/mqtt (the SUT file says so).
"$BIN" serve --config "$CONFIG" --mqtt-listen 127.0.0.1:19600 --http-listen 127.0.0.1:19601 >/tmp/conformance-broker.log 2>&1 &
bp=$!
sleep 0.5
"$RUNNER" --sut "$ROOT/scripts/interop/conformance-sut.toml" "$@"
rc=$?
kill $bp 2>/dev/null; wait $bp 2>/dev/null
exit $rc

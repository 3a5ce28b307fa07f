#!/usr/bin/env bash
# Runs the Eclipse Paho interoperability suites against statehub, one test at a
# time under a timeout, each against a fresh server started with
# tests/paho-interop.toml. The suites are not part of this repository: pass the
# path of a checkout of github.com/eclipse/paho.mqtt.testing.
#
#   scripts/interop/paho.sh /path/to/paho.mqtt.testing [client_test5.py|client_test.py] [test names...]
#
# SECURITY=rules runs the suite with security configured as far as it allows
# (scripts/interop/security.sh): its clients send no credentials and speak plain TCP
# (its connect() is never given a user name or password, and it has no option for
# them), so anonymous clients are admitted explicitly beside a password file, and
# authorization rules grant every client what the suite does.
set -u
PAHO=${1:?path to a paho.mqtt.testing checkout}
SUITE=${2:-client_test5.py}
shift $(( $# >= 2 ? 2 : $# ))
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN=${BIN:-$ROOT/target/release/statehub}
PORT=${PORT:-19830}
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release -p statehub)
CONFIG="$ROOT/tests/paho-interop.toml"
. "$ROOT/scripts/interop/security.sh"
cd "$PAHO/interoperability"
tests=${*:-$(grep -o "def test_[a-z0-9_]*" "$SUITE" | sed 's/def //')}
pass=0; fail=0; failed=""
for t in $tests; do
  "$BIN" serve --config "$CONFIG" --mqtt-listen 127.0.0.1:$PORT --http-listen 127.0.0.1:0 >/tmp/paho-broker-$t.log 2>&1 &
  bp=$!
  sleep 0.3
  if timeout 60 python3 "$ROOT/scripts/interop/paho_one.py" "$SUITE" $PORT "Test.$t" >/tmp/paho-$t.log 2>&1; then
    pass=$((pass+1))
  else
    fail=$((fail+1)); failed="$failed $t"
  fi
  kill $bp 2>/dev/null; wait $bp 2>/dev/null
done
echo "$SUITE: $pass passed, $fail failed${failed:+:$failed}"
[ $fail -eq 0 ]

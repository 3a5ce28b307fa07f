#!/usr/bin/env bash
# Runs the integration tests of @azure/web-pubsub-client (azure-sdk-for-js,
# sdk/web-pubsub/web-pubsub-client/test/integration) against statehub. Their code is
# not part of this repository: pass the path of an azure-sdk-for-js checkout, or of
# its sdk/web-pubsub/web-pubsub-client folder.
#
#   scripts/interop/webpubsub-js-integration.sh /path/to/azure-sdk-for-js [--published]
#
# The monorepo's own tooling (rush, dev-tool) is not needed: a scratch runner outside
# this repository (RUNNER, default a fresh temporary directory) gets a copy of the
# folder's src/ and test/integration/, vitest, @azure/web-pubsub (the server SDK the
# tests use to mint client tokens and send) and the client's runtime dependencies, all
# installed with npm. By default the tests run against the client built from the
# folder's sources (vitest transpiles them); with --published, against the published
# @azure/web-pubsub-client ($CLIENT_VERSION, default 1.1.0) instead, through a
# src/webPubSubClient.js that re-exports it.
#
# statehub ($BIN, default target/debug/statehub, built if missing) is started on a free
# loopback port with a fresh access key; the tests get
# WEB_PUBSUB_CONNECTION_STRING=Endpoint=http://127.0.0.1:PORT;AccessKey=KEY;Version=1.0;
# The counts are printed last; the vitest output is kept in $RUNNER/vitest.log and the
# server log in $RUNNER/statehub.log.
set -u
SRC=${1:?path to an azure-sdk-for-js checkout or its web-pubsub-client folder}
MODE=${2:-source}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN=${BIN:-$ROOT/target/debug/statehub}
RUNNER=${RUNNER:-$(mktemp -d /tmp/wps-js-runner.XXXXXX)}
CLIENT_VERSION=${CLIENT_VERSION:-1.1.0}
SERVICE_VERSION=${SERVICE_VERSION:-1.2.0}
VITEST_VERSION=${VITEST_VERSION:-3.2.4}

if [ -d "$SRC/sdk/web-pubsub/web-pubsub-client" ]; then
  PKG="$SRC/sdk/web-pubsub/web-pubsub-client"
else
  PKG="$SRC"
fi
[ -d "$PKG/test/integration" ] || { echo "no test/integration under $PKG" >&2; exit 2; }
case "$RUNNER" in "$ROOT"/*) echo "RUNNER must be outside the repository" >&2; exit 2;; esac

[ -x "$BIN" ] || (cd "$ROOT" && cargo build -p statehub) || exit 1

# The scratch runner: a copy of the tests (and sources), never inside this repository.
mkdir -p "$RUNNER/test"
rm -rf "$RUNNER/test/integration" "$RUNNER/src"
cp -r "$PKG/test/integration" "$RUNNER/test/integration"
if [ "$MODE" = "--published" ]; then
  mkdir -p "$RUNNER/src"
  echo 'export * from "@azure/web-pubsub-client";' >"$RUNNER/src/webPubSubClient.js"
  CLIENT_DEPS="\"@azure/web-pubsub-client\": \"$CLIENT_VERSION\""
else
  cp -r "$PKG/src" "$RUNNER/src"
  # The client's runtime dependencies, at the ranges its package.json names.
  CLIENT_DEPS=$(node -e '
    const p = require(process.argv[1]);
    console.log(Object.entries(p.dependencies || {}).map(([k, v]) => JSON.stringify(k) + ": " + JSON.stringify(v)).join(", "));
  ' "$PKG/package.json") || exit 1
fi
cat >"$RUNNER/package.json" <<EOF
{
  "name": "wps-js-integration-runner",
  "private": true,
  "type": "module",
  "dependencies": {
    $CLIENT_DEPS,
    "@azure/web-pubsub": "$SERVICE_VERSION",
    "vitest": "$VITEST_VERSION"
  }
}
EOF
cat >"$RUNNER/vitest.config.mjs" <<'EOF'
import { defineConfig } from "vitest/config";
export default defineConfig({
  test: { include: ["test/integration/**/*.spec.ts"], testTimeout: 60000, hookTimeout: 60000 },
});
EOF
(cd "$RUNNER" && npm install --no-audit --no-fund --loglevel=error >npm.log 2>&1) \
  || { echo "npm install failed, see $RUNNER/npm.log" >&2; exit 1; }

KEY="interop-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
"$BIN" serve --mqtt-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --access-key "$KEY" \
  >"$RUNNER/statehub.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
PORT=""
for _ in $(seq 1 100); do
  PORT=$(sed -n 's/.*http listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$RUNNER/statehub.log" | head -1)
  [ -n "$PORT" ] && break
  sleep 0.1
done
[ -n "$PORT" ] || { echo "statehub did not start, see $RUNNER/statehub.log" >&2; exit 1; }

export WEB_PUBSUB_CONNECTION_STRING="Endpoint=http://127.0.0.1:$PORT;AccessKey=$KEY;Version=1.0;"
(cd "$RUNNER" && npx vitest run --reporter=verbose --reporter=json --outputFile.json=results.json \
  >vitest.log 2>&1)
STATUS=$?
grep -E '^ *(✓|×|↓)' "$RUNNER/vitest.log"
node -e '
  const r = require(process.argv[1]);
  console.log(`client: ${process.argv[2]}; passed ${r.numPassedTests}, failed ${r.numFailedTests}, skipped ${r.numPendingTests + r.numTodoTests}, total ${r.numTotalTests}`);
' "$RUNNER/results.json" "${MODE/--published/published @azure/web-pubsub-client $CLIENT_VERSION}" \
  || tail -20 "$RUNNER/vitest.log"
echo "runner: $RUNNER"
exit $STATUS

#!/usr/bin/env bash
# Client streams in a cluster: what a raw reliable publisher's stream fragments cost the
# members on its own node. Two statehub nodes on one redis-server; the publisher on
# node A streams N 64-byte fragments to a group with MEMBERS members on A and one on B:
#   acked     : each fragment waits for its streamAck (rate, and each member's median
#               latency from the fragment's send to its arrival);
#   pipelined : all sent at once (rate until every member has them all).
# Prints one JSON line per mode. Usage:
#   scripts/bench-wps-streams.sh <statehub binary> <label>   (N=3000 MEMBERS=4 by default)
# Needs redis-server, node and tests/webpubsub-sdk/js/node_modules (for `ws`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN=$1
LABEL=$2
D=$(mktemp -d /tmp/statehub-bench-streams.XXXXXX)
RP=$((20000 + RANDOM % 10000))
redis-server --port "$RP" --save '' --appendonly no --daemonize yes \
    --pidfile "$D/redis.pid" --logfile "$D/redis.log"
PA=$((30000 + RANDOM % 10000))
PB=$((PA + 1))
for n in a b; do
    printf '[webpubsub]\naccess_keys = ["bench-streams-key"]\n[cluster]\nredis_url = "redis://127.0.0.1:%s"\nnode_id = "%s"\nnamespace = "bench"\n' \
        "$RP" "$n" >"$D/$n.toml"
done
"$BIN" serve --config "$D/a.toml" --mqtt-listen 127.0.0.1:0 --http-listen "127.0.0.1:$PA" 2>"$D/a.log" &
PIDA=$!
"$BIN" serve --config "$D/b.toml" --mqtt-listen 127.0.0.1:0 --http-listen "127.0.0.1:$PB" 2>"$D/b.log" &
PIDB=$!
trap 'kill $PIDA $PIDB 2>/dev/null; kill "$(cat "$D/redis.pid")" 2>/dev/null' EXIT
sleep 2
for mode in acked pipelined; do
    out=$(timeout 120 node "$ROOT/scripts/bench-wps-streams/bench.mjs" "127.0.0.1:$PA" "127.0.0.1:$PB" \
        "$mode" "${N:-3000}" "${MEMBERS:-4}")
    echo "{\"build\":\"$LABEL\",${out#\{}"
done

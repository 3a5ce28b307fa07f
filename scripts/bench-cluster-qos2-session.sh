#!/usr/bin/env bash
# QoS 2 to a persistent subscriber on one node with --redis: N messages are queued for
# the subscriber's session while it is offline, then mosquitto_sub (MQTT 5, the session
# resumed, Receive Maximum its default) receives them all; prints the time that took.
# Each of the subscriber's PUBRECs is answered with a PUBREL once the node's session
# writer has stored the release in Redis.
#
#   scripts/bench-cluster-qos2-session.sh [STATEHUB_BINARY]
#       (default target/release/statehub; build it first)
#
# Environment: N (messages, 9000; below mqtt.max_queued_messages).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-${CARGO_TARGET_DIR:-$ROOT/target}/release/statehub}"
N="${N:-9000}"
OUT_DIR="${OUT_DIR:-$(mktemp -d /tmp/statehub-bench-qos2.XXXXXX)}"

log() { printf '[bench-cluster-qos2-session] %s\n' "$*" >&2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
kill_tracked_on_exit

REDIS_PORT="$(free_port)"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$OUT_DIR" --save '' --appendonly no \
    >"$OUT_DIR/redis.log" 2>&1 &
PIDS+=($!)
wait_port "$REDIS_PORT" "$!"
STATEHUB_BIN="$OUT_DIR/statehub-node"
printf '#!/bin/sh\nexec "%s" "$@" --redis redis://127.0.0.1:%s --node-id q2\n' "$BIN" "$REDIS_PORT" >"$STATEHUB_BIN"
chmod +x "$STATEHUB_BIN"
launch_statehub "$OUT_DIR/node.log"
PIDS+=("$STATEHUB_PID")

sub=(mosquitto_sub -h 127.0.0.1 -p "$STATEHUB_PORT" -V mqttv5 -i q2sub -c -x 600 -q 2 -t bench/q2)
"${sub[@]}" -W 1 >/dev/null 2>&1 || true # creates the session (exits after 1 s)
seq 1 "$N" | mosquitto_pub -h 127.0.0.1 -p "$STATEHUB_PORT" -V mqttv5 -q 2 -t bench/q2 -l
start="$(date +%s.%N)"
"${sub[@]}" -C "$N" -W 120 >"$OUT_DIR/received"
end="$(date +%s.%N)"
python3 -c 'import sys
n, s, e = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
print("qos2-persistent-subscriber received=%d seconds=%.2f msg_per_sec=%.0f" % (n, e - s, n / (e - s)))' \
    "$(wc -l <"$OUT_DIR/received")" "$start" "$end"
log "logs in $OUT_DIR"

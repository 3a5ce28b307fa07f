#!/usr/bin/env bash
# MQTT QoS 1 across statehub nodes on one Redis (`--redis`) beside one node embedded:
# the "Cluster MQTT" table of docs/benchmarks.md.
#
#   scripts/bench-cluster-mqtt.sh      (builds in release first unless SKIP_BUILD=1)
#
# statehub-bench mqtt --qos 1 (one subscriber, `shared` topics) against: one node
# embedded; one node with --redis, publishers and subscriber on it; NODES nodes on one
# redis-server (no persistence), the publishers spread over nodes 2..NODES (node 1 when
# NODES=1) and the subscriber on node 1, so every delivered message crossed Redis (with
# NODES=3: one load process per publishing node, started together, their rates summed).
# Each shape runs with 1 publisher (INFLIGHT in flight) and with PUBLISHERS publishers.
# No CPU pinning: the nodes and Redis need the cores together. Prints one line per run.
#
# Environment: NODES (2), PUBLISHERS (8), MESSAGES (messages per publisher, 5000),
# SINGLE_MESSAGES (for the 1-publisher runs, 20000), INFLIGHT (64), PAYLOAD (64).
set -euo pipefail

log() { printf '[bench-cluster-mqtt] %s\n' "$*" >&2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
bench_paths
NODES="${NODES:-2}"
PUBLISHERS="${PUBLISHERS:-8}"
MESSAGES="${MESSAGES:-5000}"
SINGLE_MESSAGES="${SINGLE_MESSAGES:-20000}"
INFLIGHT="${INFLIGHT:-64}"
PAYLOAD="${PAYLOAD:-64}"
OUT_DIR="${OUT_DIR:-$(mktemp -d /tmp/statehub-bench-cluster-mqtt.XXXXXX)}"
mkdir -p "$OUT_DIR"

kill_tracked_on_exit

build_release statehub statehub-bench

# mqtt LABEL PUB_PORT SUB_PORT PUBLISHERS MESSAGES: one load process.
mqtt() {
    "$BENCH_BIN" mqtt --port "$2" --subscriber-port "$3" --qos 1 --topic-mode shared \
        --payload-size "$PAYLOAD" --publishers "$4" --subscribers 1 \
        --messages-per-publisher "$5" --inflight "$INFLIGHT" --fail-on-loss --json --quiet \
        2>"$OUT_DIR/$1.txt" >"$OUT_DIR/$1.json"
}

# shapes LABEL PUB_PORT SUB_PORT: the 1-publisher and the PUBLISHERS-publisher runs.
shapes() {
    mqtt "$1-1pub" "$2" "$3" 1 "$SINGLE_MESSAGES"
    echo "$1 1x$SINGLE_MESSAGES $(cat "$OUT_DIR/$1-1pub.json")"
    mqtt "$1-${PUBLISHERS}pub" "$2" "$3" "$PUBLISHERS" "$MESSAGES"
    echo "$1 ${PUBLISHERS}x$MESSAGES $(cat "$OUT_DIR/$1-${PUBLISHERS}pub.json")"
}

launch_statehub "$OUT_DIR/embedded.log"
PIDS+=("$STATEHUB_PID")
shapes embedded "$STATEHUB_PORT" "$STATEHUB_PORT"
kill "$STATEHUB_PID"

REDIS_PORT="$(free_port)"
mkdir -p "$OUT_DIR/redis"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$OUT_DIR/redis" --save '' --appendonly no \
    >"$OUT_DIR/redis.log" 2>&1 &
PIDS+=($!)
wait_port "$REDIS_PORT" "$!"

STATEHUB_BIN_REAL="$STATEHUB_BIN"
ports=()
node_pids=()
for i in $(seq "$NODES"); do
    STATEHUB_BIN="$OUT_DIR/statehub-node$i"
    printf '#!/bin/sh\nexec "%s" "$@" --redis redis://127.0.0.1:%s --node-id node%s\n' \
        "$STATEHUB_BIN_REAL" "$REDIS_PORT" "$i" >"$STATEHUB_BIN"
    chmod +x "$STATEHUB_BIN"
    launch_statehub "$OUT_DIR/node$i.log"
    PIDS+=("$STATEHUB_PID")
    node_pids+=("$STATEHUB_PID")
    ports+=("$STATEHUB_PORT")
done

shapes on-redis-1node "${ports[0]}" "${ports[0]}"
if [ "$NODES" = 2 ]; then
    shapes "2-nodes" "${ports[1]}" "${ports[0]}"
elif [ "$NODES" -gt 2 ]; then
    # Publishers on every node but the first, the subscriber on the first; one load
    # process per publishing node (each expects only its own publishers' messages:
    # its topics carry a per-run id).
    senders=$((NODES - 1))
    per_node=$(((PUBLISHERS + senders - 1) / senders))
    for shape in "1 $SINGLE_MESSAGES" "$per_node $MESSAGES"; do
        read -r pubs msgs <<<"$shape"
        load=()
        for i in $(seq 2 "$NODES"); do
            mqtt "$NODES-nodes-${pubs}pub-node$i" "${ports[$((i - 1))]}" "${ports[0]}" "$pubs" "$msgs" &
            load+=($!)
        done
        wait "${load[@]}"
        total="$(python3 -c 'import json, sys
print(round(sum(json.load(open(f))["delivered_per_sec"] for f in sys.argv[1:])))' \
            "$OUT_DIR"/"$NODES"-nodes-"${pubs}"pub-node*.json)"
        echo "$NODES-nodes ${pubs}x$msgs per publishing node: delivered_per_sec=$total (per node: $OUT_DIR/$NODES-nodes-${pubs}pub-node*.json)"
    done
fi
kill "${node_pids[@]}"
log "logs in $OUT_DIR"

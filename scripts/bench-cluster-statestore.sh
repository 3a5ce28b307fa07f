#!/usr/bin/env bash
# The state store on Redis (`statehub --redis`, one node) against the embedded engine
# and against Redis itself, SET and GET, one after the other on this machine.
#
#   scripts/bench-cluster-statestore.sh      (builds in release first unless SKIP_BUILD=1)
#
# statehub-bench statestore (CLIENTS MQTT 5 clients, SDK-style requests at QoS 1,
# PIPELINE outstanding requests each) against: statehub with its in-memory engine; statehub with
# --redis on a redis-server of its own (no persistence); and redis-benchmark straight
# against that redis-server (-c CLIENTS -t set,get -d VALUE -r KEYS); and, with NODES
# (default 3; 0 skips it), that many statehub nodes on the same redis-server, the
# CLIENTS spread over them by one load process per node, all started together: their
# ops/s are summed. No CPU pinning: statehub on Redis needs both processes. Prints one
# line per run, with statehub's CPU time per request for the one-node runs.
#
# Environment: CLIENTS (64), N (requests per command, 50000), KEYS (10000), VALUE (100),
# NODES (3), PIPELINE (requests each client keeps outstanding, 1: an SDK caller that
# awaits every call; the SDKs send concurrent calls' requests at once).
set -euo pipefail

log() { printf '[bench-cluster-statestore] %s\n' "$*" >&2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
bench_paths
CLIENTS="${CLIENTS:-64}"
N="${N:-50000}"
KEYS="${KEYS:-10000}"
VALUE="${VALUE:-100}"
PIPELINE="${PIPELINE:-1}"
OUT_DIR="${OUT_DIR:-$(mktemp -d /tmp/statehub-bench-cluster.XXXXXX)}"
PER_CLIENT=$(((N + CLIENTS - 1) / CLIENTS))

kill_tracked_on_exit

build_release statehub statehub-bench

REDIS_PORT="$(free_port)"
mkdir -p "$OUT_DIR/redis"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$OUT_DIR/redis" --save '' --appendonly no \
    >"$OUT_DIR/redis.log" 2>&1 &
PIDS+=($!)
wait_port "$REDIS_PORT" "$!"

bench() { # LABEL PORT PID
    local label="$1" port="$2" pid="$3" ratio before
    for ratio in 0 1; do
        local cmd=SET
        [ "$ratio" = 1 ] && cmd=GET
        before="$(cpu_ticks "$pid")"
        "$BENCH_BIN" statestore --port "$port" --clients "$CLIENTS" --requests-per-client "$PER_CLIENT" \
            --ratio-get "$ratio" --keys "$KEYS" --value-size "$VALUE" --pipeline "$PIPELINE" \
            --json --quiet 2>"$OUT_DIR/$label-$cmd.txt" >"$OUT_DIR/$label-$cmd.json"
        # statehub's CPU per request (the load's setup included), in microseconds.
        local cpu_us
        cpu_us="$(python3 -c 'import os, sys
ticks, requests = int(sys.argv[1]), int(sys.argv[2])
print(round(ticks * 1e6 / os.sysconf("SC_CLK_TCK") / requests, 1))' "$(($(cpu_ticks "$pid") - before))" "$((PER_CLIENT * CLIENTS))")"
        echo "$label $cmd statehub_cpu_us_per_request=$cpu_us $(cat "$OUT_DIR/$label-$cmd.json")"
    done
}

launch_statehub "$OUT_DIR/embedded.log"
PIDS+=("$STATEHUB_PID")
bench embedded "$STATEHUB_PORT" "$STATEHUB_PID"
kill "$STATEHUB_PID"

STATEHUB_BIN_REAL="$STATEHUB_BIN"
STATEHUB_BIN="$OUT_DIR/statehub-redis"
printf '#!/bin/sh\nexec "%s" "$@" --redis redis://127.0.0.1:%s --node-id bench\n' "$STATEHUB_BIN_REAL" "$REDIS_PORT" >"$STATEHUB_BIN"
chmod +x "$STATEHUB_BIN"
launch_statehub "$OUT_DIR/redis-node.log"
PIDS+=("$STATEHUB_PID")
bench on-redis "$STATEHUB_PORT" "$STATEHUB_PID"
kill "$STATEHUB_PID"

NODES="${NODES:-3}"
if [ "$NODES" -ge 2 ]; then
    ports=() node_pids=()
    for i in $(seq "$NODES"); do
        printf '#!/bin/sh\nexec "%s" "$@" --redis redis://127.0.0.1:%s --node-id bench%s\n' \
            "$STATEHUB_BIN_REAL" "$REDIS_PORT" "$i" >"$OUT_DIR/statehub-node$i"
        chmod +x "$OUT_DIR/statehub-node$i"
        STATEHUB_BIN="$OUT_DIR/statehub-node$i"
        launch_statehub "$OUT_DIR/node$i.log"
        PIDS+=("$STATEHUB_PID")
        node_pids+=("$STATEHUB_PID")
        ports+=("$STATEHUB_PORT")
    done
    per_node=$(((CLIENTS + NODES - 1) / NODES))
    for ratio in 0 1; do
        cmd=SET
        [ "$ratio" = 1 ] && cmd=GET
        load=()
        for i in $(seq "$NODES"); do
            "$BENCH_BIN" statestore --port "${ports[$((i - 1))]}" --clients "$per_node" \
                --requests-per-client "$PER_CLIENT" --ratio-get "$ratio" --keys "$KEYS" \
                --value-size "$VALUE" --pipeline "$PIPELINE" --json --quiet \
                2>"$OUT_DIR/nodes-$cmd-$i.txt" >"$OUT_DIR/nodes-$cmd-$i.json" &
            load+=($!)
        done
        wait "${load[@]}"
        total="$(python3 -c 'import json, sys
print(round(sum(json.load(open(f))["ops_per_sec"] for f in sys.argv[1:])))' "$OUT_DIR"/nodes-"$cmd"-*.json)"
        echo "$NODES-nodes $cmd total_ops_per_sec=$total (per node: $OUT_DIR/nodes-$cmd-*.json)"
    done
    kill "${node_pids[@]}"
fi

redis-cli -p "$REDIS_PORT" flushall >/dev/null
echo "redis-benchmark $(redis-benchmark -p "$REDIS_PORT" -c "$CLIENTS" -n "$N" -t set,get -d "$VALUE" -r "$KEYS" --csv 2>/dev/null | tr '\n' ' ')"
log "logs in $OUT_DIR"

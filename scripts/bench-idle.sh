#!/usr/bin/env bash
# Memory per idle connection: statehub vs Mosquitto vs rmqttd over MQTT, and
# statehub's reliable Web PubSub vs Socket.IO over WebSocket; a markdown table on stdout.
#
# Usage: scripts/bench-idle.sh            (from anywhere; builds in release first)
#
# For every server and size: start the server alone (pinned to core $SERVER_CPU), read
# its resident memory (VmRSS), open the connections with `statehub-bench idle` (pinned
# to core $BENCH_CPU), read VmRSS again 3 s after the last one is up, close them, stop
# the server. Per connection = (RSS with the connections - RSS before) / connections.
#   MQTT:      MQTT 5 CONNECT (clean start, keep-alive longer than the hold); with
#              SUBSCRIBE=1 (the default runs both) each connection also subscribes at
#              QoS 1 to a topic of its own, as an idle device does.
#   WebSocket: statehub: json.reliable.webpubsub.azure.v1, each connection in one group
#              (token role); Socket.IO 4 (scripts/socketio-bench/server.mjs, connection
#              state recovery on), each socket in one room.
# Memory does not depend on timing, so these figures hold on a loaded machine too.
#
# Environment knobs:
#   BROKERS        MQTT servers (default "statehub mosquitto rmqttd"; missing ones are skipped)
#   MQTT_SIZES     connection counts (default "10000 50000"; sizes the descriptor hard
#                  limit cannot hold are skipped: run as root with CAP_SYS_RESOURCE, or
#                  raise the hard limit first, e.g. ulimit -Hn 200000)
#   SUBSCRIBE      "0 1" (default): without and with one subscription per connection
#   WS_SERVERS     WebSocket servers (default "webpubsub socketio"; "" for none)
#   WS_SIZES       WebSocket connection counts (default "10000")
#   REPEAT         runs per server and size, servers interleaved (default 1)
#   SERVER_CPU (0), BENCH_CPU (1), SKIP_BUILD=1, OUT_DIR, RMQTTD_BIN (see scripts/lib/rmqttd.sh)
set -euo pipefail

log() { printf '[bench-idle] %s\n' "$*" >&2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
bench_paths
BROKERS="${BROKERS:-statehub mosquitto rmqttd}"
MQTT_SIZES="${MQTT_SIZES:-10000 50000}"
SUBSCRIBE="${SUBSCRIBE:-0 1}"
WS_SERVERS="${WS_SERVERS-webpubsub socketio}"
WS_SIZES="${WS_SIZES:-10000}"
REPEAT="${REPEAT:-1}"
SERVER_CPU="${SERVER_CPU:-0}"
BENCH_CPU="${BENCH_CPU:-1}"
OUT_DIR="${OUT_DIR:-$(mktemp -d /tmp/statehub-bench-idle.XXXXXX)}"
KEY="bench-access-key-0123456789"
SIO_DIR="$ROOT/scripts/socketio-bench"
mkdir -p "$OUT_DIR"
RESULTS="$OUT_DIR/results.jsonl"
: >"$RESULTS"

source "$(dirname "${BASH_SOURCE[0]}")/lib/rmqttd.sh"
kill_tracked_on_exit
pin_cpus "$SERVER_CPU" "$BENCH_CPU"
# 50,000 connections: as many descriptors in the load tool and in the server.
ulimit -Hn 1048576 2>/dev/null || true
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# ---- dependencies and build ------------------------------------------------
if [[ " $WS_SERVERS " == *" socketio "* ]]; then
    install_socketio "$SIO_DIR"
fi
build_release statehub statehub-bench

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }

# wait_log_port LOGFILE PATTERN PID: prints the port the server logged.
wait_log_port() {
    local port=""
    for _ in $(seq 1 100); do
        port="$(sed 's/\x1b\[[0-9;]*m//g' "$1" | grep -oE "$2" | head -n1 | grep -oE '[0-9]+$')" || true
        [ -n "$port" ] && break
        kill -0 "$3" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$port" ] && wait_port "$port" "$3" && printf '%s\n' "$port"
}

# start_server NAME: sets SPID, and PORT (MQTT) or URL (WebSocket); VERSION[NAME].
declare -A VERSION=()
start_server() {
    local logf="$OUT_DIR/$1.log" port bin
    case "$1" in
        statehub | webpubsub)
            # Every client comes from 127.0.0.1: no per-address connection rate limit;
            # connection caps set, not sized from the descriptor limit (which gives
            # MQTT and HTTP half of it each).
            printf '[mqtt]\nconnect_rate_per_address = 0\nmax_connections = 100000\n[http]\nmax_connections = 100000\n' >"$OUT_DIR/statehub.toml"
            NO_COLOR=1 RUST_LOG=warn,statehub=info STATEHUB_ACCESS_KEYS="$KEY" \
                STATEHUB_CONFIG="$OUT_DIR/statehub.toml" "${PIN_SERVER[@]}" \
                "$STATEHUB_BIN" serve --mqtt-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 >"$logf" 2>&1 &
            SPID=$!
            if [ "$1" = statehub ]; then
                port="$(wait_log_port "$logf" 'mqtt listening on 127\.0\.0\.1:[0-9]+' "$SPID")" || return 1
            else
                port="$(wait_log_port "$logf" 'http listening on 127\.0\.0\.1:[0-9]+' "$SPID")" || return 1
            fi
            VERSION[$1]="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
            ;;
        mosquitto)
            port="$(free_port)"
            printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nset_tcp_nodelay true\nlog_dest stderr\nlog_type error\n' \
                "$port" >"$OUT_DIR/mosquitto.conf"
            "${PIN_SERVER[@]}" mosquitto -c "$OUT_DIR/mosquitto.conf" >"$logf" 2>&1 &
            SPID=$!
            wait_port "$port" "$SPID" || return 1
            VERSION[$1]="$(mosquitto -h 2>/dev/null | head -n1 | awk '{print $3}')"
            ;;
        rmqttd)
            bin="$(rmqttd_bin)" || return 1
            port="$(free_port)"
            write_rmqttd_config "$OUT_DIR/rmqttd/rmqtt.toml" "$port"
            "${PIN_SERVER[@]}" "$bin" -f "$OUT_DIR/rmqttd/rmqtt.toml" >"$logf" 2>&1 &
            SPID=$!
            wait_port "$port" "$SPID" || return 1
            VERSION[$1]="$(rmqttd_version "$bin")"
            ;;
        socketio)
            "${PIN_SERVER[@]}" node "$SIO_DIR/server.mjs" 0 >"$logf" 2>&1 &
            SPID=$!
            port="$(wait_log_port "$logf" 'listening on [0-9]+' "$SPID")" || return 1
            VERSION[$1]="$(node -e 'console.log(require(process.argv[1]).version)' \
                "$SIO_DIR/node_modules/socket.io/package.json" 2>/dev/null || echo '?') (node $(node --version))"
            ;;
    esac
    PIDS+=("$SPID")
    PORT="$port"
    URL="http://127.0.0.1:$port"
}

available() {
    case "$1" in
        statehub | webpubsub) [ -x "$STATEHUB_BIN" ] ;;
        mosquitto) command -v mosquitto >/dev/null 2>&1 ;;
        rmqttd) rmqttd_bin >/dev/null ;;
        socketio) command -v node >/dev/null 2>&1 ;;
    esac
}

# measure SERVER N SUB: one measurement, appended to $RESULTS.
measure() {
    local server="$1" n="$2" sub="$3" target args=() ready="$OUT_DIR/ready"
    start_server "$server" || { log "$server did not start (log: $OUT_DIR/$server.log)"; return 0; }
    case "$server" in
        statehub | mosquitto | rmqttd)
            target=mqtt
            args=(--port "$PORT" --sources $(((n + 19999) / 20000)))
            [ "$sub" = 1 ] && args+=(--subscribe)
            ;;
        webpubsub) target=webpubsub args=(--url "$URL" --access-key "$KEY") ;;
        socketio) target=socketio args=(--url "$URL") ;;
    esac
    sleep 1
    local before after closed_after cpu_pid="$SPID"
    before="$(rss_kib "$SPID")"
    rm -f "$ready"
    log "$server: $n connections (subscribe=$sub), RSS before $before KiB"
    "${PIN_BENCH[@]}" timeout 900 "$BENCH_BIN" --threads 1 idle --target "$target" "${args[@]}" \
        --connections "$n" --hold 8 --ready-file "$ready" --json --quiet \
        >"$OUT_DIR/idle-$server-$n-$sub.json" 2>>"$OUT_DIR/idle-stderr.txt" &
    local bench=$!
    while [ ! -e "$ready" ] && kill -0 "$bench" 2>/dev/null; do sleep 0.2; done
    sleep 3
    after="$(rss_kib "$SPID")"
    wait "$bench" || log "WARNING: $server: statehub-bench idle exited non-zero"
    sleep 2
    closed_after="$(rss_kib "$SPID")"
    kill "$SPID" 2>/dev/null || true
    wait "$SPID" 2>/dev/null || true
    printf '{"server":"%s","connections":%s,"subscribe":%s,"ready":%s,"rss_before_kib":%s,"rss_kib":%s,"rss_after_close_kib":%s,"bench":%s}\n' \
        "$server" "$n" "$sub" "$([ -e "$ready" ] && echo true || echo false)" "$before" "$after" \
        "$closed_after" "$(cat "$OUT_DIR/idle-$server-$n-$sub.json" 2>/dev/null || echo null)" >>"$RESULTS"
    log "$server: RSS with $n connections $after KiB, after closing them $closed_after KiB (pid $cpu_pid)"
}

# A server needs a descriptor per connection (and the load tool as many): sizes the
# hard limit cannot hold are skipped, saying so. Where this shell may not raise the
# hard limit (no CAP_SYS_RESOURCE), the hard limit is what there is.
fits() {
    local hard
    hard="$(ulimit -Hn)"
    [ "$hard" = unlimited ] || [ "$1" -le $((hard - 256)) ] && return 0
    log "skipping $1 connections: the descriptor hard limit is $hard (raise it to run them)"
    return 1
}

for run in $(seq 1 "$REPEAT"); do
    for n in $MQTT_SIZES; do
        fits "$n" || continue
        for sub in $SUBSCRIBE; do
            for b in $BROKERS; do
                if available "$b"; then measure "$b" "$n" "$sub"; else log "skipping $b: not available"; fi
            done
        done
    done
    for n in $WS_SIZES; do
        fits "$n" || continue
        for s in $WS_SERVERS; do
            if available "$s"; then measure "$s" "$n" 0; else log "skipping $s: not available"; fi
        done
    done
done

# ---- table ------------------------------------------------------------------
printf '\nIdle connections: server on cpu %s, statehub-bench idle on cpu %s; ' "$SERVER_CPU" "$BENCH_CPU"
for s in "${!VERSION[@]}"; do printf '%s %s; ' "$s" "${VERSION[$s]}"; done
printf '\n\n'
python3 - "$RESULTS" <<'PY'
import json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
groups = {}
for r in rows:
    groups.setdefault((r["connections"], r["subscribe"], r["server"]), []).append(r)

def per_conn(r):
    return (r["rss_kib"] - r["rss_before_kib"]) / r["connections"]

def ok(r):
    b = r.get("bench") or {}
    return r["ready"] and b.get("closed_by_server", 1) == 0

print("| connections | subscription each | server | RSS before | RSS with the connections | per connection | ÷ Mosquitto (WebSocket: ÷ Socket.IO) | RSS after closing | open time | note |")
print("|---:|---|---|---:|---:|---:|---:|---:|---:|---|")
for (n, sub, server), rs in groups.items():
    good = [r for r in rs if ok(r)]
    if not good:
        b = rs[-1].get("bench") or {}
        print(f"| {n:,} | {'yes' if sub else 'no'} | {server} | | | FAILED | | | | {'; '.join(b.get('errors', []))[:120]} |")
        continue
    r = sorted(good, key=per_conn)[len(good) // 2]
    # MQTT servers against Mosquitto, Web PubSub against Socket.IO.
    peer = {"statehub": "mosquitto", "rmqttd": "mosquitto", "webpubsub": "socketio"}.get(server)
    mq = [x for x in groups.get((n, sub, peer), []) if ok(x)]
    ratio = ""
    if mq:
        m = sorted(mq, key=per_conn)[len(mq) // 2]
        ratio = f"{per_conn(r) / per_conn(m):.2f}x"
    kib = lambda v: f"{v / 1024:,.1f} MiB"
    print(f"| {n:,} | {'yes' if sub else 'no'} | {server} | {kib(r['rss_before_kib'])} | {kib(r['rss_kib'])} | "
          f"{per_conn(r):.1f} KiB | {ratio} | {kib(r['rss_after_close_kib'])} | {r['bench'].get('open_s', 0):.1f} s | "
          f"{len(rs)} run(s) |")
PY
log "raw results: $RESULTS (logs in $OUT_DIR)"

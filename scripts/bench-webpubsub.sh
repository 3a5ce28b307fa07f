#!/usr/bin/env bash
# Reliable fan-out: statehub's Web PubSub service against a Socket.IO server, in one
# run, and a markdown table on stdout.
#
# Usage: scripts/bench-webpubsub.sh      (from anywhere; builds in release first)
#
# Scenario (statehub-bench fanout, the same client code for both servers): one
# publisher, one group (Socket.IO: room), $SUBSCRIBERS subscribers; the publisher
# keeps $WINDOW publishes unacknowledged at most; $WARMUP s of warm-up, $DURATION s
# measured; delivered msg/s = messages received by all subscribers together.
#   statehub : json.reliable.webpubsub.azure.v1 for every connection; subscribers
#              send sequenceAck once a second, like @azure/web-pubsub-client; the
#              publisher's sendToGroup carries an ackId and waits for the ack.
#   socketio : Socket.IO 4 (scripts/socketio-bench/server.mjs, connection state
#              recovery on); the publisher emits "pub" with an ack callback and the
#              server relays it to the room.
# Every run also checks that nothing acknowledged was lost and nothing arrived out of
# order (the bench exits non-zero otherwise).
#
# CPU pinning: the server under test gets core $SERVER_CPU, the load tool core
# $BENCH_CPU (taskset), so each server has exactly one core: node runs JavaScript on
# one thread anyway, and statehub's threads share the one core they are given.
#
# Environment knobs: SERVERS (default "statehub socketio"), SUBSCRIBERS (1000),
# WINDOW (100), PAYLOAD (64 bytes), WARMUP (2 s), DURATION (10 s), REPEAT (3),
# SERVER_CPU (0), BENCH_CPU (1), SKIP_BUILD=1, OUT_DIR.
set -euo pipefail

log() { printf '[bench-webpubsub] %s\n' "$*" >&2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
bench_paths
SERVERS="${SERVERS:-statehub socketio}"
SUBSCRIBERS="${SUBSCRIBERS:-1000}"
WINDOW="${WINDOW:-100}"
PAYLOAD="${PAYLOAD:-64}"
WARMUP="${WARMUP:-2}"
DURATION="${DURATION:-10}"
REPEAT="${REPEAT:-3}"
SERVER_CPU="${SERVER_CPU:-0}"
BENCH_CPU="${BENCH_CPU:-1}"
OUT_DIR="${OUT_DIR:-$(mktemp -d /tmp/statehub-bench-wps.XXXXXX)}"
KEY="bench-access-key-0123456789"
# statehub runs with its default limits unless STATEHUB_CONFIG_FILE names a config.
STATEHUB_CONFIG_FILE="${STATEHUB_CONFIG_FILE:-}"
SIO_DIR="$ROOT/scripts/socketio-bench"
mkdir -p "$OUT_DIR"
RESULTS="$OUT_DIR/results.jsonl"
: >"$RESULTS"

kill_tracked_on_exit
pin_cpus "$SERVER_CPU" "$BENCH_CPU"
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

# ---- dependencies and build ------------------------------------------------
if [[ " $SERVERS " == *" socketio "* ]]; then
    install_socketio "$SIO_DIR"
fi
build_release statehub statehub-bench

# start_server NAME: sets URL and SPID.
start_server() {
    local logf="$OUT_DIR/$1.log"
    case "$1" in
        statehub)
            if [ -z "$STATEHUB_CONFIG_FILE" ]; then
                STATEHUB_CONFIG_FILE="$OUT_DIR/statehub.toml"
                : >"$STATEHUB_CONFIG_FILE"
            fi
            NO_COLOR=1 RUST_LOG=warn,statehub=info STATEHUB_ACCESS_KEYS="$KEY" "${PIN_SERVER[@]}" \
                "$STATEHUB_BIN" serve --config "$STATEHUB_CONFIG_FILE" \
                --mqtt-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 >"$logf" 2>&1 &
            SPID=$!
            local pattern='http listening on 127\.0\.0\.1:[0-9]+'
            ;;
        socketio)
            "${PIN_SERVER[@]}" node "$SIO_DIR/server.mjs" 0 >"$logf" 2>&1 &
            SPID=$!
            local pattern='listening on [0-9]+'
            ;;
    esac
    PIDS+=("$SPID")
    local port=""
    for _ in $(seq 1 100); do
        port="$(grep -oE "$pattern" "$logf" | head -n1 | grep -oE '[0-9]+$')" || true
        [ -n "$port" ] && break
        sleep 0.1
    done
    [ -n "$port" ] && wait_port "$port" "$SPID" || { log "$1 did not start:"; tail "$logf" >&2; return 1; }
    URL="http://127.0.0.1:$port"
}

for run in $(seq 1 "$REPEAT"); do
    for server in $SERVERS; do
        start_server "$server"
        out="$OUT_DIR/$server-$run.json"
        c0="$(cpu_ticks "$SPID")"
        t0="$(date +%s.%N)"
        log "run $run: $server ($SUBSCRIBERS subscribers)"
        "${PIN_BENCH[@]}" timeout 300 "$BENCH_BIN" --threads 1 fanout --target "$server" --url "$URL" \
            --access-key "$KEY" --subscribers "$SUBSCRIBERS" --window "$WINDOW" \
            --payload-bytes "$PAYLOAD" --warmup "$WARMUP" --duration "$DURATION" --json --quiet \
            >"$out" 2>>"$OUT_DIR/$server-stderr.txt" || log "WARNING: $server run $run exited non-zero"
        c1="$(cpu_ticks "$SPID")"
        t1="$(date +%s.%N)"
        kill "$SPID" 2>/dev/null || true
        wait "$SPID" 2>/dev/null || true
        python3 - "$server" "$run" "$out" "$c0" "$c1" "$t0" "$t1" >>"$RESULTS" <<'PY'
import json, os, sys
server, run, out, c0, c1, t0, t1 = sys.argv[1:8]
try:
    r = json.loads(open(out).read().strip().splitlines()[-1])
except Exception as e:
    r = {"ok": False, "errors": [f"no result: {e}"]}
cpu = (float(c1) - float(c0)) / os.sysconf("SC_CLK_TCK") * 100 / max(float(t1) - float(t0), 1e-9)
r.update(server=server, run=int(run), server_cpu=round(cpu))
print(json.dumps(r))
PY
    done
done

python3 - "$RESULTS" "$SUBSCRIBERS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
subs = sys.argv[2]
by = {}
for r in rows:
    by.setdefault(r["server"], []).append(r)
med = {}
for s, rs in by.items():
    rs.sort(key=lambda r: r.get("delivered_per_s") or 0)
    med[s] = rs[len(rs) // 2]
print(f"Reliable fan-out: 1 publisher, 1 group, {subs} subscribers; median of {max(len(v) for v in by.values())} runs by delivered msg/s; server on one core, load tool on the other")
print("| server | delivered msg/s | p50 | p99 | publishes acked | lost | out of order | server CPU | runs (msg/s) | statehub/socketio |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
def ms(us):
    return "-" if us is None else (f"{us/1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs")
base = med.get("socketio", {}).get("delivered_per_s")
for s in ("statehub", "socketio"):
    if s not in med:
        continue
    r = med[s]
    ratio = f"{r['delivered_per_s']/base:.2f}x" if s == "statehub" and base else ""
    runs = ", ".join(f"{x.get('delivered_per_s', 0):,.0f}" for x in sorted(by[s], key=lambda x: x["run"]))
    print(f"| {s} | {r.get('delivered_per_s', 0):,.0f} | {ms(r.get('latency_p50_us'))} | {ms(r.get('latency_p99_us'))} | "
          f"{r.get('published', 0):,} | {r.get('lost', '-')} | {r.get('out_of_order', '-')} | {r['server_cpu']}% | {runs} | {ratio} |")
PY
log "raw results: $RESULTS"

#!/usr/bin/env bash
# The cost of TLS and of authorization rules: state store SET and GET, and MQTT
# QoS 1 pub/sub, against statehub on a plain and a TLS listener, without rules and
# with rules (every operation checked), and against mosquitto plain and with TLS
# as the peer. Prints a markdown table.
#
# Usage: scripts/bench-security.sh        (from anywhere; builds in release first)
#
# The broker is pinned to one core and statehub-bench to the other, as in
# scripts/bench-mqtt.sh. The CA and server certificate are made with openssl in
# OUT_DIR for the run (nothing is committed).
#
# Environment knobs:
#   BROKER_CPU    core for the broker under test (default 0)
#   BENCH_CPU     core for statehub-bench (default 1)
#   CLIENTS       state store clients (default 4); PIPELINE requests in flight each (default 1)
#   PER_CLIENT    state store requests per client and run (default 20000)
#   MSGS          QoS 1 messages per publisher, 4 publishers x 4 subscribers (default 20000)
#   REPEAT        runs of each cell, interleaved; the table shows the median (default 3)
#   SETTLE        seconds of rest before each target's cells (default 2)
#   SKIP_BUILD=1  do not run cargo; use existing binaries
#   BENCH_BIN, STATEHUB_BIN  binaries (default: $TARGET/release/...)
#   OUT_DIR       where logs and raw JSON go (default: a fresh temp dir, printed)
set -euo pipefail

log() { printf '[bench-security] %s\n' "$*" >&2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
bench_paths
BROKER_CPU="${BROKER_CPU:-0}"
BENCH_CPU="${BENCH_CPU:-1}"
CLIENTS="${CLIENTS:-4}"
PIPELINE="${PIPELINE:-1}"
PER_CLIENT="${PER_CLIENT:-20000}"
MSGS="${MSGS:-20000}"
REPEAT="${REPEAT:-3}"
OUT_DIR="${OUT_DIR:-$(mktemp -d /tmp/statehub-bench-security.XXXXXX)}"
mkdir -p "$OUT_DIR"
RESULTS="$OUT_DIR/results.jsonl"
: >"$RESULTS"


kill_tracked_on_exit
pin_cpus "$BROKER_CPU" "$BENCH_CPU"

build_release statehub-bench statehub
[ -x "$BENCH_BIN" ] && [ -x "$STATEHUB_BIN" ] || { log "missing binaries"; exit 1; }

# ---- certificates -------------------------------------------------------------
CA="$OUT_DIR/ca.pem"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=statehub bench CA" -keyout "$OUT_DIR/ca.key" -out "$CA" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -subj "/CN=localhost" -keyout "$OUT_DIR/server.key" -out "$OUT_DIR/server.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$OUT_DIR/san.ext"
openssl x509 -req -in "$OUT_DIR/server.csr" -CA "$CA" -CAkey "$OUT_DIR/ca.key" \
    -CAcreateserial -days 2 -extfile "$OUT_DIR/san.ext" -out "$OUT_DIR/server.crt" 2>/dev/null

# Rules that grant what the benchmark does, behind nine rules for other principals,
# so every CONNECT, PUBLISH, SUBSCRIBE and key is checked against a real policy.
RULES="$OUT_DIR/rules.yaml"
{
    for i in $(seq 1 9); do
        printf -- "- principals: {clientIds: ['other-%s-*'], attributes: [{floor: '%s'}]}\n" "$i" "$i"
        printf "  brokerResources: [{method: Connect}, {method: Publish, topics: ['site/%s/{principal.clientId}/#']}]\n" "$i"
        printf "  stateStoreResources: [{method: ReadWrite, keys: ['%s/{principal.clientId}/*']}]\n" "$i"
    done
    cat <<'EOF'
- principals: {clientIds: ['*']}
  brokerResources:
    - method: Connect
    - method: Publish
      topics: ['statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke', 'statehub-bench/#']
    - method: Subscribe
      topics: ['clients/{principal.clientId}/#', 'statehub-bench/#']
  stateStoreResources:
    - {method: ReadWrite, keys: ['*']}
EOF
} >"$RULES"

# ---- brokers ------------------------------------------------------------------
declare -A PORT=()

# start_statehub NAME RULES(0|1): one statehub with a plain and a TLS listener.
start_statehub() {
    local name="$1" rules="$2" plain tls conf="$OUT_DIR/$1.toml"
    plain="$(free_port)"
    tls="$(free_port)"
    cat >"$conf" <<EOF
[[mqtt.listeners]]
address = "127.0.0.1:$plain"

[[mqtt.listeners]]
address = "127.0.0.1:$tls"
tls = { cert = "$OUT_DIR/server.crt", key = "$OUT_DIR/server.key" }
allow_anonymous = true
EOF
    [ "$rules" = 1 ] && printf '\n[authorization]\nrules_file = "%s"\n' "$RULES" >>"$conf"
    NO_COLOR=1 RUST_LOG=info "${PIN_SERVER[@]}" "$STATEHUB_BIN" serve --config "$conf" \
        --http-listen 127.0.0.1:0 >"$OUT_DIR/$name.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    wait_port "$plain" "$pid" && wait_port "$tls" "$pid" || {
        log "$name did not start:"
        tail -n 20 "$OUT_DIR/$name.log" >&2
        return 1
    }
    PORT["$name plain"]="$plain"
    PORT["$name TLS"]="$tls"
    log "$name pid $pid: plain 127.0.0.1:$plain, TLS 127.0.0.1:$tls"
}

start_mosquitto() {
    command -v mosquitto >/dev/null 2>&1 || { log "skipping mosquitto: not installed"; return 0; }
    local plain tls conf="$OUT_DIR/mosquitto.conf"
    plain="$(free_port)"
    tls="$(free_port)"
    # As root, mosquitto would switch to its own user, which cannot read the key here.
    cat >"$conf" <<EOF
user $(id -un)
per_listener_settings false
allow_anonymous true
persistence false
max_queued_messages 1000000
max_inflight_messages 0
set_tcp_nodelay true
log_dest stderr
log_type error
log_type warning
listener $plain 127.0.0.1
listener $tls 127.0.0.1
cafile $CA
certfile $OUT_DIR/server.crt
keyfile $OUT_DIR/server.key
EOF
    "${PIN_SERVER[@]}" mosquitto -c "$conf" >"$OUT_DIR/mosquitto.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    wait_port "$plain" "$pid" && wait_port "$tls" "$pid" || {
        log "mosquitto did not start:"
        cat "$OUT_DIR/mosquitto.log" >&2
        return 1
    }
    PORT["mosquitto plain"]="$plain"
    PORT["mosquitto TLS"]="$tls"
    log "mosquitto pid $pid: plain 127.0.0.1:$plain, TLS 127.0.0.1:$tls"
}

start_statehub "statehub" 0
start_statehub "statehub+rules" 1
start_mosquitto || log "WARNING: mosquitto skipped"

# ---- runs ---------------------------------------------------------------------
# record SCENARIO TARGET LINE
record() {
    local line="$3"
    [ -n "$line" ] || line='{"ok":false,"errors":["statehub-bench produced no result"]}'
    printf '{"scenario":"%s","target":"%s","result":%s}\n' "$1" "$2" "$line" >>"$RESULTS"
}

for run in $(seq 1 "$REPEAT"); do
    for target in "statehub plain" "statehub TLS" "statehub+rules plain" "statehub+rules TLS" \
        "mosquitto plain" "mosquitto TLS"; do
        port="${PORT[$target]:-}"
        [ -n "$port" ] || continue
        # Every broker shares the pinned core: let the last cell's broker settle (the
        # first statehub cell after mosquitto's measured half its rate otherwise).
        sleep "${SETTLE:-2}"
        tls=()
        [[ "$target" == *TLS ]] && tls=(--tls-ca "$CA" --tls-name localhost)
        if [[ "$target" == statehub* ]]; then
            for cmd in SET GET; do
                ratio=0
                [ "$cmd" = GET ] && ratio=1
                log "$cmd: $target (run $run/$REPEAT)"
                line="$("${PIN_BENCH[@]}" timeout 600 "$BENCH_BIN" --threads 1 statestore \
                    --port "$port" "${tls[@]}" --clients "$CLIENTS" --pipeline "$PIPELINE" \
                    --requests-per-client "$PER_CLIENT" --ratio-get "$ratio" --json --quiet \
                    2>>"$OUT_DIR/bench.txt")" || true
                record "state store $cmd" "$target" "$line"
            done
        fi
        log "QoS 1: $target (run $run/$REPEAT)"
        line="$("${PIN_BENCH[@]}" timeout 600 "$BENCH_BIN" --threads 1 mqtt --port "$port" "${tls[@]}" \
            --publishers 4 --subscribers 4 --topic-mode shared --qos 1 \
            --messages-per-publisher "$MSGS" --json --quiet 2>>"$OUT_DIR/bench.txt")" || true
        record "4x4 QoS 1" "$target" "$line"
    done
done

# ---- table --------------------------------------------------------------------
printf '\nstatehub-bench, median of %s runs; broker on cpu %s, statehub-bench on cpu %s\n\n' \
    "$REPEAT" "$BROKER_CPU" "$BENCH_CPU"
python3 - "$RESULTS" <<'PY'
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def rate(r):
    return r.get("ops_per_sec", r.get("delivered_per_sec", 0.0)) if r.get("ok") else 0.0
cells = {}
for row in rows:
    cells.setdefault(row["scenario"], {}).setdefault(row["target"], []).append(row["result"])
def ms(us):
    return "-" if us is None else (f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs")
print("| scenario | target | ops/s or delivered msg/s | p50 | p99 | vs plain, no rules |")
print("|---|---|---:|---:|---:|---:|")
for scenario, targets in cells.items():
    med = {t: sorted(rs, key=rate)[len(rs) // 2] for t, rs in targets.items()}
    for target, r in med.items():
        if not r.get("ok"):
            print(f"| {scenario} | {target} | FAILED: {'; '.join(r.get('errors', []))} | | | |")
            continue
        base_name = "mosquitto plain" if target.startswith("mosquitto") else "statehub plain"
        base = med.get(base_name)
        vs = f"{rate(r) / rate(base):.2f}x" if base and rate(base) else ""
        print(f"| {scenario} | {target} | {rate(r):,.0f} | {ms(r.get('latency_p50_us'))} | "
              f"{ms(r.get('latency_p99_us'))} | {vs} |")
PY
log "raw results: $RESULTS (logs in $OUT_DIR)"

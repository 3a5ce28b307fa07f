#!/usr/bin/env bash
# Benchmark statehub against mosquitto (and rmqttd, if present) with the same
# statehub-bench scenarios in one run, and print a markdown table.
#
# Usage: scripts/bench-mqtt.sh            (from anywhere; builds in release first)
#
# CPU pinning: the machine has 2 cores. If broker and load generator float
# freely, the scheduler lets them steal each other's core and the result depends
# on how much CPU the *benchmark tool* happened to burn. Pinning the broker to one
# core and statehub-bench to the other gives every broker exactly one dedicated
# core, the same for all brokers (mosquitto is single-threaded anyway, and a
# multi-threaded statehub gets no unfair extra core), and keeps the client from
# perturbing the broker's measurements.
#
# Environment knobs:
#   BROKERS       brokers to run, default "statehub mosquitto rmqttd" (missing ones are skipped)
#   BROKER_CPU    core for the broker under test (default 0)
#   BENCH_CPU     core for statehub-bench (default 1)
#   MSGS          messages per publisher in the throughput scenarios (default 50000)
#   PAYLOAD       payload bytes (default 64)
#   ONLY          extended regex: run only the scenarios whose name matches it
#                 (e.g. ONLY='QoS1$' for the two unthrottled QoS 1 ones; default: all)
#   REPEAT        runs of each scenario per broker, brokers interleaved; the table
#                 shows the run with the median delivered msg/s (default 3)
#   SKIP_BUILD=1  do not run cargo; use existing binaries
#   BENCH_BIN     statehub-bench binary (default: $TARGET/release/statehub-bench)
#   STATEHUB_BIN  statehub binary (default: $TARGET/release/statehub)
#   RMQTTD_CONFIG config file for rmqttd whose TCP listener is on 127.0.0.1:$RMQTTD_PORT;
#                 rmqttd is only benchmarked when both are set and rmqttd is on PATH
#   OUT_DIR       where logs and raw JSON go (default: a fresh temp dir, printed)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
BENCH_BIN="${BENCH_BIN:-$TARGET/release/statehub-bench}"
STATEHUB_BIN="${STATEHUB_BIN:-$TARGET/release/statehub}"
BROKERS="${BROKERS:-statehub mosquitto rmqttd}"
BROKER_CPU="${BROKER_CPU:-0}"
BENCH_CPU="${BENCH_CPU:-1}"
MSGS="${MSGS:-50000}"
PAYLOAD="${PAYLOAD:-64}"
REPEAT="${REPEAT:-3}"
OUT_DIR="${OUT_DIR:-$(mktemp -d /tmp/statehub-bench.XXXXXX)}"
mkdir -p "$OUT_DIR"
RESULTS="$OUT_DIR/results.jsonl"
: >"$RESULTS"

log() { printf '[bench-mqtt] %s\n' "$*" >&2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

kill_tracked_on_exit
# Commands to pin a process to the broker's / the benchmark's core (see pin_cpus).
pin_cpus "$BROKER_CPU" "$BENCH_CPU"
PIN_BROKER=("${PIN_SERVER[@]}")

# ---- build ------------------------------------------------------------------
has_broker() { [[ " $BROKERS " == *" $1 "* ]]; }

if [ "${SKIP_BUILD:-0}" != 1 ]; then
    log "building statehub-bench (release)"
    cargo build --release -j 2 -p statehub-bench
    if has_broker statehub; then
        log "building statehub (release)"
        cargo build --release -j 2 -p statehub ||
            log "WARNING: statehub did not build; it will be skipped"
    fi
fi
[ -x "$BENCH_BIN" ] || { log "no statehub-bench binary at $BENCH_BIN"; exit 1; }

# ---- brokers ----------------------------------------------------------------
declare -A PORT=()

start_statehub() {
    [ -x "$STATEHUB_BIN" ] || { log "skipping statehub: no binary at $STATEHUB_BIN"; return 0; }
    launch_statehub "$OUT_DIR/statehub.log" "${PIN_BROKER[@]}" || return 1
    PIDS+=("$STATEHUB_PID")
    PORT[statehub]="$STATEHUB_PORT"
    log "statehub pid $STATEHUB_PID on 127.0.0.1:$STATEHUB_PORT (cpu $BROKER_CPU)"
}

start_mosquitto() {
    command -v mosquitto >/dev/null 2>&1 || { log "skipping mosquitto: not installed (scripts/install-test-deps.sh)"; return 0; }
    local port conf="$OUT_DIR/mosquitto.conf"
    port="$(free_port)"
    # No persistence, queues large enough that QoS 1 is never dropped for a slow
    # subscriber, no in-flight cap (MQTT 5 Receive Maximum is then 65535), and
    # TCP_NODELAY like statehub (without it, PUBACKs wait for Nagle).
    cat >"$conf" <<EOF
listener $port 127.0.0.1
allow_anonymous true
persistence false
max_queued_messages 1000000
max_inflight_messages 0
set_tcp_nodelay true
log_dest stderr
log_type error
log_type warning
EOF
    "${PIN_BROKER[@]}" mosquitto -c "$conf" >"$OUT_DIR/mosquitto.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    if ! wait_port "$port" "$pid"; then
        log "mosquitto did not start:"
        cat "$OUT_DIR/mosquitto.log" >&2
        return 1
    fi
    PORT[mosquitto]="$port"
    log "mosquitto $(mosquitto -h 2>/dev/null | head -n1 | awk '{print $3}') pid $pid on 127.0.0.1:$port (cpu $BROKER_CPU)"
}

start_rmqttd() {
    if ! command -v rmqttd >/dev/null 2>&1 || [ -z "${RMQTTD_CONFIG:-}" ] || [ -z "${RMQTTD_PORT:-}" ]; then
        log "skipping rmqttd (needs rmqttd on PATH, RMQTTD_CONFIG and RMQTTD_PORT)"
        return 0
    fi
    "${PIN_BROKER[@]}" rmqttd -f "$RMQTTD_CONFIG" >"$OUT_DIR/rmqttd.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    if ! wait_port "$RMQTTD_PORT" "$pid"; then
        log "rmqttd did not start (log: $OUT_DIR/rmqttd.log)"
        return 1
    fi
    PORT[rmqttd]="$RMQTTD_PORT"
    log "rmqttd pid $pid on 127.0.0.1:$RMQTTD_PORT (cpu $BROKER_CPU)"
}

for b in $BROKERS; do
    case "$b" in
        statehub) start_statehub || log "WARNING: statehub skipped" ;;
        mosquitto) start_mosquitto || log "WARNING: mosquitto skipped" ;;
        rmqttd) start_rmqttd || log "WARNING: rmqttd skipped" ;;
        *) log "unknown broker $b" ;;
    esac
done
[ "${#PORT[@]}" -gt 0 ] || { log "no broker to benchmark"; exit 1; }

# ---- scenarios ----------------------------------------------------------------
# name | statehub-bench mqtt arguments
SCENARIOS=(
    "4x4 shared QoS0|--publishers 4 --subscribers 4 --topic-mode shared --qos 0 --messages-per-publisher $MSGS"
    "4x4 shared QoS1|--publishers 4 --subscribers 4 --topic-mode shared --qos 1 --messages-per-publisher $MSGS"
    "16x16 per-publisher QoS0|--publishers 16 --subscribers 16 --topic-mode per-publisher --qos 0 --messages-per-publisher $((MSGS / 2))"
    "16x16 per-publisher QoS1|--publishers 16 --subscribers 16 --topic-mode per-publisher --qos 1 --messages-per-publisher $((MSGS / 2))"
    "4x4 shared QoS1 @1k/s/pub|--publishers 4 --subscribers 4 --topic-mode shared --qos 1 --rate 1000 --duration 5"
)

for sc in "${SCENARIOS[@]}"; do
    name="${sc%%|*}"
    args="${sc#*|}"
    [[ -z "${ONLY:-}" || "$name" =~ $ONLY ]] || continue
    for run in $(seq 1 "$REPEAT"); do
    for b in $BROKERS; do
        [ -n "${PORT[$b]:-}" ] || continue
        log "$name: $b (run $run/$REPEAT)"
        # shellcheck disable=SC2086 # args is a word list on purpose
        line="$("${PIN_BENCH[@]}" timeout 600 "$BENCH_BIN" mqtt --threads 1 --port "${PORT[$b]}" \
            --payload-size "$PAYLOAD" $args --json --quiet 2>>"$OUT_DIR/bench-$b.txt")" || true
        if [ -z "$line" ]; then
            line='{"ok":false,"errors":["statehub-bench produced no result"]}'
        fi
        printf '{"scenario_name":"%s","broker_name":"%s","result":%s}\n' "$name" "$b" "$line" >>"$RESULTS"
    done
    done
done

# ---- table ------------------------------------------------------------------
printf '\nstatehub-bench mqtt, payload %s B, median of %s runs; broker on cpu %s, statehub-bench on cpu %s\n\n' \
    "$PAYLOAD" "$REPEAT" "$BROKER_CPU" "$BENCH_CPU"
python3 - "$RESULTS" <<'PY'
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
runs = {}
for r in rows:
    runs.setdefault(r["scenario_name"], {}).setdefault(r["broker_name"], []).append(r["result"])
# Per scenario and broker: the run with the median delivered msg/s (a failed
# run counts as 0, so repeated failures show up).
by = {}
for name, brokers in runs.items():
    for broker, rs in brokers.items():
        rs = sorted(rs, key=lambda x: x.get("delivered_per_sec", 0.0) if x.get("ok") else 0.0)
        by.setdefault(name, {})[broker] = rs[len(rs) // 2]

def ms(us):
    return "-" if us is None else (f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs")

print("| scenario | broker | delivered msg/s | p50 | p99 | lost | statehub/mosquitto msg/s | statehub/mosquitto p99 |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for name, res in by.items():
    mq = res.get("mosquitto")
    for broker, r in res.items():
        if not r.get("ok", False) and "delivered_per_sec" not in r:
            print(f"| {name} | {broker} | FAILED: {'; '.join(r.get('errors', []))} | | | | | |")
            continue
        rate = r.get("delivered_per_sec", 0.0)
        lost = r.get("lost", 0)
        note = "" if r.get("ok", False) else " (errors)"
        ratio_rate = ratio_p99 = ""
        if broker == "statehub" and mq and mq.get("delivered_per_sec"):
            ratio_rate = f"{rate / mq['delivered_per_sec']:.2f}x"
            if mq.get("latency_p99_us"):
                ratio_p99 = f"{r.get('latency_p99_us', 0) / mq['latency_p99_us']:.2f}x"
        print(f"| {name} | {broker}{note} | {rate:,.0f} | {ms(r.get('latency_p50_us'))} | "
              f"{ms(r.get('latency_p99_us'))} | {lost} | {ratio_rate} | {ratio_p99} |")
PY
log "raw results: $RESULTS (logs in $OUT_DIR)"

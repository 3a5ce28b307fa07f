#!/usr/bin/env bash
# Benchmark statehub against mosquitto and rmqttd (each if present) with the same
# statehub-bench scenarios in one run, and print a markdown table.
#
# Usage: scripts/bench-mqtt.sh            (from anywhere; builds in release first)
#        SETS=shapes scripts/bench-mqtt.sh   only the broadcast and fan-in shapes
#
# Scenario sets (SETS, default "throughput shapes"):
#   throughput  4x4 shared and 16x16 per-publisher, QoS 0 and 1, and a rate-limited
#               4x4 QoS 1 row for latency
#   qos1        only the 4x4 and 16x16 QoS 1 rows of throughput
#   shapes      broadcast: 1 publisher -> $BROADCAST_SUBS subscribers on one topic;
#               fan-in: $FANIN_PUBS publishers (each its own topic) -> 1 subscriber
#               on the wildcard filter; QoS 0 and 1 each
# Every row reports delivered msg/s, delivered/expected and lost, and the broker's
# CPU per delivered message (its /proc CPU time from the start of publishing to the
# end of delivery, read by statehub-bench --broker-pid).
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
#   BROKERS       brokers to run, default "statehub mosquitto rmqttd" (missing ones are skipped);
#                 "statehub-persub" is statehub with overlapping_subscriptions = "per-subscription"
#   SETS          scenario sets, default "throughput shapes"
#   BROADCAST_SUBS / BROADCAST_MSGS  broadcast subscribers (10000) and messages (20)
#   FANIN_PUBS / FANIN_MSGS          fan-in publishers (10000) and messages each (10)
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
#   RMQTTD_BIN    rmqttd binary (default: rmqttd on PATH, else /tmp/rmqtt/bin/rmqttd, which
#                 scripts/install-rmqtt.sh builds); rmqttd is skipped when there is none
#   RMQTTD_CONFIG, RMQTTD_PORT  an rmqttd config of your own whose TCP listener is on
#                 127.0.0.1:$RMQTTD_PORT (default: one written by scripts/lib/rmqttd.sh)
#   OUT_DIR       where logs and raw JSON go (default: a fresh temp dir, printed)
set -euo pipefail

log() { printf '[bench-mqtt] %s\n' "$*" >&2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
bench_paths
BROKERS="${BROKERS:-statehub mosquitto rmqttd}"
BROKER_CPU="${BROKER_CPU:-0}"
BENCH_CPU="${BENCH_CPU:-1}"
SETS="${SETS:-throughput shapes}"
BROADCAST_SUBS="${BROADCAST_SUBS:-10000}"
BROADCAST_MSGS="${BROADCAST_MSGS:-20}"
FANIN_PUBS="${FANIN_PUBS:-10000}"
FANIN_MSGS="${FANIN_MSGS:-10}"
MSGS="${MSGS:-50000}"
PAYLOAD="${PAYLOAD:-64}"
REPEAT="${REPEAT:-3}"
OUT_DIR="${OUT_DIR:-$(mktemp -d /tmp/statehub-bench.XXXXXX)}"
mkdir -p "$OUT_DIR"
RESULTS="$OUT_DIR/results.jsonl"
: >"$RESULTS"

source "$(dirname "${BASH_SOURCE[0]}")/lib/rmqttd.sh"

kill_tracked_on_exit
# Commands to pin a process to the broker's / the benchmark's core (see pin_cpus).
pin_cpus "$BROKER_CPU" "$BENCH_CPU"
PIN_BROKER=("${PIN_SERVER[@]}")
# 10,000 clients need as many descriptors in the load tool and in each broker
# (statehub raises its own soft limit to the hard one; Mosquitto and rmqttd do not).
ulimit -Hn 1048576 2>/dev/null || true
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# ---- build ------------------------------------------------------------------
has_broker() { [[ " $BROKERS " == *" $1 "* ]]; }

build_release statehub-bench
if has_broker statehub || has_broker statehub-persub; then
    build_release statehub || log "WARNING: statehub did not build; it will be skipped"
fi
[ -x "$BENCH_BIN" ] || { log "no statehub-bench binary at $BENCH_BIN"; exit 1; }

# ---- brokers ----------------------------------------------------------------
declare -A PORT=() BPID=() VERSION=()

# start_statehub NAME [CONFIG LINE...]: statehub under the broker name NAME, with
# these extra lines in its [mqtt] table.
start_statehub() {
    local name="$1"
    shift
    [ -x "$STATEHUB_BIN" ] || { log "skipping $name: no binary at $STATEHUB_BIN"; return 0; }
    # Every benchmark client comes from 127.0.0.1: the per-address connection rate
    # limit (100/s after a burst of 5,000) would refuse the broadcast and fan-in
    # clients, and the connection caps sized from the descriptor limit (half of it
    # each for MQTT and HTTP) would refuse the 10,000th where the hard limit is
    # 20,000. Mosquitto and rmqttd have neither.
    local conf="$OUT_DIR/$name.toml"
    printf '[mqtt]\nconnect_rate_per_address = 0\nmax_connections = 100000\n' >"$conf"
    printf '%s\n' "$@" >>"$conf"
    printf '[http]\nmax_connections = 100000\n' >>"$conf"
    STATEHUB_CONFIG="$conf" launch_statehub "$OUT_DIR/$name.log" "${PIN_BROKER[@]}" || return 1
    PIDS+=("$STATEHUB_PID")
    PORT[$name]="$STATEHUB_PORT"
    BPID[$name]="$STATEHUB_PID"
    VERSION[$name]="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
    log "$name pid $STATEHUB_PID on 127.0.0.1:$STATEHUB_PORT (cpu $BROKER_CPU)"
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
    BPID[mosquitto]="$pid"
    VERSION[mosquitto]="$(mosquitto -h 2>/dev/null | head -n1 | awk '{print $3}')"
    log "mosquitto ${VERSION[mosquitto]} pid $pid on 127.0.0.1:$port (cpu $BROKER_CPU)"
}

start_rmqttd() {
    local bin conf="${RMQTTD_CONFIG:-}" port="${RMQTTD_PORT:-}"
    if ! bin="$(rmqttd_bin)"; then
        log "skipping rmqttd: none found (scripts/install-rmqtt.sh builds one)"
        return 0
    fi
    if [ -z "$conf" ]; then
        conf="$OUT_DIR/rmqttd/rmqtt.toml"
        port="$(free_port)"
        write_rmqttd_config "$conf" "$port"
    fi
    [ -n "$port" ] || { log "RMQTTD_CONFIG needs RMQTTD_PORT"; return 1; }
    "${PIN_BROKER[@]}" "$bin" -f "$conf" >"$OUT_DIR/rmqttd.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    if ! wait_port "$port" "$pid"; then
        log "rmqttd did not start (log: $OUT_DIR/rmqttd.log)"
        return 1
    fi
    PORT[rmqttd]="$port"
    BPID[rmqttd]="$pid"
    VERSION[rmqttd]="$(rmqttd_version "$bin")"
    log "rmqttd ${VERSION[rmqttd]} pid $pid on 127.0.0.1:$port (cpu $BROKER_CPU)"
}

for b in $BROKERS; do
    case "$b" in
        statehub) start_statehub statehub || log "WARNING: statehub skipped" ;;
        # statehub delivering one copy per matching subscription instead of merging
        # a client's overlapping subscriptions into one copy (the default), whose
        # duplicate check is quadratic in the subscribers a message goes to
        statehub-persub)
            start_statehub statehub-persub 'overlapping_subscriptions = "per-subscription"' ||
                log "WARNING: statehub-persub skipped"
            ;;
        mosquitto) start_mosquitto || log "WARNING: mosquitto skipped" ;;
        rmqttd) start_rmqttd || log "WARNING: rmqttd skipped" ;;
        *) log "unknown broker $b" ;;
    esac
done
[ "${#PORT[@]}" -gt 0 ] || { log "no broker to benchmark"; exit 1; }

# ---- scenarios ----------------------------------------------------------------
# name | statehub-bench mqtt arguments
SCENARIOS=()
has_set() { [[ " $SETS " == *" $1 "* ]]; }
if has_set throughput; then
    SCENARIOS+=(
        "4x4 shared QoS0|--publishers 4 --subscribers 4 --topic-mode shared --qos 0 --messages-per-publisher $MSGS"
        "4x4 shared QoS1|--publishers 4 --subscribers 4 --topic-mode shared --qos 1 --messages-per-publisher $MSGS"
        "16x16 per-publisher QoS0|--publishers 16 --subscribers 16 --topic-mode per-publisher --qos 0 --messages-per-publisher $((MSGS / 2))"
        "16x16 per-publisher QoS1|--publishers 16 --subscribers 16 --topic-mode per-publisher --qos 1 --messages-per-publisher $((MSGS / 2))"
        "4x4 shared QoS1 @1k/s/pub|--publishers 4 --subscribers 4 --topic-mode shared --qos 1 --rate 1000 --duration 5"
    )
fi
if has_set qos1; then
    SCENARIOS+=(
        "4x4 shared QoS1|--publishers 4 --subscribers 4 --topic-mode shared --qos 1 --messages-per-publisher $MSGS"
        "16x16 per-publisher QoS1|--publishers 16 --subscribers 16 --topic-mode per-publisher --qos 1 --messages-per-publisher $((MSGS / 2))"
    )
fi
if has_set shapes; then
    for q in 0 1; do
        SCENARIOS+=(
            "broadcast 1->${BROADCAST_SUBS} QoS$q|--publishers 1 --subscribers $BROADCAST_SUBS --topic-mode shared --qos $q --messages-per-publisher $BROADCAST_MSGS --connect-timeout 600 --drain-timeout 15"
            "fan-in ${FANIN_PUBS}->1 wildcard QoS$q|--publishers $FANIN_PUBS --subscribers 1 --topic-mode wildcard --qos $q --messages-per-publisher $FANIN_MSGS --connect-timeout 600 --drain-timeout 15"
        )
    done
fi

loadavg() { cut -d' ' -f1 /proc/loadavg; }

for sc in "${SCENARIOS[@]}"; do
    name="${sc%%|*}"
    args="${sc#*|}"
    [[ -z "${ONLY:-}" || "$name" =~ $ONLY ]] || continue
    for run in $(seq 1 "$REPEAT"); do
    for b in $BROKERS; do
        [ -n "${PORT[$b]:-}" ] || continue
        if ! kill -0 "${BPID[$b]}" 2>/dev/null; then
            log "$name: $b is no longer running; skipped"
            continue
        fi
        log "$name: $b (run $run/$REPEAT)"
        load0="$(loadavg)"
        # shellcheck disable=SC2086 # args is a word list on purpose
        line="$("${PIN_BENCH[@]}" timeout 900 "$BENCH_BIN" --threads 1 mqtt --port "${PORT[$b]}" \
            --broker-pid "${BPID[$b]}" --payload-size "$PAYLOAD" $args --json --quiet \
            2>>"$OUT_DIR/bench-$b.txt")" || true
        if [ -z "$line" ]; then
            line='{"ok":false,"errors":["statehub-bench produced no result"]}'
        fi
        printf '{"scenario_name":"%s","broker_name":"%s","load":[%s,%s],"result":%s}\n' \
            "$name" "$b" "$load0" "$(loadavg)" "$line" >>"$RESULTS"
    done
    done
done

# ---- table ------------------------------------------------------------------
printf '\nstatehub-bench mqtt, payload %s B, median of %s runs; broker on cpu %s, statehub-bench on cpu %s\n' \
    "$PAYLOAD" "$REPEAT" "$BROKER_CPU" "$BENCH_CPU"
for b in $BROKERS; do
    [ -n "${VERSION[$b]:-}" ] && printf '%s %s; ' "$b" "${VERSION[$b]}"
done
printf '\n\n'
python3 - "$RESULTS" <<'PY'
import json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
runs, loads = {}, []
for r in rows:
    runs.setdefault(r["scenario_name"], {}).setdefault(r["broker_name"], []).append(r["result"])
    loads.extend(r.get("load", []))
if loads:
    print(f"1-minute load average during the runs: median {statistics.median(loads):.1f}, "
          f"min {min(loads):.1f}, max {max(loads):.1f} (2 cores)\n")

def rate(x):
    return x.get("delivered_per_sec", 0.0) if "received" in x else 0.0

# Per scenario and broker: the run with the median delivered msg/s (a run that
# produced no result counts as 0, so repeated failures show up).
by = {}
for name, brokers in runs.items():
    for broker, rs in brokers.items():
        rs = sorted(rs, key=rate)
        med = dict(rs[len(rs) // 2])
        med["all_rates"] = sorted(rate(x) for x in rs)
        by.setdefault(name, {})[broker] = med

def ms(us):
    return "-" if us is None else (f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs")

def cpu(r):
    return r.get("broker_cpu_us_per_msg")

print("| scenario | broker | delivered msg/s | delivered / expected | lost | broker CPU per msg | p50 | p99 "
      "| statehub ÷ this, msg/s | this ÷ statehub, CPU per msg | runs (msg/s) | errors |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
for name, res in by.items():
    sh = res.get("statehub") or res.get("statehub-persub")
    for broker, r in res.items():
        if "received" not in r:
            print(f"| {name} | {broker} | FAILED | | | | | | | | | {'; '.join(r.get('errors', []))[:160]} |")
            continue
        rt = rate(r)
        ratio_rate = ratio_cpu = ""
        if not broker.startswith("statehub") and sh and "received" in sh and rt > 0:
            ratio_rate = f"{rate(sh) / rt:.2f}x"
            if cpu(r) and cpu(sh):
                ratio_cpu = f"{cpu(r) / cpu(sh):.2f}x"
        errs = r.get("errors", [])
        note = f"{len(errs)}: {errs[0][:100]}" if errs else ""
        c = cpu(r)
        runs_s = ", ".join(f"{x:,.0f}" for x in r["all_rates"])
        print(f"| {name} | {broker} | {rt:,.0f} | {r.get('received', 0):,} / {r.get('expected', 0):,} | "
              f"{r.get('lost', 0):,} | {'-' if c is None else f'{c:.2f} µs'} | {ms(r.get('latency_p50_us'))} | "
              f"{ms(r.get('latency_p99_us'))} | {ratio_rate} | {ratio_cpu} | {runs_s} | {note} |")
PY
log "raw results: $RESULTS (logs in $OUT_DIR)"

#!/usr/bin/env bash
# The cost of metrics on the hot paths: two statehub binaries (A: without the
# counters, e.g. built from the commit before them; B: with them) side by side in one
# run, on the scenarios of scripts/bench-statestore.sh (SET and GET, pipeline 1) and
# the QoS 1 scenarios of scripts/bench-mqtt.sh, alternating A/B/A/B within each
# repetition so that a change in the machine's load hits both alike.
#
# Usage: A_BIN=path/to/statehub B_BIN=path/to/statehub scripts/bench-metrics-cost.sh
#
# Both binaries run at once (each idle while the other is measured), pinned to the
# same core; statehub-bench is pinned to the other (see bench-statestore.sh for why).
#
# Environment knobs:
#   A_BIN, B_BIN    the two statehub binaries (required)
#   BENCH_BIN       statehub-bench (default: $TARGET/release/statehub-bench)
#   REPEAT          repetitions (default 5); the table shows the median and every run
#   SS_REQUESTS     state store requests per command and run (default 100000)
#   MSGS            messages per publisher, 4x4 scenario (default 25000; 16x16: half)
#   SERVER_CPU, BENCH_CPU (defaults 0 and 1), OUT_DIR
set -euo pipefail

log() { printf '[bench-metrics-cost] %s\n' "$*" >&2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
bench_paths
: "${A_BIN:?set A_BIN to the statehub binary without metrics}"
: "${B_BIN:?set B_BIN to the statehub binary with metrics}"
REPEAT="${REPEAT:-5}"
SS_REQUESTS="${SS_REQUESTS:-100000}"
MSGS="${MSGS:-25000}"
CLIENTS=64
OUT_DIR="${OUT_DIR:-$(mktemp -d /tmp/statehub-bench-metrics.XXXXXX)}"
mkdir -p "$OUT_DIR"
RESULTS="$OUT_DIR/results.jsonl"
: >"$RESULTS"

kill_tracked_on_exit
pin_cpus "${SERVER_CPU:-0}" "${BENCH_CPU:-1}"


declare -A PORT=() SPID=()
for side in A B; do
    bin_var="${side}_BIN"
    STATEHUB_BIN="${!bin_var}"
    launch_statehub "$OUT_DIR/statehub-$side.log" "${PIN_SERVER[@]}"
    PIDS+=("$STATEHUB_PID")
    PORT[$side]="$STATEHUB_PORT"
    SPID[$side]="$STATEHUB_PID"
    log "$side: $STATEHUB_BIN pid $STATEHUB_PID port $STATEHUB_PORT"
done

# name | statehub-bench arguments (without --port)
SCENARIOS=(
    "state store SET, pipeline 1|statestore --clients $CLIENTS --requests-per-client $((SS_REQUESTS / CLIENTS)) --ratio-get 0 --keys 10000 --value-size 100 --pipeline 1 --fail-on-error"
    "state store GET, pipeline 1|statestore --clients $CLIENTS --requests-per-client $((SS_REQUESTS / CLIENTS)) --ratio-get 1 --keys 10000 --value-size 100 --pipeline 1 --fail-on-error"
    "MQTT 4x4 shared QoS1|mqtt --payload-size 64 --publishers 4 --subscribers 4 --topic-mode shared --qos 1 --messages-per-publisher $MSGS"
    "MQTT 16x16 per-publisher QoS1|mqtt --payload-size 64 --publishers 16 --subscribers 16 --topic-mode per-publisher --qos 1 --messages-per-publisher $((MSGS / 2))"
)

for run in $(seq 1 "$REPEAT"); do
    for sc in "${SCENARIOS[@]}"; do
        name="${sc%%|*}"
        args="${sc#*|}"
        for side in A B; do
            log "run $run/$REPEAT: $name: $side"
            c0="$(cpu_ticks "${SPID[$side]}")"
            # shellcheck disable=SC2086 # args is a word list on purpose
            line="$("${PIN_BENCH[@]}" timeout 600 "$BENCH_BIN" --threads 1 $args \
                --port "${PORT[$side]}" --json --quiet 2>>"$OUT_DIR/bench-$side.txt" | tail -n1)" || true
            c1="$(cpu_ticks "${SPID[$side]}")"
            [ -n "$line" ] || line='{"ok":false}'
            printf '{"scenario":"%s","side":"%s","run":%d,"server_ticks":%d,"result":%s}\n' \
                "$name" "$side" "$run" "$((c1 - c0))" "$line" >>"$RESULTS"
        done
    done
done

printf '\nA = %s\nB = %s\n%s runs each, alternating A/B; median (and every run) of ops/s or delivered msg/s; server on cpu %s, statehub-bench on cpu %s\n\n' \
    "$A_BIN" "$B_BIN" "$REPEAT" "${SERVER_CPU:-0}" "${BENCH_CPU:-1}"
python3 - "$RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def rate(r):
    res = r["result"]
    if not res.get("ok", False):
        return 0.0
    return res.get("delivered_per_sec") or res.get("set_per_sec") or res.get("get_per_sec") or 0.0
def p(res, q):
    for k in (f"latency_{q}_us", f"set_latency_{q}_us", f"get_latency_{q}_us"):
        if res.get(k) is not None:
            return res[k]
    return None
import os
HZ = os.sysconf("SC_CLK_TCK")
def cpu_us(r):
    # Server CPU per message handled: state store requests (GET's populate SETs
    # included), or MQTT messages published plus copies delivered.
    res = r["result"]
    n = res.get("requests", 0) + res.get("populated", 0) + res.get("published", 0) + res.get("received", 0)
    return r["server_ticks"] / HZ * 1e6 / n if n else None
print("| scenario | binary | median rate | runs | median p50 | median p99 | B/A rate (medians) | paired B/A per run | server CPU µs/msg (median) |")
print("|---|---|---:|---|---:|---:|---:|---|---:|")
names = list(dict.fromkeys(r["scenario"] for r in rows))
for name in names:
    med = {}
    for side in ("A", "B"):
        rs = [r for r in rows if r["scenario"] == name and r["side"] == side]
        rates = [rate(r) for r in rs]
        med[side] = statistics.median(rates)
        p50 = [p(r["result"], "p50") for r in rs if p(r["result"], "p50") is not None]
        p99 = [p(r["result"], "p99") for r in rs if p(r["result"], "p99") is not None]
        fmt = lambda us: "-" if not us else f"{statistics.median(us) / 1000:.2f} ms"
        ratio = f"{med['B'] / med['A']:.3f}" if side == "B" and med.get("A") else ""
        paired = ""
        if side == "B":
            a_by_run = {r["run"]: rate(r) for r in rows if r["scenario"] == name and r["side"] == "A"}
            paired = ", ".join(f"{rate(r) / a_by_run[r['run']]:.2f}" for r in rs if a_by_run.get(r["run"]))
        cpus = [c for c in (cpu_us(r) for r in rs) if c is not None]
        cpu = f"{statistics.median(cpus):.1f}" if cpus else "-"
        runs = ", ".join(f"{x:,.0f}" for x in rates)
        print(f"| {name} | {side} | {med[side]:,.0f} | {runs} | {fmt(p50)} | {fmt(p99)} | {ratio} | {paired} | {cpu} |")
PY
log "raw results: $RESULTS"

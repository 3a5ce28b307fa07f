#!/usr/bin/env bash
# Benchmark statehub's state store (SET / GET over MQTT 5, as the Azure IoT
# Operations SDKs call it) against redis-server (SET / GET over RESP with
# redis-benchmark) in one run, and print a markdown table on stdout.
#
# Usage: scripts/bench-statestore.sh      (from anywhere; builds in release first)
#
# What runs, REPEAT times, servers alternating within each repetition:
#   statehub : statehub-bench statestore --clients $CLIENTS --pipeline P
#              --ratio-get 0 (SET) and --ratio-get 1 (GET; the keys are SET first,
#              unmeasured, so every GET hits), --keys $KEYS --value-size $VALUE
#   redis    : redis-benchmark -c $CLIENTS -n $N -t set,get -d $VALUE -r $KEYS -P P --csv
# for P in $PIPELINES (default "1 16"; 1 is strict request/response, like an SDK
# caller awaiting each call and like redis-benchmark's default -P 1).
# Both tools send $N requests per command in total ($N / $CLIENTS per client for
# statehub-bench). Keys are `key:` + 12 digits and values are `x` * $VALUE in both.
# The table shows, per server, pipeline and command, the run with the median ops/s.
#
# CPU pinning: the machine has 2 cores. If server and load generator float
# freely, the scheduler lets them steal each other's core and the result depends
# on how much CPU the load generator happened to burn. Pinning the server to one
# core and the load tool to the other gives each server exactly one dedicated core,
# the same for both (redis-server executes commands on one thread anyway, and
# statehub, which sizes its MQTT workers from the cores it may use, gets one
# worker and no unfair extra core), and keeps the client from perturbing the
# server. The CPU columns show how busy each side was (% of one core, from
# /proc/<pid>/stat and /usr/bin/time): a load tool near 100% means the client, not
# the server, limits the numbers.
#
# redis-server runs with --save '' --appendonly no: no persistence, matching
# statehub's in-memory state store (its default).
#
# Environment knobs:
#   SERVERS       default "statehub redis" (redis is skipped if it cannot be installed)
#   SERVER_CPU    core for the server under test (default 0)
#   BENCH_CPU     core for the load tool (default 1)
#   CLIENTS       connections (default 64)
#   N             requests per command and run, all clients together (default 200000)
#   KEYS          key space (default 10000)
#   VALUE         value bytes (default 100)
#   PIPELINES     requests outstanding per connection, one table section each (default "1 16")
#   BENCH_THREADS tokio threads of statehub-bench (default 1: it has one core)
#   REPEAT        repetitions (default 3)
#   SKIP_BUILD=1  do not run cargo; use existing binaries
#   SKIP_INSTALL=1 do not apt-get redis-server / redis-tools
#   BENCH_BIN     statehub-bench binary (default: $TARGET/release/statehub-bench)
#   STATEHUB_BIN  statehub binary (default: $TARGET/release/statehub)
#   OUT_DIR       where logs and raw results go (default: a fresh temp dir, printed)
set -euo pipefail

log() { printf '[bench-statestore] %s\n' "$*" >&2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
bench_paths
SERVERS="${SERVERS:-statehub redis}"
SERVER_CPU="${SERVER_CPU:-0}"
BENCH_CPU="${BENCH_CPU:-1}"
CLIENTS="${CLIENTS:-64}"
N="${N:-200000}"
KEYS="${KEYS:-10000}"
VALUE="${VALUE:-100}"
PIPELINES="${PIPELINES:-1 16}"
BENCH_THREADS="${BENCH_THREADS:-1}"
REPEAT="${REPEAT:-3}"
OUT_DIR="${OUT_DIR:-$(mktemp -d /tmp/statehub-bench-ss.XXXXXX)}"
mkdir -p "$OUT_DIR"
RESULTS="$OUT_DIR/results.jsonl"
: >"$RESULTS"
PER_CLIENT=$(((N + CLIENTS - 1) / CLIENTS))

kill_tracked_on_exit
has_server() { [[ " $SERVERS " == *" $1 "* ]]; }
pin_cpus "$SERVER_CPU" "$BENCH_CPU"
# Per-run CPU time of the load tool.
if [ -x /usr/bin/time ]; then
    TIMER=(/usr/bin/time -f '%U %S %e' -o)
else
    TIMER=()
fi

now_s() { date +%s.%N; }

# ---- dependencies -----------------------------------------------------------

if has_server redis && [ "${SKIP_INSTALL:-0}" != 1 ]; then
    install_packages redis-server redis-tools || log "WARNING: could not install redis-server / redis-tools"
fi

# ---- build ------------------------------------------------------------------
build_release statehub statehub-bench
[ -x "$BENCH_BIN" ] || { log "no statehub-bench binary at $BENCH_BIN"; exit 1; }

# ---- servers ----------------------------------------------------------------
declare -A PORT=() SPID=()

start_statehub() {
    [ -x "$STATEHUB_BIN" ] || { log "skipping statehub: no binary at $STATEHUB_BIN"; return 1; }
    launch_statehub "$OUT_DIR/statehub.log" "${PIN_SERVER[@]}" || return 1
    PIDS+=("$STATEHUB_PID")
    PORT[statehub]="$STATEHUB_PORT"
    SPID[statehub]="$STATEHUB_PID"
    log "statehub pid $STATEHUB_PID on 127.0.0.1:$STATEHUB_PORT (cpu $SERVER_CPU)"
}

start_redis() {
    command -v redis-server >/dev/null 2>&1 && command -v redis-benchmark >/dev/null 2>&1 ||
        { log "skipping redis: redis-server / redis-benchmark not installed"; return 1; }
    local port
    port="$(free_port)"
    "${PIN_SERVER[@]}" redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --daemonize no --logfile "$OUT_DIR/redis.log" >/dev/null 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    if ! wait_port "$port" "$pid"; then
        log "redis-server did not start (log: $OUT_DIR/redis.log)"
        return 1
    fi
    PORT[redis]="$port"
    SPID[redis]="$pid"
    log "$(redis-server --version | awk '{print $1, $2, $3}') pid $pid on 127.0.0.1:$port (cpu $SERVER_CPU)"
}

for s in $SERVERS; do
    case "$s" in
        statehub) start_statehub || log "WARNING: statehub skipped" ;;
        redis) start_redis || log "WARNING: redis skipped" ;;
        *) log "unknown server $s" ;;
    esac
done
[ "${#PORT[@]}" -gt 0 ] || { log "no server to benchmark"; exit 1; }

# ---- runs -------------------------------------------------------------------
# Each run appends one JSON line per command:
# {"server","pipeline","run","command","ops","p50_us","p99_us","errors","server_cpu","tool_cpu","ok","note"}
# server_cpu / tool_cpu: % of one core over the whole invocation (for statehub GET
# runs this includes the unmeasured populate phase; the `bench_cpu_pct` of the
# raw statehub-bench JSON covers the measured phase only).

emit() { printf '%s\n' "$1" >>"$RESULTS"; }

# run_measured SERVER OUTFILE CMD...: runs CMD pinned to the bench core; sets
# SRV_CPU and TOOL_CPU (percent of one core) for the invocation, and SRV_CPU_S, the
# server's CPU seconds during it.
run_measured() {
    local server="$1" out="$2"
    shift 2
    local pid="${SPID[$server]}" t0 t1 c0 c1 tf="$OUT_DIR/time.txt" rc=0
    c0="$(cpu_ticks "$pid")"
    t0="$(now_s)"
    : >"$tf"
    if [ "${#TIMER[@]}" -gt 0 ]; then
        "${PIN_BENCH[@]}" "${TIMER[@]}" "$tf" timeout 600 "$@" >"$out" 2>>"$OUT_DIR/$server-stderr.txt" || rc=$?
    else
        "${PIN_BENCH[@]}" timeout 600 "$@" >"$out" 2>>"$OUT_DIR/$server-stderr.txt" || rc=$?
    fi
    t1="$(now_s)"
    c1="$(cpu_ticks "$pid")"
    read -r SRV_CPU TOOL_CPU SRV_CPU_S < <(python3 - "$t0" "$t1" "$c0" "$c1" "$tf" <<'PY'
import os, sys
t0, t1, c0, c1, tf = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
wall = max(t1 - t0, 1e-9)
hz = os.sysconf("SC_CLK_TCK")
srv = (c1 - c0) / hz * 100 / wall
tool = -1.0
try:
    parts = [l for l in open(tf).read().split("\n") if l.strip()][-1].split()
    u, s, e = map(float, parts[:3])
    tool = (u + s) * 100 / max(e, 1e-9)
except Exception:
    pass
print(f"{srv:.0f} {tool:.0f} {(c1 - c0) / hz:.3f}")
PY
)
    return "$rc"
}

bench_statehub() { # PIPELINE RUN
    local p="$1" run="$2" cmd ratio out line
    for cmd in SET GET; do
        ratio=0
        [ "$cmd" = GET ] && ratio=1
        out="$OUT_DIR/statehub-p$p-$cmd-$run.json"
        run_measured statehub "$out" "$BENCH_BIN" --threads "$BENCH_THREADS" statestore \
            --port "${PORT[statehub]}" --clients "$CLIENTS" --requests-per-client "$PER_CLIENT" \
            --ratio-get "$ratio" --keys "$KEYS" --value-size "$VALUE" --pipeline "$p" \
            --fail-on-error --json --quiet || true
        line="$(tail -n1 "$out")"
        [ -n "$line" ] || line='{"ok":false,"errors":["statehub-bench produced no result"]}'
        local requests=$((PER_CLIENT * CLIENTS))
        [ "$cmd" = GET ] && requests=$((requests + KEYS))
        python3 - "$line" "$cmd" "$p" "$run" "$SRV_CPU" "$TOOL_CPU" "$SRV_CPU_S" "$requests" >>"$RESULTS" <<'PY'
import json, sys
r = json.loads(sys.argv[1]); cmd = sys.argv[2]; c = cmd.lower()
print(json.dumps({
    "server": "statehub", "pipeline": int(sys.argv[3]), "run": int(sys.argv[4]), "command": cmd,
    "ops": r.get(f"{c}_per_sec", 0.0), "p50_us": r.get(f"{c}_latency_p50_us"),
    "p99_us": r.get(f"{c}_latency_p99_us"), "errors": r.get("error_count", 0),
    "server_cpu": float(sys.argv[5]), "tool_cpu": float(sys.argv[6]),
    "cpu_us_per_request": float(sys.argv[7]) * 1e6 / int(sys.argv[8]),
    "bench_cpu_pct": r.get("bench_cpu_pct"), "ok": r.get("ok", False),
    "note": "; ".join(r.get("errors", []) + r.get("warnings", [])),
}))
PY
    done
}

bench_redis() { # PIPELINE RUN
    local p="$1" run="$2" out="$OUT_DIR/redis-p$1-$2.csv"
    run_measured redis "$out" redis-benchmark -h 127.0.0.1 -p "${PORT[redis]}" -c "$CLIENTS" -n "$N" \
        -t set,get -d "$VALUE" -r "$KEYS" -P "$p" --csv || true
    python3 - "$out" "$p" "$run" "$SRV_CPU" "$TOOL_CPU" "$SRV_CPU_S" "$((2 * N))" >>"$RESULTS" <<'PY'
import csv, json, sys
path, p, run, srv, tool = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
# One invocation runs the SETs and then the GETs: its CPU per request covers both.
per_request = float(sys.argv[6]) * 1e6 / int(sys.argv[7])
seen = set()
for row in csv.DictReader(open(path)):
    cmd = row.get("test", "").strip().upper()
    if cmd not in ("SET", "GET"):
        continue
    seen.add(cmd)
    ms = lambda k: float(row[k]) * 1000 if row.get(k) not in (None, "") else None
    # redis-benchmark runs SET then GET in one process: the CPU figures cover both.
    print(json.dumps({"server": "redis", "pipeline": p, "run": run, "command": cmd,
                      "ops": float(row["rps"]), "p50_us": ms("p50_latency_ms"), "p99_us": ms("p99_latency_ms"),
                      "errors": 0, "server_cpu": srv, "tool_cpu": tool, "cpu_us_per_request": per_request,
                      "ok": True, "note": ""}))
for cmd in ("SET", "GET"):
    if cmd not in seen:
        print(json.dumps({"server": "redis", "pipeline": p, "run": run, "command": cmd, "ops": 0.0,
                          "ok": False, "note": "redis-benchmark produced no result"}))
PY
}

for p in $PIPELINES; do
    for run in $(seq 1 "$REPEAT"); do
        for s in $SERVERS; do
            [ -n "${PORT[$s]:-}" ] || continue
            log "pipeline $p, run $run/$REPEAT: $s"
            case "$s" in
                statehub) bench_statehub "$p" "$run" ;;
                redis) bench_redis "$p" "$run" ;;
            esac
        done
    done
done

# ---- table ------------------------------------------------------------------
printf '\nState store SET/GET: %s connections, %s requests per command, %s keys, %s-byte values; median of %s runs (by ops/s); server on cpu %s, load tool on cpu %s\n\n' \
    "$CLIENTS" "$N" "$KEYS" "$VALUE" "$REPEAT" "$SERVER_CPU" "$BENCH_CPU"
python3 - "$RESULTS" "$ROOT/scripts/lib" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[2])
import bench_ratios

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
groups = {}
for r in rows:
    groups.setdefault((r["pipeline"], r["command"], r["server"]), []).append(r)
med = {}
for k, rs in groups.items():
    rs = sorted(rs, key=lambda x: x.get("ops", 0.0) if x.get("ok") else 0.0)
    med[k] = rs[len(rs) // 2]

def lat(us):
    if us is None:
        return "-"
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"

def pct(v):
    return "-" if v is None or v < 0 else f"{v:.0f}%"

print("| pipeline | command | server | ops/s | p50 | p99 | errors | server CPU | load tool CPU | server CPU per request | statehub/redis ops/s | statehub/redis p99 | statehub/redis CPU per request |")
print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for (p, cmd, server) in sorted(med, key=lambda k: (k[0], k[1] != "SET", k[2] != "statehub")):
    r = med[(p, cmd, server)]
    rd = med.get((p, cmd, "redis"))
    cpu, ratio_ops, ratio_p99, ratio_cpu = bench_ratios.cells(r, rd if server == "statehub" else None)
    name = server if r.get("ok") else f"{server} (FAILED: {r.get('note', '')})"
    print(f"| {p} | {cmd} | {name} | {r.get('ops', 0):,.0f} | {lat(r.get('p50_us'))} | {lat(r.get('p99_us'))} | "
          f"{r.get('errors', 0)} | {pct(r.get('server_cpu'))} | {pct(r.get('tool_cpu'))} | {cpu} | {ratio_ops} | {ratio_p99} | {ratio_cpu} |")
PY
printf '\nCPU columns: %% of one core over the whole invocation (statehub GET runs include the unmeasured SET populate; redis-benchmark runs SET and GET in one invocation). Server CPU per request: the server CPU time over the invocation divided by the requests answered in it (populate included; for redis, its SETs and GETs together).\n'
log "raw results: $RESULTS (logs in $OUT_DIR)"

#!/usr/bin/env bash
# Benchmark statehub's durable state store (--data-dir) against redis-server with
# an append-only file, in one run, and print markdown tables on stdout.
#
# Usage: scripts/bench-durable.sh      (from anywhere; builds in release first)
#
# 1. Durable SET throughput, REPEAT times, servers alternating within each repetition:
#      statehub always   : --data-dir (fresh) --sync always (fsync before every ack,
#                          concurrent writers share an fsync)
#      statehub interval : --data-dir (fresh) --sync interval=1000 (ack once written to
#                          the OS, fsync every second: the class of Redis everysec)
#      statehub memory   : no --data-dir, for reference (what durability costs)
#      redis always      : --appendonly yes --appendfsync always
#      redis everysec    : --appendonly yes --appendfsync everysec
#    Load: statehub-bench statestore --clients $CLIENTS --ratio-get 0 --pipeline 1
#    (SDK-style MQTT 5 request/response at QoS 1) and redis-benchmark -c $CLIENTS
#    -t set -P 1; both $N SETs, $KEYS keys (`key:` + 12 digits), $VALUE-byte values.
#    The table shows each configuration's median run (by ops/s), the ratio to Redis
#    at the same durability, and the data directory's size afterwards.
# 2. Start-up with $STARTUP_KEYS keys of $VALUE bytes: each server is filled (statehub
#    through the state store, pipelined; redis through `redis-cli --pipe`), killed with
#    SIGKILL (a crash: recovery replays what is not in table files / the AOF), then
#    restarted STARTUP_REPEAT times; the table shows the median time from exec until it
#    serves (statehub: MQTT port accepting, which happens after the load; redis: PING
#    answers PONG rather than -LOADING) and what each server logs about its load.
#
# Data directories live under $DATA_ROOT (default: a fresh temp dir on /tmp): put
# it on the disk you want to measure. CPU pinning as in bench-statestore.sh (server on
# SERVER_CPU, load tool on BENCH_CPU). Wall-clock numbers need a quiet machine.
#
# Environment knobs:
#   SERVERS        default "statehub redis"
#   SERVER_CPU     core for the server under test (default 0)
#   BENCH_CPU      core for the load tool (default 1)
#   CLIENTS        connections (default 64)
#   N              SETs per run, all clients together (default 200000)
#   KEYS           key space of the throughput runs (default 10000)
#   VALUE          value bytes (default 100)
#   REPEAT         throughput repetitions (default 3)
#   STARTUP_KEYS   keys for the start-up test (default 1000000; 0 skips it)
#   STARTUP_REPEAT restarts measured (default 3)
#   FILL_PIPELINE  requests in flight per statehub client while filling (default 32)
#   SKIP_BUILD=1   do not run cargo; use existing binaries
#   SKIP_INSTALL=1 do not apt-get redis-server / redis-tools
#   BENCH_BIN, STATEHUB_BIN, DATA_ROOT, OUT_DIR (logs and raw results; printed)
set -euo pipefail

log() { printf '[bench-durable] %s\n' "$*" >&2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
bench_paths
SERVERS="${SERVERS:-statehub redis}"
SERVER_CPU="${SERVER_CPU:-0}"
BENCH_CPU="${BENCH_CPU:-1}"
CLIENTS="${CLIENTS:-64}"
N="${N:-200000}"
KEYS="${KEYS:-10000}"
VALUE="${VALUE:-100}"
REPEAT="${REPEAT:-3}"
STARTUP_KEYS="${STARTUP_KEYS:-1000000}"
STARTUP_REPEAT="${STARTUP_REPEAT:-3}"
FILL_PIPELINE="${FILL_PIPELINE:-32}"
OUT_DIR="${OUT_DIR:-$(mktemp -d /tmp/statehub-bench-durable.XXXXXX)}"
DATA_ROOT="${DATA_ROOT:-$OUT_DIR/data}"
mkdir -p "$OUT_DIR" "$DATA_ROOT"
RESULTS="$OUT_DIR/results.jsonl"
: >"$RESULTS"
PER_CLIENT=$(((N + CLIENTS - 1) / CLIENTS))


kill_tracked_on_exit
pin_cpus "$SERVER_CPU" "$BENCH_CPU"
has_server() { [[ " $SERVERS " == *" $1 "* ]]; }

now_ms() { date +%s%3N; }
# CPU seconds PID has used (utime + stime), 0 if it is gone.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); print ($12 + $13) / hz }' "/proc/$1/stat" 2>/dev/null || echo 0; }

# ---- dependencies and build ---------------------------------------------------
if has_server redis && [ "${SKIP_INSTALL:-0}" != 1 ]; then
    install_packages redis-server redis-tools || log "WARNING: could not install redis-server / redis-tools"
fi
build_release statehub statehub-bench
[ -x "$BENCH_BIN" ] && [ -x "$STATEHUB_BIN" ] || { log "missing binaries under $TARGET/release"; exit 1; }
if has_server redis && ! { command -v redis-server && command -v redis-benchmark && command -v redis-cli; } >/dev/null 2>&1; then
    log "WARNING: redis-server / redis-benchmark / redis-cli not installed; redis skipped"
    SERVERS="${SERVERS//redis/}"
fi

# ---- servers --------------------------------------------------------------------
# start_statehub DIR SYNC LOG: sets SRV_PID and SRV_PORT. SYNC "memory": no data dir.
start_statehub() {
    if [ "$2" = memory ]; then
        launch_statehub "$3" "${PIN_SERVER[@]}" || return 1
    else
        STATEHUB_DATA_DIR="$1" STATEHUB_SYNC="$2" launch_statehub "$3" "${PIN_SERVER[@]}" || return 1
    fi
    SRV_PID="$STATEHUB_PID"
    SRV_PORT="$STATEHUB_PORT"
    PIDS+=("$SRV_PID")
}

# start_redis DIR FSYNC LOG: sets SRV_PID and SRV_PORT (returns once the port accepts).
start_redis() {
    local port
    port="$(free_port)"
    mkdir -p "$1"
    "${PIN_SERVER[@]}" redis-server --port "$port" --bind 127.0.0.1 --dir "$1" --save '' \
        --appendonly yes --appendfsync "$2" --daemonize no --logfile "$3" >/dev/null 2>&1 &
    SRV_PID=$!
    SRV_PORT="$port"
    PIDS+=("$SRV_PID")
    wait_port "$port" "$SRV_PID" || { log "redis-server did not start (log: $3)"; return 1; }
}

stop() { # stop PID [SIGNAL]
    kill "-${2:-TERM}" "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

redis_ready() { # until PING answers PONG (not -LOADING)
    for _ in $(seq 1 6000); do
        [ "$(redis-cli -p "$1" ping 2>/dev/null)" = PONG ] && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.01
    done
    return 1
}

# ---- 1. durable SET throughput ----------------------------------------------------
bench_statehub() { # NAME SYNC RUN
    local dir="$DATA_ROOT/$1-$3" out="$OUT_DIR/$1-$3.json"
    rm -rf "$dir"
    start_statehub "$dir" "$2" "$OUT_DIR/$1-$3.log" || return 0
    "${PIN_BENCH[@]}" timeout 900 "$BENCH_BIN" --threads 1 statestore --port "$SRV_PORT" --clients "$CLIENTS" \
        --requests-per-client "$PER_CLIENT" --ratio-get 0 --keys "$KEYS" --value-size "$VALUE" --pipeline 1 \
        --fail-on-error --json --quiet >"$out" 2>>"$OUT_DIR/statehub-stderr.txt" || true
    local cpu
    cpu="$(cpu_s "$SRV_PID")"
    stop "$SRV_PID"
    mkdir -p "$dir"
    python3 - "$1" "$3" "$(tail -n1 "$out")" "$(du -sk "$dir" | cut -f1)" "$cpu" "$((PER_CLIENT * CLIENTS))" >>"$RESULTS" <<'PY'
import json, sys
name, run, line, kb = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
r = json.loads(line) if line.strip() else {"ok": False}
print(json.dumps({"test": "set", "config": name, "run": run, "ops": r.get("set_per_sec", 0.0),
                  "p50_us": r.get("set_latency_p50_us"), "p99_us": r.get("set_latency_p99_us"),
                  "errors": r.get("error_count", 0), "ok": r.get("ok", False), "disk_kb": kb,
                  "cpu_us_per_request": float(sys.argv[5]) * 1e6 / int(sys.argv[6])}))
PY
}

bench_redis() { # NAME FSYNC RUN
    local dir="$DATA_ROOT/$1-$3" out="$OUT_DIR/$1-$3.csv"
    rm -rf "$dir"
    start_redis "$dir" "$2" "$OUT_DIR/$1-$3.log" || return 0
    "${PIN_BENCH[@]}" timeout 900 redis-benchmark -h 127.0.0.1 -p "$SRV_PORT" -c "$CLIENTS" -n "$N" \
        -t set -d "$VALUE" -r "$KEYS" -P 1 --csv >"$out" 2>>"$OUT_DIR/redis-stderr.txt" || true
    local cpu
    cpu="$(cpu_s "$SRV_PID")"
    stop "$SRV_PID"
    python3 - "$1" "$3" "$out" "$(du -sk "$dir" | cut -f1)" "$cpu" "$N" >>"$RESULTS" <<'PY'
import csv, json, sys
name, run, path, kb = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
row = next((r for r in csv.DictReader(open(path)) if r.get("test", "").upper() == "SET"), None)
ms = lambda k: float(row[k]) * 1000 if row and row.get(k) else None
print(json.dumps({"test": "set", "config": name, "run": run, "ops": float(row["rps"]) if row else 0.0,
                  "p50_us": ms("p50_latency_ms"), "p99_us": ms("p99_latency_ms"), "errors": 0,
                  "ok": row is not None, "disk_kb": kb,
                  "cpu_us_per_request": float(sys.argv[5]) * 1e6 / int(sys.argv[6])}))
PY
}

for run in $(seq 1 "$REPEAT"); do
    if has_server statehub; then
        log "run $run/$REPEAT: statehub in memory (reference)"; bench_statehub statehub-memory memory "$run"
        log "run $run/$REPEAT: statehub --sync always"; bench_statehub statehub-always always "$run"
        log "run $run/$REPEAT: statehub --sync interval=1000"; bench_statehub statehub-interval interval=1000 "$run"
    fi
    if has_server redis; then
        log "run $run/$REPEAT: redis appendfsync always"; bench_redis redis-always always "$run"
        log "run $run/$REPEAT: redis appendfsync everysec"; bench_redis redis-everysec everysec "$run"
    fi
done

# ---- 2. start-up with many keys ----------------------------------------------------
fill_statehub() { # DIR
    start_statehub "$1" interval=1000 "$OUT_DIR/startup-fill-statehub.log" || return 1
    log "filling statehub with $STARTUP_KEYS keys"
    "${PIN_BENCH[@]}" "$BENCH_BIN" --threads 1 statestore --port "$SRV_PORT" --clients "$CLIENTS" \
        --requests-per-client 1 --ratio-get 1 --keys "$STARTUP_KEYS" --value-size "$VALUE" \
        --pipeline "$FILL_PIPELINE" --fail-on-error --json --quiet >"$OUT_DIR/startup-fill.json" 2>&1
    stop "$SRV_PID" KILL
}

fill_redis() { # DIR
    start_redis "$1" everysec "$OUT_DIR/startup-fill-redis.log" || return 1
    log "filling redis with $STARTUP_KEYS keys"
    python3 - "$STARTUP_KEYS" "$VALUE" <<'PY' | redis-cli -p "$SRV_PORT" --pipe >"$OUT_DIR/startup-fill-redis.txt"
import sys
keys, size = int(sys.argv[1]), int(sys.argv[2])
value = b"x" * size
out = sys.stdout.buffer
for i in range(keys):
    key = b"key:%012d" % i
    out.write(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key, size, value))
PY
    sleep 2 # everysec: let the last second reach the disk before the crash
    stop "$SRV_PID" KILL
}

startup() { # SERVER DIR RUN: prints ms from exec to serving
    local t0 t1 logf="$OUT_DIR/startup-$1-$3.log"
    t0="$(now_ms)"
    if [ "$1" = statehub ]; then
        start_statehub "$2" always "$logf" || return 1
    else
        start_redis "$2" always "$logf" && redis_ready "$SRV_PORT" "$SRV_PID" || return 1
    fi
    t1="$(now_ms)"
    local keys
    if [ "$1" = statehub ]; then
        keys="$(sed 's/\x1b\[[0-9;]*m//g' "$logf" | grep -oE 'loaded from .*: [0-9]+ keys, [0-9]+ retained messages and [0-9]+ persistent sessions in [0-9]+ ms' | head -n1)"
    else
        keys="$(redis-cli -p "$SRV_PORT" dbsize) keys; $(grep -oE 'DB loaded from .*' "$logf" | tr '\n' ';')"
    fi
    stop "$SRV_PID" KILL
    printf '{"test":"startup","config":"%s","run":%s,"ms":%s,"note":"%s","disk_kb":%s}\n' \
        "$1" "$3" "$((t1 - t0))" "${keys//\"/}" "$(du -sk "$2" | cut -f1)" >>"$RESULTS"
}

if [ "$STARTUP_KEYS" -gt 0 ]; then
    for s in $SERVERS; do
        dir="$DATA_ROOT/startup-$s"
        rm -rf "$dir"
        if [ "$s" = statehub ]; then fill_statehub "$dir" || continue; else fill_redis "$dir" || continue; fi
        for run in $(seq 1 "$STARTUP_REPEAT"); do
            log "start-up $run/$STARTUP_REPEAT: $s with $STARTUP_KEYS keys"
            startup "$s" "$dir" "$run" || log "WARNING: $s did not start"
        done
    done
fi

# ---- tables -------------------------------------------------------------------------
printf '\nDurable SET: %s connections, %s SETs per run, %s keys, %s-byte values; median of %s runs (by ops/s); server on cpu %s, load tool on cpu %s; data under %s\n\n' \
    "$CLIENTS" "$N" "$KEYS" "$VALUE" "$REPEAT" "$SERVER_CPU" "$BENCH_CPU" "$DATA_ROOT"
python3 - "$RESULTS" "$STARTUP_KEYS" "$ROOT/scripts/lib" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[3])
import bench_ratios

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def median(rs, key):
    rs = sorted(rs, key=key)
    return rs[len(rs) // 2] if rs else None

sets = {}
for r in rows:
    if r["test"] == "set":
        sets.setdefault(r["config"], []).append(r)
med = {c: median(rs, lambda x: x["ops"] if x.get("ok") else 0.0) for c, rs in sets.items()}
peer = {"statehub-always": "redis-always", "statehub-interval": "redis-everysec"}
lat = lambda us: "-" if us is None else (f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs")
print("| configuration | SET ops/s | p50 | p99 | errors | data dir after | server CPU per request | vs Redis at the same durability: ops/s | p99 | CPU per request |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for c in ["statehub-always", "redis-always", "statehub-interval", "redis-everysec", "statehub-memory"]:
    r = med.get(c)
    if not r:
        continue
    cpu, ratio, ratio_p99, ratio_cpu = bench_ratios.cells(r, med.get(peer.get(c, "")))
    if ratio:
        ratio = f"{ratio} ({peer[c]})"
    name = c if r.get("ok") else f"{c} (FAILED)"
    print(f"| {name} | {r['ops']:,.0f} | {lat(r['p50_us'])} | {lat(r['p99_us'])} | {r['errors']} | {r['disk_kb'] / 1024:.1f} MiB | {cpu} | {ratio} | {ratio_p99} | {ratio_cpu} |")
print("\nServer CPU per request: the server process's CPU time (all its threads, start-up included) over the requests of the run.")

ups = {}
for r in rows:
    if r["test"] == "startup":
        ups.setdefault(r["config"], []).append(r)
if ups:
    print(f"\nStart-up after SIGKILL with {int(sys.argv[2]):,} keys: median of {max(len(v) for v in ups.values())} restarts, exec until serving\n")
    print("| server | start-up | data dir | what it logs |")
    print("|---|---:|---:|---|")
    for c, rs in sorted(ups.items()):
        r = median(rs, lambda x: x["ms"])
        print(f"| {c} | {r['ms'] / 1000:.2f} s | {r['disk_kb'] / 1024:.0f} MiB | {r['note']} |")
PY
log "raw results: $RESULTS (logs in $OUT_DIR)"

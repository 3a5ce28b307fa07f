# Helpers shared by the project's scripts; source it, do not run it.
# Each script defines its own log() before sourcing.

# bench_paths: what every benchmark script starts from: ROOT (the repository, made the
# working directory), TARGET (CARGO_TARGET_DIR, else ROOT/target), and the binaries
# BENCH_BIN and STATEHUB_BIN (the release builds under TARGET unless already set).
bench_paths() {
    ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
    cd "$ROOT"
    TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
    BENCH_BIN="${BENCH_BIN:-$TARGET/release/statehub-bench}"
    STATEHUB_BIN="${STATEHUB_BIN:-$TARGET/release/statehub}"
}

# build_release PACKAGE...: builds these cargo packages in release (2 jobs), unless
# SKIP_BUILD=1 (then the binaries already there, or BENCH_BIN / STATEHUB_BIN, are used).
build_release() {
    [ "${SKIP_BUILD:-0}" = 1 ] && return 0
    local args=() pkg
    for pkg in "$@"; do
        args+=(-p "$pkg")
    done
    log "building $* (release)"
    cargo build --release -j 2 "${args[@]}"
}

# cpu_ticks PID: the user and system CPU time PID has used, in clock ticks (0 if it
# is gone).
cpu_ticks() {
    awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat" 2>/dev/null || echo 0
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@"
    else
        log "need root for: $*"
        return 1
    fi
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

wait_port() { # wait_port PORT PID: until something accepts on 127.0.0.1:PORT
    local port="$1" pid="$2"
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || return 1
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# launch_statehub LOGFILE [PIN COMMAND...]: starts "$STATEHUB_BIN serve" on port 0
# (both listeners) and sets STATEHUB_PID and STATEHUB_PORT, the MQTT port read back
# from the log line "mqtt listening on 127.0.0.1:PORT" (ANSI colours stripped).
# Returns 1, with the log's tail on stderr, if it does not come up.
launch_statehub() {
    local logf="$1"
    shift
    NO_COLOR=1 RUST_LOG="${RUST_LOG:-info}" "$@" "$STATEHUB_BIN" serve \
        --mqtt-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 >"$logf" 2>&1 &
    STATEHUB_PID=$!
    STATEHUB_PORT=""
    for _ in $(seq 1 100); do
        STATEHUB_PORT="$(sed 's/\x1b\[[0-9;]*m//g' "$logf" |
            grep -oE 'mqtt listening on 127\.0\.0\.1:[0-9]+' | head -n1 | sed 's/.*://')" || true
        [ -n "$STATEHUB_PORT" ] && break
        kill -0 "$STATEHUB_PID" 2>/dev/null || break
        sleep 0.1
    done
    if [ -z "$STATEHUB_PORT" ] || ! wait_port "$STATEHUB_PORT" "$STATEHUB_PID"; then
        log "statehub did not start (log: $logf):"
        tail -n 20 "$logf" >&2 || true
        kill "$STATEHUB_PID" 2>/dev/null || true
        return 1
    fi
}

# install_packages PKG...: apt-get installs the Debian packages that are missing.
install_packages() {
    local missing=() pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    log "installing ${missing[*]} (apt-get)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# install_socketio DIR: node and npm, then the Socket.IO benchmark server's packages in
# DIR (npm ci), unless they are there already.
install_socketio() {
    command -v node >/dev/null 2>&1 || install_packages nodejs npm
    if [ ! -d "$1/node_modules/socket.io" ]; then
        log "installing socket.io (npm ci) in $1"
        (cd "$1" && npm ci --no-audit --no-fund --loglevel=error </dev/null)
    fi
}

# kill_tracked_on_exit: every pid the script appends to the array PIDS is sent
# SIGTERM and reaped when the script exits, however it exits.
kill_tracked_on_exit() {
    PIDS=()
    trap '_kill_tracked' EXIT
}
_kill_tracked() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}

# pin_cpus SERVER_CPU BENCH_CPU: sets the command prefixes PIN_SERVER and PIN_BENCH
# (arrays, so that `$!` after "${PIN_SERVER[@]}" cmd & is cmd itself: taskset execs it);
# empty, with a warning, where taskset is missing.
pin_cpus() {
    if command -v taskset >/dev/null 2>&1; then
        PIN_SERVER=(taskset -c "$1")
        PIN_BENCH=(taskset -c "$2")
    else
        log "WARNING: taskset not found; server and load tool are not pinned"
        PIN_SERVER=()
        PIN_BENCH=()
    fi
}

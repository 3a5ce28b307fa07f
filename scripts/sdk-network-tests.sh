#!/usr/bin/env bash
# Runs the Azure IoT Operations Rust SDK's own network tests against a statehub binary.
#
#   scripts/sdk-network-tests.sh [SDK_SOURCES] [TEST_FILTER...]
#
# SDK_SOURCES is a directory holding the SDK crates' sources, either
#   - an iot-operations-sdks checkout's `rust/` folder (crate folders named
#     azure_iot_operations_mqtt, azure_iot_operations_protocol, azure_iot_operations_services), or
#   - a cargo registry source folder (crate folders named azure_iot_operations_*-VERSION),
#     the default: ~/.cargo/registry/src/*/ (present once the state store service's
#     dev-dependencies have been fetched; the published crates ship their tests).
# Nothing is downloaded here and no SDK code is kept in this repository: the crates are
# copied into a scratch workspace (SCRATCH, default a temporary directory), patched to use
# each other, and their network tests run with ENABLE_NETWORK_TESTS=1 against
# `statehub serve --mqtt-listen 127.0.0.1:1883` (the port those tests hardcode; it must be
# free). Prints per-file pass/fail counts and exits non-zero if any test failed.
#
# Cluster mode (CLUSTER=N, N >= 2): a redis-server on a free port, N statehub nodes on it
# (`--redis`), and a round-robin TCP balancer (scripts/lib/rr_balancer.py) on port 1883,
# so each SDK client lands on the next node; every test file runs, with its clients spread
# over the nodes.
#
# Environment: STATEHUB_SERVE_ARGS adds arguments to `statehub serve` (e.g.
# `--data-dir DIR` to run the tests against the durable engine); SDK_SERVICES_VERSION (default 1.5.0-beta1), SDK_MQTT_VERSION (1.2.3),
# SDK_PROTOCOL_VERSION (1.1.0) pick the registry folders; CARGO_TARGET_DIR is honoured
# for the statehub build; SDK_TARGET_DIR (default $SCRATCH/target) for the SDK build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SERVICES_VERSION="${SDK_SERVICES_VERSION:-1.5.0-beta1}"
MQTT_VERSION="${SDK_MQTT_VERSION:-1.2.3}"
PROTOCOL_VERSION="${SDK_PROTOCOL_VERSION:-1.1.0}"
SRC="${1:-}"
shift || true
FILTERS=("$@")

find_crate() { # NAME VERSION -> directory
    local name="$1" version="$2" dir
    if [[ -n "$SRC" && -d "$SRC/$name" ]]; then echo "$SRC/$name"; return; fi
    for dir in ${SRC:+"$SRC"/$name-$version} "$HOME"/.cargo/registry/src/*/"$name-$version"; do
        if [[ -d "$dir" ]]; then echo "$dir"; return; fi
    done
    echo "cannot find $name $version sources (pass the SDK sources as the first argument)" >&2
    exit 2
}

MQTT_SRC="$(find_crate azure_iot_operations_mqtt "$MQTT_VERSION")"
PROTOCOL_SRC="$(find_crate azure_iot_operations_protocol "$PROTOCOL_VERSION")"
SERVICES_SRC="$(find_crate azure_iot_operations_services "$SERVICES_VERSION")"

if (exec 3<>/dev/tcp/127.0.0.1/1883) 2>/dev/null; then
    echo "port 1883 is in use; stop whatever listens there first" >&2
    exit 2
fi

SCRATCH="${SCRATCH:-$(mktemp -d)}"
echo "== scratch workspace $SCRATCH"
mkdir -p "$SCRATCH"
for pair in "mqtt:$MQTT_SRC" "protocol:$PROTOCOL_SRC" "services:$SERVICES_SRC"; do
    rm -rf "${SCRATCH:?}/${pair%%:*}"
    cp -r "${pair#*:}" "$SCRATCH/${pair%%:*}"
    rm -f "$SCRATCH/${pair%%:*}/Cargo.lock"
done
cat > "$SCRATCH/Cargo.toml" <<TOML
[workspace]
resolver = "2"
members = ["mqtt", "protocol", "services"]

[patch.crates-io]
azure_iot_operations_mqtt = { path = "mqtt" }
azure_iot_operations_protocol = { path = "protocol" }
azure_iot_operations_services = { path = "services" }
TOML

echo "== building statehub"
(cd "$ROOT" && cargo build -p statehub)
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/statehub"

echo "== building the SDK tests"
export CARGO_TARGET_DIR="${SDK_TARGET_DIR:-$SCRATCH/target}"
(cd "$SCRATCH" && cargo test --no-run -p azure_iot_operations_services --features state_store,leased_lock \
    --test state_store_client_test --test lease_client_tests --test lock_client_tests)
(cd "$SCRATCH" && cargo test --no-run -p azure_iot_operations_protocol --test command_network_tests --test telemetry_network_tests)
(cd "$SCRATCH" && cargo test --no-run -p azure_iot_operations_mqtt --test session_network_tests)

LOG="$SCRATCH/statehub.log"
CLUSTER="${CLUSTER:-0}"
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done' EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
if [[ "$CLUSTER" -ge 2 ]]; then
    REDIS_PORT="$(free_port)"
    mkdir -p "$SCRATCH/redis"
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$SCRATCH/redis" --save '' \
        --appendonly no >"$SCRATCH/redis.log" 2>&1 &
    PIDS+=($!)
    BACKENDS=()
    for i in $(seq "$CLUSTER"); do
        port="$(free_port)"
        "$BIN" serve --mqtt-listen "127.0.0.1:$port" --http-listen 127.0.0.1:0 \
            --redis "redis://127.0.0.1:$REDIS_PORT" --node-id "node$i" >"$SCRATCH/statehub$i.log" 2>&1 &
        PIDS+=($!)
        BACKENDS+=("127.0.0.1:$port")
    done
    for b in "${BACKENDS[@]}"; do
        for _ in $(seq 100); do
            (exec 3<>"/dev/tcp/${b%:*}/${b#*:}") 2>/dev/null && break
            sleep 0.1
        done
    done
    python3 "$ROOT/scripts/lib/rr_balancer.py" 127.0.0.1:1883 "${BACKENDS[@]}" 2>"$LOG" &
    PIDS+=($!)
    echo "== $CLUSTER statehub nodes on redis at $REDIS_PORT behind a balancer on 1883 (logs $SCRATCH/statehub*.log)"
else
    # shellcheck disable=SC2086 # STATEHUB_SERVE_ARGS is a list of arguments
    "$BIN" serve --mqtt-listen 127.0.0.1:1883 --http-listen 127.0.0.1:0 ${STATEHUB_SERVE_ARGS:-} >"$LOG" 2>&1 &
    PIDS+=($!)
fi
for _ in $(seq 100); do
    (exec 3<>/dev/tcp/127.0.0.1/1883) 2>/dev/null && break
    sleep 0.1
done

export ENABLE_NETWORK_TESTS=1
status=0
summary=()
run() { # PACKAGE TEST [FEATURES]
    local pkg="$1" test="$2" features="${3:-}" out="$SCRATCH/$2.out"
    echo "== $pkg --test $test"
    set +e
    (cd "$SCRATCH" && cargo test -p "$pkg" ${features:+--features "$features"} --test "$test" -- ${FILTERS[@]+"${FILTERS[@]}"} 2>&1) | tee "$out" | grep -E "^test |test result:"
    local rc=${PIPESTATUS[0]}
    set -e
    local line
    line="$(grep -E "^test result:" "$out" | tail -1 || true)"
    summary+=("$test: ${line:-no result (exit $rc)}")
    [[ $rc -eq 0 ]] || status=1
}
run azure_iot_operations_services state_store_client_test state_store,leased_lock
run azure_iot_operations_services lease_client_tests state_store,leased_lock
run azure_iot_operations_services lock_client_tests state_store,leased_lock
# In cluster mode an invoker and its executor, a sender and its receiver, connect to
# different nodes through the balancer: MQTT routing across nodes is what they test.
run azure_iot_operations_protocol command_network_tests
run azure_iot_operations_protocol telemetry_network_tests
run azure_iot_operations_mqtt session_network_tests

echo "== summary (statehub log: $LOG)"
printf '%s\n' "${summary[@]}"
exit $status

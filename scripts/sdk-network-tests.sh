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
# Secure mode (AUTH=sat): the SDK clients connect over TLS with a K8S-SAT token file
# (MQTT 5 enhanced authentication), as in a cluster, and statehub's listener on 1883
# takes TLS only and refuses anonymous clients. The tests hardcode plain TCP, so their
# copies in the scratch workspace get `.use_tls(true).ca_file(..).sat_file(..)` in
# place of `.use_tls(false)`; a CA, a server certificate for localhost (openssl) and
# an HS256 token (python3) are made in $SCRATCH/pki. Not with CLUSTER.
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

AUTH="${AUTH:-}"
SECURE_ARGS=()
if [[ "$AUTH" == sat ]]; then
    [[ "${CLUSTER:-0}" -lt 2 ]] || { echo "AUTH=sat does not combine with CLUSTER" >&2; exit 2; }
    PKI="$SCRATCH/pki"
    mkdir -p "$PKI"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj "/CN=sdk tests CA" -keyout "$PKI/ca.key" -out "$PKI/ca.pem" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=localhost" \
        -keyout "$PKI/server.key" -out "$PKI/server.csr" 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$PKI/san.ext"
    openssl x509 -req -in "$PKI/server.csr" -CA "$PKI/ca.pem" -CAkey "$PKI/ca.key" \
        -CAcreateserial -days 2 -extfile "$PKI/san.ext" -out "$PKI/server.crt" 2>/dev/null
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PKI/hmac.secret"
    python3 - "$PKI/hmac.secret" >"$PKI/token" <<'PY'
import base64, hashlib, hmac, json, sys, time
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=")
secret = open(sys.argv[1], "rb").read().strip()
head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
now = int(time.time())
claims = {"aud": ["statehub"], "sub": "system:serviceaccount:sdk:tests", "iat": now, "exp": now + 86400}
body = head + b"." + b64(json.dumps(claims).encode())
print((body + b"." + b64(hmac.new(secret, body, hashlib.sha256).digest())).decode(), end="")
PY
    cat >"$PKI/statehub.toml" <<TOML
[[mqtt.listeners]]
address = "127.0.0.1:1883"
tls = { cert = "$PKI/server.crt", key = "$PKI/server.key" }
authentication = ["token"]

[authentication.tokens]
hmac_secret_file = "$PKI/hmac.secret"
audiences = ["statehub"]
TOML
    TLS_SETTINGS=".use_tls(true).ca_file(Some(\"$PKI/ca.pem\".to_string())).sat_file(Some(\"$PKI/token\".to_string()))"
    for f in services/tests/state_store_client_test.rs services/tests/lease_client_tests.rs \
        services/tests/lock_client_tests.rs protocol/tests/command_network_tests.rs \
        protocol/tests/telemetry_network_tests.rs mqtt/tests/session_network_tests.rs; do
        grep -q '\.use_tls(false)' "$SCRATCH/$f" || { echo "no .use_tls(false) in $f" >&2; exit 2; }
        sed -i "s|\.use_tls(false)|$TLS_SETTINGS|" "$SCRATCH/$f"
    done
    SECURE_ARGS=(--config "$PKI/statehub.toml")
    echo "== secure mode: TLS and K8S-SAT tokens on 127.0.0.1:1883 (files in $PKI)"
fi

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
    if [[ ${#SECURE_ARGS[@]} -gt 0 ]]; then
        LISTEN=("${SECURE_ARGS[@]}")
    else
        LISTEN=(--mqtt-listen 127.0.0.1:1883)
    fi
    "$BIN" serve "${LISTEN[@]}" --http-listen 127.0.0.1:0 ${STATEHUB_SERVE_ARGS:-} >"$LOG" 2>&1 &
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

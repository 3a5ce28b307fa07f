# rmqttd for the benchmark scripts; source it after common.sh, do not run it.
# rmqttd itself is built outside the repository by scripts/install-rmqtt.sh.

# rmqttd_bin: prints the rmqttd to run ($RMQTTD_BIN, else rmqttd on PATH, else the
# one scripts/install-rmqtt.sh builds in /tmp/rmqtt/bin); fails if there is none.
rmqttd_bin() {
    local bin="${RMQTTD_BIN:-}"
    [ -n "$bin" ] || bin="$(command -v rmqttd 2>/dev/null || true)"
    [ -n "$bin" ] || bin="/tmp/rmqtt/bin/rmqttd"
    [ -x "$bin" ] || return 1
    printf '%s\n' "$bin"
}

# write_rmqttd_config FILE PORT: a minimal rmqttd config: one TCP listener on
# 127.0.0.1:PORT, anonymous, no plugin, console logging of warnings only, and the
# limits that would otherwise throttle or drop a benchmark lifted to match the
# Mosquitto config of bench-mqtt.sh (no in-flight cap: 65535 is the protocol's
# maximum; queues of 1,000,000 messages; no queue rate limit; no cap on
# concurrent handshakes). rmqttd always starts its cluster gRPC server too; it gets
# a free loopback port.
write_rmqttd_config() {
    local file="$1" port="$2" rpc_port dir
    rpc_port="$(free_port)"
    dir="$(dirname "$file")"
    mkdir -p "$dir/rmqtt-plugins"
    cat >"$file" <<EOF
node.id = 1
node.busy.check_enable = false
rpc.server_addr = "127.0.0.1:$rpc_port"
log.to = "console"
log.level = "warn"
plugins.dir = "$dir/rmqtt-plugins/"
plugins.default_startups = []
mqtt.max_sessions = 0
listener.tcp.external.addr = "127.0.0.1:$port"
listener.tcp.external.max_connections = 1024000
listener.tcp.external.max_handshaking_limit = 100000
listener.tcp.external.backlog = 1024
listener.tcp.external.nodelay = true
listener.tcp.external.allow_anonymous = true
listener.tcp.external.max_keepalive = 65535
listener.tcp.external.max_inflight = 65535
listener.tcp.external.max_mqueue_len = 1000000
listener.tcp.external.mqueue_rate_limit = "1000000000,1s"
EOF
}

# rmqttd_version BIN: "0.24.0" or similar.
rmqttd_version() {
    "$1" --version 2>/dev/null | head -n1 | awk '{print $1}' | sed 's|^rmqtt/||; s|-.*||'
}

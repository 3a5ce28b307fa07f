# Sourced by the interop scripts: with SECURITY=rules, CONFIG (a statehub config
# file) is replaced by a copy that adds security as far as suites whose clients mostly
# send no credentials allow: a password file holding the one user a suite names (the
# conformance suite's `testuser`/`secret`, checked for real), anonymous clients
# admitted explicitly, and authorization rules (deny by default) granting every
# client id Connect, Publish and Subscribe on `#`, so every CONNECT, PUBLISH and
# SUBSCRIBE goes through the authorization checks. Needs BIN.
if [ "${SECURITY:-}" = rules ]; then
  SEC=$(mktemp -d /tmp/statehub-interop-security.XXXXXX)
  printf 'secret\n' | "$BIN" passwd -c "$SEC/passwd" testuser >/dev/null || exit 1
  cat "$CONFIG" - >"$SEC/statehub.toml" <<TOML

[authentication]
password_file = "$SEC/passwd"
allow_anonymous = true

[[authorization.rules]]
principals = { clientIds = ["*"] }
brokerResources = [
  { method = "Connect" },
  { method = "Publish", topics = ["#"] },
  { method = "Subscribe", topics = ["#"] },
]
TOML
  CONFIG="$SEC/statehub.toml"
  echo "security: password file, anonymous clients allowed, authorization rules ($CONFIG)" >&2
fi

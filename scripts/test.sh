#!/usr/bin/env bash
# Run the whole test suite: the one command to use locally and in CI.
#
#   1. install the test dependencies (mosquitto, paho-mqtt venv; idempotent)
#   2. cargo fmt --check and cargo clippy -D warnings (style and lints are part of the suite)
#   3. the doc tests (nextest does not run them)
#   4. cargo nextest run --workspace   (or cargo test --workspace without nextest)
#
# Exits non-zero on any failure. Builds use 2 jobs by default (CARGO_BUILD_JOBS).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/install-test-deps.sh

# Python helpers used by tests run from the project's venv.
export VIRTUAL_ENV="$ROOT/.venv"
export PATH="$ROOT/.venv/bin:$PATH"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"

echo "== cargo fmt --all --check"
cargo fmt --all --check
echo "== cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

if cargo nextest --version >/dev/null 2>&1; then
    # Doc tests first (nextest does not run them), so the run closes on nextest's
    # summary of every other test.
    echo "== cargo test --workspace --doc"
    cargo test --workspace --doc
    echo "== cargo nextest run --workspace"
    cargo nextest run --workspace --no-fail-fast
else
    echo "== cargo test --workspace (cargo-nextest not installed)"
    cargo test --workspace --no-fail-fast
fi

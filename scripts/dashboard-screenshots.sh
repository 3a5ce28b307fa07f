#!/usr/bin/env bash
# Refresh the dashboard screenshots in docs/dashboard/ (one PNG per page), taken by
# the headless-Chromium test against a live statehub with real clients.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STATEHUB_DASHBOARD_SCREENSHOTS="$ROOT/docs/dashboard" \
    cargo test -p statehub --test dashboard dashboard_in_headless_chromium -- --exact
rm -f docs/dashboard/failure.png
ls -l docs/dashboard/

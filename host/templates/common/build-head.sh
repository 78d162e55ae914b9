#!/usr/bin/env bash
# Builds the plugin into a component (a Rust plugin runs its tests first), checks it as the
# operator will, tests the status the operator would write, and prints how to push it.
set -euo pipefail
cd "$(dirname "$0")"
host=${HOST:-host}
command -v "$host" >/dev/null || { echo "build: 'host' is not on the PATH (or set HOST)" >&2; exit 2; }

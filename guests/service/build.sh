#!/usr/bin/env bash
# Builds the plugin into a component (its tests first), checks it as the operator will, tests the
# status the operator would write, and prints how to push it: the layout `host new --lang rust`
# writes. A built-in plugin is a member of this repository's workspace (the host embeds it), so
# cargo is asked for its package; a plugin of your own is a project of its own.
set -euo pipefail
cd "$(dirname "$0")"
host=${HOST:-host}
command -v "$host" >/dev/null || { echo "build: 'host' is not on the PATH (or set HOST)" >&2; exit 2; }

cargo test --quiet -p guest-service
# As the host's build embeds it: a cdylib of the library, with the workspace's `guest` profile.
cargo rustc --quiet -p guest-service --lib --crate-type cdylib --target wasm32-wasip2 --profile guest
# Wherever cargo puts it (CARGO_TARGET_DIR, a config's build.target-dir): cargo says where.
target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
cp "${target:-../../target}/wasm32-wasip2/guest/guest_service.wasm" service.wasm
"$host" check service.wasm example.yaml

# The status the operator would write, from the children as test/observed.yaml reports them.
out=$("$host" render --no-builtins --plugin service.wasm --observed test/observed.yaml example.yaml)
# Each example's Ready condition (its status line comes just before its type line) is True.
ready=$(grep -B1 "type: Ready$" <<<"$out" | grep -c 'status: "True"' || true)
[ "$ready" = 2 ] || { echo "build: the two examples are not both Ready in:" >&2; echo "$out" >&2; exit 1; }
grep -q "2/2 available" <<<"$out" || { echo "build: no Deployment 2/2 available in:" >&2; echo "$out" >&2; exit 1; }

echo
echo "service.wasm is ready. Publish it:"
echo "  $host push service.wasm REGISTRY/plugins/service:0.1.0"

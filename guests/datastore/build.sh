#!/usr/bin/env bash
# Builds the plugin into a component (its tests first), checks it as the operator will, tests the
# status the operator would write, and prints how to push it: the layout `host new --lang rust`
# writes. A built-in plugin is a member of this repository's workspace (the host embeds it), so
# cargo is asked for its package; a plugin of your own is a project of its own.
set -euo pipefail
cd "$(dirname "$0")"
host=${HOST:-host}
command -v "$host" >/dev/null || { echo "build: 'host' is not on the PATH (or set HOST)" >&2; exit 2; }

cargo test --quiet -p guest-datastore
# As the host's build embeds it: a cdylib of the library, with the workspace's `guest` profile.
cargo rustc --quiet -p guest-datastore --lib --crate-type cdylib --target wasm32-wasip2 --profile guest
# Wherever cargo puts it (CARGO_TARGET_DIR, a config's build.target-dir): cargo says where.
target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
cp "${target:-../../target}/wasm32-wasip2/guest/guest_datastore.wasm" datastore.wasm
"$host" check datastore.wasm example.yaml

# The status the operator would write, from the children as test/observed.yaml reports them.
out=$("$host" render --no-builtins --plugin datastore.wasm --observed test/observed.yaml example.yaml)
grep -q "endpoint: datastore.hanzo.svc.cluster.local:" <<<"$out" || { echo "build: no status.endpoint in:" >&2; echo "$out" >&2; exit 1; }
grep -q "readyReplicas: 1" <<<"$out" || { echo "build: no status.readyReplicas in:" >&2; echo "$out" >&2; exit 1; }
grep -q "reason: Ready" <<<"$out" || { echo "build: the example is not Ready in:" >&2; echo "$out" >&2; exit 1; }

echo
echo "datastore.wasm is ready. Publish it:"
echo "  $host push datastore.wasm REGISTRY/plugins/datastore:0.1.0"

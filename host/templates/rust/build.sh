#!/usr/bin/env bash
# Builds the plugin into a component, checks it as the operator will, tests what it renders and
# the status the operator would write, and prints how to push it.
set -euo pipefail
cd "$(dirname "$0")"
host=${HOST:-host}
command -v "$host" >/dev/null || { echo "build: 'host' is not on the PATH (or set HOST)" >&2; exit 2; }

cargo test --quiet
cargo build --quiet --release --target wasm32-wasip2
# Wherever cargo puts it (CARGO_TARGET_DIR, a config's build.target-dir): cargo says where.
target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
wasm=${target:-target}/wasm32-wasip2/release/{{crate}}.wasm
cp "$wasm" {{name}}.wasm
"$host" check {{name}}.wasm example.yaml

# The status the operator would write, from the children as test/observed.yaml reports them.
out=$("$host" render --no-builtins --plugin {{name}}.wasm --observed test/observed.yaml example.yaml)
grep -q "configMap: hello" <<<"$out" || { echo "build: no status.configMap in:" >&2; echo "$out" >&2; exit 1; }
grep -q "reason: Ready" <<<"$out" || { echo "build: the example is not Ready in:" >&2; echo "$out" >&2; exit 1; }

echo
echo "{{name}}.wasm is ready. Publish it:"
echo "  $host push {{name}}.wasm REGISTRY/plugins/{{name}}:0.1.0"

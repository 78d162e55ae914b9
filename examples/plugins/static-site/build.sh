#!/usr/bin/env bash
# Builds the plugin into a component, checks it as the operator will, tests the status the
# operator would write, and prints how to push it (the layout `host new --lang javascript`
# writes).
set -euo pipefail
cd "$(dirname "$0")"
host=${HOST:-host}
command -v "$host" >/dev/null || { echo "build: 'host' is not on the PATH (or set HOST)" >&2; exit 2; }

[ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error
npm run --silent build
"$host" check static-site.wasm example.yaml

# The status the operator would write, from the children as test/observed.yaml reports them.
out=$("$host" render --no-builtins --plugin static-site.wasm --observed test/observed.yaml example.yaml)
grep -q "url: http://hello.default.svc" <<<"$out" || { echo "build: no status.url in:" >&2; echo "$out" >&2; exit 1; }
grep -q "availableReplicas: 2" <<<"$out" || { echo "build: no status.availableReplicas in:" >&2; echo "$out" >&2; exit 1; }
# Its Ready condition (the status line comes just before the type line) is True.
grep -B1 "type: Ready$" <<<"$out" | grep -q 'status: "True"' || { echo "build: the example is not Ready in:" >&2; echo "$out" >&2; exit 1; }

echo
echo "static-site.wasm is ready. Publish it:"
echo "  $host push static-site.wasm REGISTRY/plugins/static-site:0.1.0"

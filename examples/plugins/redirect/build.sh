#!/usr/bin/env bash
# Builds the plugin into a component, checks it as the operator will, tests the status the
# operator would write, and prints how to push it (the layout `host new --lang python` writes).
set -euo pipefail
cd "$(dirname "$0")"
host=${HOST:-host}
command -v "$host" >/dev/null || { echo "build: 'host' is not on the PATH (or set HOST)" >&2; exit 2; }

if [ ! -x .venv/bin/componentize-py ]; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check componentize-py==0.25.1
fi
.venv/bin/componentize-py --wit-path wit --world plugin componentize --stub-wasi \
  --python-path src app -o redirect.wasm
"$host" check redirect.wasm example.yaml

# The status the operator would write, from the children as test/observed.yaml reports them.
out=$("$host" render --no-builtins --plugin redirect.wasm --observed test/observed.yaml example.yaml)
grep -q "target: https://docs.example.com/" <<<"$out" || { echo "build: no status.target in:" >&2; echo "$out" >&2; exit 1; }
grep -q "availableReplicas: 2" <<<"$out" || { echo "build: no status.availableReplicas in:" >&2; echo "$out" >&2; exit 1; }
# Its Ready condition (the status line comes just before the type line) is True.
grep -B1 "type: Ready$" <<<"$out" | grep -q 'status: "True"' || { echo "build: the example is not Ready in:" >&2; echo "$out" >&2; exit 1; }

echo
echo "redirect.wasm is ready. Publish it:"
echo "  $host push redirect.wasm REGISTRY/plugins/redirect:0.1.0"

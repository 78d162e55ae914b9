#!/usr/bin/env bash
# What each built-in plugin's ./build.sh does (the steps of `host new --lang rust`'s, for a member
# of this workspace): its tests, the component as the host's build embeds it, `host check` with
# its example.yaml, the status the operator would write from the children of test/observed.yaml
# (every example Ready, and each PATTERN in it), and how to push it.
#
#   guests/guest-build.sh NAME [PATTERN...]
set -euo pipefail
name=$1
shift
cd "$(dirname "$0")/$name"
host=${HOST:-host}
command -v "$host" >/dev/null || { echo "build: 'host' is not on the PATH (or set HOST)" >&2; exit 2; }

cargo test --quiet -p "guest-$name"
# As the host's build embeds it: a cdylib of the library, with the workspace's `guest` profile.
cargo rustc --quiet -p "guest-$name" --lib --crate-type cdylib --target wasm32-wasip2 --profile guest
# Wherever cargo puts it (CARGO_TARGET_DIR, a config's build.target-dir): cargo says where.
target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
cp "${target:-../../target}/wasm32-wasip2/guest/guest_${name//-/_}.wasm" "$name.wasm"
"$host" check "$name.wasm" example.yaml

# The status the operator would write, from the children as test/observed.yaml reports them.
out=$("$host" render --no-builtins --plugin "$name.wasm" --observed test/observed.yaml example.yaml)
fail() { echo "build: $1 in:" >&2; echo "$out" >&2; exit 1; }
for pattern in "$@"; do
  grep -qF -- "$pattern" <<<"$out" || fail "no '$pattern'"
done
# Each example's Ready condition (its status line comes just before its type line) is True.
examples=$(grep -c '^kind: ' example.yaml)
ready=$(grep -B1 "type: Ready$" <<<"$out" | grep -c 'status: "True"' || true)
[ "$ready" = "$examples" ] || fail "$ready of the $examples example(s) Ready"

echo
echo "$name.wasm is ready. Publish it:"
echo "  $host push $name.wasm REGISTRY/plugins/$name:0.1.0"

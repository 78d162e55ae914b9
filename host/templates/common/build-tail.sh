"$host" check {{name}}.wasm example.yaml

# The status the operator would write, from the children as test/observed.yaml reports them.
out=$("$host" render --no-builtins --plugin {{name}}.wasm --observed test/observed.yaml example.yaml)
grep -q "configMap: hello" <<<"$out" || { echo "build: no status.configMap in:" >&2; echo "$out" >&2; exit 1; }
# Its Ready condition (the status line comes just before the type line) is True.
grep -B1 "type: Ready$" <<<"$out" | grep -q 'status: "True"' || { echo "build: the example is not Ready in:" >&2; echo "$out" >&2; exit 1; }

echo
echo "{{name}}.wasm is ready. Publish it:"
echo "  $host push {{name}}.wasm REGISTRY/plugins/{{name}}:0.1.0"

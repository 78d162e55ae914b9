
if [ ! -x .venv/bin/componentize-py ]; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check componentize-py=={{componentize_py}}
fi
.venv/bin/componentize-py --wit-path wit --world plugin componentize --stub-wasi \
  --python-path src app -o {{name}}.wasm


cargo test --quiet
cargo build --quiet --release --target wasm32-wasip2
# Wherever cargo puts it (CARGO_TARGET_DIR, a config's build.target-dir): cargo says where.
target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
wasm=${target:-target}/wasm32-wasip2/release/{{crate}}.wasm
cp "$wasm" {{name}}.wasm

// Builds the plugin: SOURCE.js against the contract in WIT_DIR, with every WASI feature of the
// JavaScript engine turned off, so the component imports nothing but the contract's own types
// (pure: no clock, no randomness, no stdio).
//
//   node build.mjs SOURCE.js WIT_DIR OUT.wasm
import { componentize } from "@bytecodealliance/componentize-js";
import { writeFile } from "node:fs/promises";

const [source, wit, out] = process.argv.slice(2);
if (!out) {
  console.error("usage: node build.mjs SOURCE.js WIT_DIR OUT.wasm");
  process.exit(2);
}
const { component } = await componentize({
  sourcePath: source,
  witPath: wit,
  worldName: "plugin",
  disableFeatures: ["random", "stdio", "clocks", "http", "fetch-event"],
});
await writeFile(out, component);
console.error(`wrote ${out} (${component.length} bytes)`);

//! Builds the test plugins and exports their paths.
//!
//! The Rust guests are built by `guest-build`. The component with several memories cannot be
//! written in Rust (a Rust guest has one linear memory), so it is assembled here from
//! `several-memories.wat`.

use std::path::{Path, PathBuf};

fn main() {
    let wasm = guest_build::build(&["guest-hostile", "guest-incompatible", "guest-contract-1-0"]);
    println!("cargo:rustc-env=HOSTILE_WASM={}", wasm[0].display());
    println!("cargo:rustc-env=INCOMPATIBLE_WASM={}", wasm[1].display());
    println!("cargo:rustc-env=CONTRACT_1_0_WASM={}", wasm[2].display());
    let next = guest_build::build_variant(&["guest-hostile"], &["next-version"], "next");
    println!("cargo:rustc-env=HOSTILE_NEXT_WASM={}", next[0].display());
    let climbing = guest_build::build_variant(&["guest-hostile"], &["climbing-plural"], "climbing");
    println!(
        "cargo:rustc-env=HOSTILE_CLIMBING_WASM={}",
        climbing[0].display()
    );
    let several = several_memories(&guest_build::workspace_root());
    println!(
        "cargo:rustc-env=SEVERAL_MEMORIES_WASM={}",
        several.display()
    );
}

/// The second core module: one 40 MiB memory, nothing else.
const SECOND_MEMORY: &str = "(module (memory 640))";

/// A plugin component with two core modules of one 40 MiB memory each: the module of
/// `several-memories.wat`, made a component of the `plugin` world by wit-component, and
/// [`SECOND_MEMORY`], appended with an instantiation that nothing uses (the host instantiates it
/// all the same, memory included).
fn several_memories(root: &Path) -> PathBuf {
    // Read when the script runs, not when it was compiled: a build script compiled for a clone
    // elsewhere may be reused from a shared target directory.
    let manifest_dir =
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let source = Path::new(&manifest_dir).join("several-memories.wat");
    println!("cargo:rerun-if-changed={}", source.display());
    let mut module = wat::parse_file(&source).expect("several-memories.wat parses");

    let mut resolve = wit_parser::Resolve::default();
    // Contract 1.0 (the frozen WIT of the 1.0 test guest): its world is what the module's
    // exports are made for, and a 1.1 host loads it as it loads every 1.0 plugin.
    let (package, _) = resolve
        .push_path(root.join("tests/guests/contract-1-0/wit"))
        .expect("the contract 1.0 WIT parses");
    let world = resolve
        .select_world(&[package], Some("plugin"))
        .expect("wit/ has the plugin world");
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
    )
    .expect("the world embeds");
    let mut component = wit_component::ComponentEncoder::default()
        .module(&module)
        .expect("the module matches the plugin world")
        .validate(true)
        .encode()
        .expect("the component encodes");

    // Appended sections take the next free indices, so nothing already in the component moves.
    let second = wat::parse_str(SECOND_MEMORY).expect("the second module parses");
    let mut extra = wasm_encoder::Component::new();
    extra.section(&wasm_encoder::RawSection {
        id: wasm_encoder::ComponentSectionId::CoreModule.into(),
        data: &second,
    });
    let mut instances = wasm_encoder::InstanceSection::new();
    instances.instantiate(
        core_modules(&component),
        std::iter::empty::<(&str, wasm_encoder::ModuleArg)>(),
    );
    extra.section(&instances);
    let extra = extra.finish();
    // Drop the appended component's own preamble (magic and version, 8 bytes).
    component.extend_from_slice(&extra[8..]);
    wasmparser::Validator::new()
        .validate_all(&component)
        .expect("the component with two memories is valid");

    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("run by cargo"))
        .join("several_memories.wasm");
    std::fs::write(&out, component).expect("OUT_DIR is writable");
    out
}

/// How many core modules the component itself defines (not counting those of nested components).
fn core_modules(component: &[u8]) -> u32 {
    let mut depth = 0u32;
    let mut modules = 0;
    for payload in wasmparser::Parser::new(0).parse_all(component) {
        match payload.expect("wit-component's output parses") {
            wasmparser::Payload::ModuleSection { .. } => {
                if depth == 0 {
                    modules += 1;
                }
                depth += 1;
            }
            wasmparser::Payload::ComponentSection { .. } => depth += 1,
            wasmparser::Payload::End(_) => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    modules
}

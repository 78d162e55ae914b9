//! The render benchmark: prints a table, asserts nothing.
//!
//! For each fixture of `tests/data`, the time to render all its resources
//! - natively: the guest library compiled into this binary (the physical limit),
//! - warm: the component on one instance kept across calls,
//! - fresh: a new store and instance per call, the isolation the host uses for every resource,
//!
//! each as a ratio to native; then the time to load a plugin from the compile cache and to
//! compile it without one.
//!
//! Run: `cargo bench -p host --bench render`

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use guest_kit::{Plugin as _, WireResource, render_wire};
use host::documents;
use host::plugin::{BUILTINS, Cache, Limits, Runtime};
use host::registry::Registry;
use host::types::{Context, Resource};
use serde_json::Value;

/// Median time of one call of `f`, over samples of at least 20 ms each.
fn measure(mut f: impl FnMut()) -> Duration {
    for _ in 0..20 {
        f();
    }
    let start = Instant::now();
    let mut calibration = 0u32;
    while start.elapsed() < Duration::from_millis(20) {
        f();
        calibration += 1;
    }
    let per_sample = calibration.max(1);
    let mut samples: Vec<Duration> = (0..15)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..per_sample {
                f();
            }
            t.elapsed() / per_sample
        })
        .collect();
    samples.sort();
    samples[samples.len() / 2]
}

fn micros(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

/// The guest library called directly: a spec already parsed, objects as values.
fn library(r: &Resource, ctx: &Context, plugin: &str) -> Vec<Value> {
    match plugin {
        "service" => guest_service::ServicePlugin::render(r, ctx),
        "datastore" => guest_datastore::DatastorePlugin::render(r, ctx),
        "kvcluster" => guest_kvcluster::KvClusterPlugin::render(r, ctx),
        other => panic!("no native library for {other}"),
    }
    .expect("fixtures render")
}

/// The guest's `render` export compiled natively: the same library behind the same contract as
/// the component (the spec as JSON text in, the manifests as JSON texts out), so the only
/// difference from the component is WebAssembly and the sandbox.
fn native(r: &Resource, ctx: &Context, plugin: &str) -> Vec<String> {
    let wire = WireResource::from_resource(r);
    match plugin {
        "service" => render_wire::<guest_service::ServicePlugin>(wire, ctx),
        "datastore" => render_wire::<guest_datastore::DatastorePlugin>(wire, ctx),
        "kvcluster" => render_wire::<guest_kvcluster::KvClusterPlugin>(wire, ctx),
        other => panic!("no native library for {other}"),
    }
    .expect("fixtures render")
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let cache_dir = tempfile::tempdir().unwrap();
    let ctx = Context::default();
    let runtime = Runtime::new(Limits::default(), Some(Cache::new(cache_dir.path()))).unwrap();
    let registry = Registry::load(&runtime, ctx.clone(), true, &[]).unwrap();

    let mut fixtures: Vec<PathBuf> = std::fs::read_dir(root.join("tests/data"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    fixtures.sort();

    println!("## Render (µs per fixture; every resource in the file)\n");
    println!(
        "| fixture | resources | library | native | warm instance | ratio | fresh instance | ratio | host parse |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let (mut warm_ratios, mut fresh_ratios, mut end_to_end) = (Vec::new(), Vec::new(), Vec::new());
    // One resource per plugin, for timing a load followed by its first render.
    let mut sample: std::collections::BTreeMap<String, Resource> = Default::default();
    for path in &fixtures {
        let text = std::fs::read_to_string(path).unwrap();
        let resources: Vec<Resource> = documents::parse("bench", &text)
            .unwrap()
            .iter()
            .map(|d| documents::resource(&d.value).unwrap())
            .collect();
        let plugins: Vec<_> = resources
            .iter()
            .map(|r| registry.lookup(&r.api_version, &r.kind).unwrap().0.clone())
            .collect();
        let mut sessions: Vec<_> = plugins.iter().map(|p| p.session().unwrap()).collect();
        for (r, p) in resources.iter().zip(&plugins) {
            sample
                .entry(p.name().to_owned())
                .or_insert_with(|| r.clone());
        }

        // The component must give the native export's bytes, or the comparison means nothing.
        for ((r, p), s) in resources.iter().zip(&plugins).zip(sessions.iter_mut()) {
            let native = native(r, &ctx, p.name());
            assert_eq!(s.render_text(r, &ctx).unwrap(), native, "{}", r.name);
            assert_eq!(p.render_text(r, &ctx).unwrap(), native, "{}", r.name);
        }

        let t_library = measure(|| {
            for (r, p) in resources.iter().zip(&plugins) {
                black_box(library(r, &ctx, p.name()));
            }
        });
        let t_native = measure(|| {
            for (r, p) in resources.iter().zip(&plugins) {
                black_box(native(r, &ctx, p.name()));
            }
        });
        let t_warm = measure(|| {
            for (r, s) in resources.iter().zip(sessions.iter_mut()) {
                black_box(s.render_text(r, &ctx).unwrap());
            }
        });
        let t_fresh = measure(|| {
            for (r, p) in resources.iter().zip(&plugins) {
                black_box(p.render_text(r, &ctx).unwrap());
            }
        });
        let texts: Vec<Vec<String>> = resources
            .iter()
            .zip(&plugins)
            .map(|(r, p)| native(r, &ctx, p.name()))
            .collect();
        let t_parse = measure(|| {
            for manifests in &texts {
                for m in manifests {
                    black_box(serde_json::from_str::<Value>(m).unwrap());
                }
            }
        });
        let warm = t_warm.as_secs_f64() / t_native.as_secs_f64();
        let fresh = t_fresh.as_secs_f64() / t_native.as_secs_f64();
        warm_ratios.push(warm);
        fresh_ratios.push(fresh);
        end_to_end.push((t_fresh + t_parse).as_secs_f64() / t_library.as_secs_f64());
        println!(
            "| {} | {} | {} | {} | {} | {warm:.2}× | {} | {fresh:.2}× | {} |",
            path.file_name().unwrap().to_string_lossy(),
            resources.len(),
            micros(t_library),
            micros(t_native),
            micros(t_warm),
            micros(t_fresh),
            micros(t_parse),
        );
    }
    let geomean = |v: &[f64]| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp();
    println!(
        "| **geometric mean** | | | | | **{:.2}×** (target ≤ 1.3×) | | **{:.2}×** (target ≤ 3×) | |",
        geomean(&warm_ratios),
        geomean(&fresh_ratios)
    );
    println!(
        "\nlibrary: the guest library called directly (spec already parsed, objects as values). \
         native: the guest's render export compiled natively (spec as JSON text in, manifests as JSON texts out), \
         the baseline of both ratios. host parse: turning the manifests into values, which the host does after \
         any plugin. Fresh instance plus host parse against library, geometric mean: {:.2}×.",
        geomean(&end_to_end)
    );

    println!("\n## Plugin load (ms)\n");
    println!(
        "| plugin | wasm size | built-in, from cache | pulled by digest, from cache | wasmtime's deserialize alone (the floor) | by digest / floor | as a file, from cache | built-in, from cache, then one render | render alone | describe() call | first load (compile, describe) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    // The built-ins as files too, written now and left to settle: a file's digest recorded in
    // the same instant as its last change is not trusted (`Cache::file_digest`).
    let files = tempfile::tempdir().unwrap();
    for b in BUILTINS {
        std::fs::write(files.path().join(b.name), b.wasm).unwrap();
    }
    std::thread::sleep(Duration::from_millis(2100));
    for b in BUILTINS {
        // The first load fills the cache (compiled component and description).
        let dir = tempfile::tempdir().unwrap();
        let fresh_cache = Runtime::new(Limits::default(), Some(Cache::new(dir.path()))).unwrap();
        let start = Instant::now();
        black_box(fresh_cache.load_builtin(&b, &ctx).unwrap());
        let first = start.elapsed();
        let builtin = measure(|| {
            black_box(fresh_cache.load_builtin(&b, &ctx).unwrap());
        });
        let path = files.path().join(b.name);
        fresh_cache.load_file(&path, &ctx).unwrap();
        let file = measure(|| {
            black_box(fresh_cache.load_file(&path, &ctx).unwrap());
        });
        let digest = by_digest(&fresh_cache, b.wasm, &ctx);
        let floor = floor(&fresh_cache, b.sha256);
        let r = &sample[b.name];
        let load_and_render = measure(|| {
            let plugin = fresh_cache.load_builtin(&b, &ctx).unwrap();
            black_box(plugin.render_text(r, &ctx).unwrap());
        });
        let plugin = fresh_cache.load_builtin(&b, &ctx).unwrap();
        assert!(plugin.from_cache());
        let render = measure(|| {
            black_box(plugin.render_text(r, &ctx).unwrap());
        });
        let describe = measure(|| {
            black_box(plugin.describe(&ctx).unwrap());
        });
        let ms = |d: Duration| format!("{:.3}", d.as_secs_f64() * 1e3);
        println!(
            "| {} | {} KiB | {} (target ≤ 1) | {} (target ≤ 1) | {} | {:.2}× | {} | {} | {} | {} | {:.0} |",
            b.name,
            b.wasm.len() / 1024,
            ms(builtin),
            ms(digest),
            ms(floor),
            digest.as_secs_f64() / floor.as_secs_f64(),
            ms(file),
            ms(load_and_render),
            ms(render),
            ms(describe),
            first.as_secs_f64() * 1e3
        );
    }
    // The example plugins in interpreted languages, each an interpreter and its script
    // snapshotted into one component: JavaScript (componentize-js, scripts/js-plugin) and
    // Python (componentize-py, scripts/py-plugin). The same measures.
    let interpreted = interpreted();
    // Left to settle as the built-ins above, in case a script has just built them.
    std::thread::sleep(Duration::from_millis(2100));
    for (label, built, example) in interpreted {
        let path = match built {
            Ok(path) => path,
            Err(e) => {
                println!("| {label} | not built: {e} | | | | | | | | | |");
                continue;
            }
        };
        let wasm = std::fs::read(&path).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let fresh_cache = Runtime::new(Limits::default(), Some(Cache::new(dir.path()))).unwrap();
        let start = Instant::now();
        black_box(fresh_cache.load_file(&path, &ctx).unwrap());
        let first = start.elapsed();
        let file = measure(|| {
            black_box(fresh_cache.load_file(&path, &ctx).unwrap());
        });
        let digest = by_digest(&fresh_cache, &wasm, &ctx);
        let floor = floor(&fresh_cache, &host::units::sha256_hex(&wasm));
        let r = example_resource(&root.join(example));
        let load_and_render = measure(|| {
            let plugin = fresh_cache.load_file(&path, &ctx).unwrap();
            black_box(plugin.render_text(&r, &ctx).unwrap());
        });
        let plugin = fresh_cache.load_file(&path, &ctx).unwrap();
        let render = measure(|| {
            black_box(plugin.render_text(&r, &ctx).unwrap());
        });
        let describe = measure(|| {
            black_box(plugin.describe(&ctx).unwrap());
        });
        let ms = |d: Duration| format!("{:.3}", d.as_secs_f64() * 1e3);
        println!(
            "| {label} | {} KiB | | {} (target ≤ 1) | {} | {:.2}× | {} | {} | {} | {} | {:.0} |",
            wasm.len() / 1024,
            ms(digest),
            ms(floor),
            digest.as_secs_f64() / floor.as_secs_f64(),
            ms(file),
            ms(load_and_render),
            ms(render),
            ms(describe),
            first.as_secs_f64() * 1e3
        );
    }
    println!(
        "\nA load from the cache maps the compiled component, links it (instance-pre) and reads the description \
         `describe()` gave under the same context the first time; a file is known by the digest the cache recorded \
         for it when `stat` says it has not changed since (else it is read and hashed), a built-in was hashed when the host was built, and a plugin pulled by digest is known by its layer's digest: \
         its manifest is read from the store of pulled plugins and checked, its layer neither read nor hashed. The floor is \
         wasmtime's own `Component::deserialize_file` of the same compiled file in the same engine, nothing of the host's around it. The component is mapped from the file, so its code pages are read \
         in as a render first runs them: the column with one render shows that cost with the load. The first load \
         compiles and calls describe() in a fresh instance."
    );
    memory(&ctx, &sample);
}

/// The time wasmtime alone takes to make the component whose sha256 is `sha256` from the
/// compiled file `runtime`'s cache holds (mapped, its metadata deserialized, its types
/// registered): what any load from the cache costs at least, whatever the host does around it.
fn floor(runtime: &Runtime, sha256: &str) -> Duration {
    assert!(runtime.deserialize_cached(sha256), "compiled before");
    measure(|| {
        black_box(runtime.deserialize_cached(sha256));
    })
}

/// The time to load `wasm` as a plugin pulled by digest whose compiled form `runtime`'s cache
/// holds: the store's manifest read and checked, the layer located, the compiled component
/// loaded by the layer's digest.
fn by_digest(runtime: &Runtime, wasm: &[u8], ctx: &Context) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let store = host::oci::Store::new(dir.path());
    let (_, manifest) = host::oci::artifact(wasm, &Default::default());
    let manifest_digest = host::oci::digest(&manifest);
    store.put(&manifest_digest, &manifest, wasm).unwrap();
    let reference =
        host::oci::Reference::parse(&format!("registry.example/plugins/p@{manifest_digest}"))
            .unwrap();
    let load = || {
        let kept = host::oci::kept(&reference, &store).expect("kept by digest");
        runtime
            .load_by_digest(
                &kept.sha256,
                kept.size,
                || unreachable!("compiled before"),
                "p",
                ctx,
            )
            .unwrap()
    };
    assert!(load().from_cache());
    measure(|| {
        black_box(load());
    })
}

/// The example plugins in interpreted languages: a label, the component (built by its script)
/// and an example resource of its Kind.
fn interpreted() -> Vec<(&'static str, testenv::Result<PathBuf>, &'static str)> {
    vec![
        (
            "static-site (JavaScript)",
            testenv::static_site_plugin(),
            "examples/plugins/static-site/example.yaml",
        ),
        (
            "redirect (Python)",
            testenv::redirect_plugin(),
            "examples/plugins/redirect/example.yaml",
        ),
    ]
}

/// The first resource of the YAML file at `path`.
fn example_resource(path: &Path) -> Resource {
    let text = std::fs::read_to_string(path).unwrap();
    let docs = documents::parse(&path.display().to_string(), &text).unwrap();
    documents::resource(&docs[0].value).unwrap()
}

/// The smallest memory cap (`--plugin-memory`, whole MiB) under which each plugin loads and
/// renders its example, found by bisection with the host's own limiter: what a plugin of each
/// language needs, against the 64 MiB default.
fn memory(ctx: &Context, sample: &std::collections::BTreeMap<String, Resource>) {
    println!("\n## Memory a render needs (MiB)\n");
    println!("| plugin | smallest --plugin-memory that loads and renders its example | default |");
    println!("|---|---:|---:|");
    let fits = |wasm: &[u8], r: &Resource, mib: usize| {
        let limits = Limits {
            memory_bytes: mib << 20,
            ..Limits::default()
        };
        let Ok(runtime) = Runtime::new(limits, None) else {
            return false;
        };
        runtime
            .load(wasm, "p", ctx)
            .is_ok_and(|plugin| plugin.render_text(r, ctx).is_ok())
    };
    let smallest = |wasm: &[u8], r: &Resource| {
        let (mut low, mut high) = (0usize, 64usize);
        if !fits(wasm, r, high) {
            return None;
        }
        // low does not fit (0 MiB), high does.
        while high - low > 1 {
            let mid = (low + high) / 2;
            if fits(wasm, r, mid) {
                high = mid;
            } else {
                low = mid;
            }
        }
        Some(high)
    };
    let show = |label: &str, found: Option<usize>| match found {
        Some(mib) => println!("| {label} | {mib} | 64 |"),
        None => println!("| {label} | more than 64 | 64 |"),
    };
    for b in BUILTINS {
        show(b.name, smallest(b.wasm, &sample[b.name]));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    for (label, built, example) in interpreted() {
        match built {
            Ok(path) => {
                let wasm = std::fs::read(path).unwrap();
                show(
                    label,
                    smallest(&wasm, &example_resource(&root.join(example))),
                );
            }
            Err(e) => println!("| {label} | not built: {e} | |"),
        }
    }
}

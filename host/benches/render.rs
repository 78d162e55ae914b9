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

use guest_kit::Plugin as _;
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

fn native(r: &Resource, ctx: &Context, plugin: &str) -> Vec<Value> {
    match plugin {
        "service" => guest_service::ServicePlugin::render(r, ctx),
        "datastore" => guest_datastore::DatastorePlugin::render(r, ctx),
        "kvcluster" => guest_kvcluster::KvClusterPlugin::render(r, ctx),
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
    println!("| fixture | resources | native | warm instance | ratio | fresh instance | ratio |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let (mut warm_ratios, mut fresh_ratios) = (Vec::new(), Vec::new());
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

        let t_native = measure(|| {
            for (r, p) in resources.iter().zip(&plugins) {
                black_box(native(r, &ctx, p.name()));
            }
        });
        let t_warm = measure(|| {
            for (r, s) in resources.iter().zip(sessions.iter_mut()) {
                black_box(s.render(r, &ctx).unwrap());
            }
        });
        let t_fresh = measure(|| {
            for (r, p) in resources.iter().zip(&plugins) {
                black_box(p.render(r, &ctx).unwrap());
            }
        });
        let warm = t_warm.as_secs_f64() / t_native.as_secs_f64();
        let fresh = t_fresh.as_secs_f64() / t_native.as_secs_f64();
        warm_ratios.push(warm);
        fresh_ratios.push(fresh);
        println!(
            "| {} | {} | {} | {} | {warm:.2}× | {} | {fresh:.2}× |",
            path.file_name().unwrap().to_string_lossy(),
            resources.len(),
            micros(t_native),
            micros(t_warm),
            micros(t_fresh),
        );
    }
    let geomean = |v: &[f64]| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp();
    println!(
        "| **geometric mean** | | | | **{:.2}×** (target ≤ 1.3×) | | **{:.2}×** (target ≤ 3×) |",
        geomean(&warm_ratios),
        geomean(&fresh_ratios)
    );

    println!("\n## Plugin load (ms)\n");
    println!(
        "| plugin | wasm size | load from compile cache | of which describe() | load without describe() | compile without cache |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let uncached = Runtime::new(Limits::default(), None).unwrap();
    for b in BUILTINS {
        let cached = measure(|| {
            black_box(runtime.load(b.wasm, b.name, &ctx).unwrap());
        });
        let plugin = runtime.load(b.wasm, b.name, &ctx).unwrap();
        let describe = measure(|| {
            black_box(plugin.describe(&ctx).unwrap());
        });
        let start = Instant::now();
        black_box(uncached.load(b.wasm, b.name, &ctx).unwrap());
        let compile = start.elapsed();
        let ms = |d: Duration| format!("{:.3}", d.as_secs_f64() * 1e3);
        println!(
            "| {} | {} KiB | {} | {} | {} (target ≤ 1) | {:.0} |",
            b.name,
            b.wasm.len() / 1024,
            ms(cached),
            ms(describe),
            ms(cached.saturating_sub(describe)),
            compile.as_secs_f64() * 1e3
        );
    }
    println!(
        "\nLoad from the compile cache reads the artifact, deserializes it, links it (instance-pre) and calls \
         describe() once in a fresh instance; the column without describe() is the component load alone."
    );
}

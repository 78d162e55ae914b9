//! The driver: a supervisor that makes inputs, writes each to a file and hands its path to a
//! worker process, which checks it and answers with one line of JSON.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use host::documents;
use host::plugin::{Cache, Limits, Runtime, default_cache_dir};
use host::registry::Registry;
use host::types::Context;
use serde_json::{Value, json};

use crate::check::{self, Failure, Outcome};
use crate::rng::Rng;
use crate::spec::{self, Kind};
use crate::text;

/// The repository root (this crate is `tests/fuzz`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Fuzzes `host render`: arbitrary specs for every Kind, arbitrary YAML and JSON.
#[derive(Debug, Parser)]
#[command(name = "render-fuzz", version, about)]
pub struct Args {
    /// How long to fuzz, in seconds.
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// The run's seed (default: from the clock). It is printed, so a run can be repeated.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Make and check only case N of the seed, as the run that found it did.
    #[arg(long, requires = "seed", value_name = "N")]
    pub case: Option<u64>,
    /// Where an input that fails is written, named after the failure.
    #[arg(long, value_name = "DIR", default_value_os_t = root().join("tests/fuzz/corpus"))]
    pub corpus: PathBuf,
    /// A case that takes longer than this many milliseconds is a hang.
    #[arg(long, default_value_t = 2000, value_name = "MS")]
    pub case_timeout_ms: u64,
    /// Go on after a failure (keeping at most three inputs per kind of failure); exit 1 at the end.
    #[arg(long)]
    pub keep_going: bool,
    /// Check these files (directories: every file in them) instead of fuzzing; exit 1 if any fails.
    #[arg(long, num_args = 1.., value_name = "PATH")]
    pub replay: Vec<PathBuf>,
    /// Also judge objects rendered from specs whose passed-through Kubernetes fields are not
    /// valid values of their Rust types (the host refuses those its schema check catches, such
    /// as `int32` ranges; others would fail at the API server, naming the child's field).
    #[arg(long)]
    pub strict: bool,
    /// Where compiled plugins are cached (default: the host's default cache directory).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Internal: be the worker, checking the files whose paths arrive on stdin.
    #[arg(long, hide = true)]
    pub worker: bool,
}

impl Args {
    /// Runs as asked: 0 when every input passed, 1 when one failed, 2 when the fuzzer could not
    /// run.
    pub fn run(self) -> ExitCode {
        let result = if self.worker {
            worker(&self)
        } else if !self.replay.is_empty() {
            replay(&self)
        } else {
            fuzz(&self)
        };
        match result {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("render-fuzz: {e}");
                ExitCode::from(2)
            }
        }
    }
}

/// The built-in plugins, as `host render` loads them (default limits, the compile cache).
pub fn registry(cache_dir: Option<&Path>) -> Result<Registry, host::Error> {
    let cache = cache_dir
        .map(Path::to_path_buf)
        .or_else(default_cache_dir)
        .map(Cache::new);
    let runtime = Runtime::new(Limits::default(), cache)?;
    Registry::load(&runtime, Context::default(), true, &[])
}

fn worker(args: &Args) -> Result<bool, String> {
    let registry = registry(args.cache_dir.as_deref()).map_err(|e| e.to_string())?;
    let checker = check::Checker::new(registry, args.strict);
    let say = |v: Value| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{v}")
            .and_then(|()| out.flush())
            .map_err(|e| e.to_string())
    };
    say(json!({ "ready": true }))?;
    for line in std::io::stdin().lock().lines() {
        let path = line.map_err(|e| e.to_string())?;
        let mut progress = || {
            // The supervisor's timeout counts from the last step; a closed pipe ends us anyway.
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{{\"step\":true}}").and_then(|()| out.flush());
        };
        let result = checker.file(&path, &mut progress);
        say(match result {
            Ok(o) => {
                json!({ "ok": [o.refused_file, o.documents, o.rendered, o.refused, o.judged] })
            }
            Err(f) => json!({ "fail": [f.kind, f.detail] }),
        })?;
    }
    Ok(true)
}

/// The worker process, and the lines it answers with.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    replies: Receiver<String>,
    /// The longest a step took so far (see [`Worker::check`]).
    slowest: Duration,
}

impl Worker {
    fn spawn(args: &Args) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find myself: {e}"))?;
        let mut cmd = Command::new(exe);
        cmd.arg("--worker")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(dir) = &args.cache_dir {
            cmd.arg("--cache-dir").arg(dir);
        }
        if args.strict {
            cmd.arg("--strict");
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start the worker: {e}"))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let (tx, replies) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut worker = Self {
            child,
            stdin,
            replies,
            slowest: Duration::ZERO,
        };
        // Compiling the plugins on a cold cache takes a while; loading them from it, milliseconds.
        match worker.replies.recv_timeout(Duration::from_secs(600)) {
            Ok(line) if line.contains("ready") => Ok(worker),
            _ => {
                worker.stop();
                Err("the worker did not start (see above)".into())
            }
        }
    }

    /// Checks one file: the worker's verdict, or a hang or crash of its own.
    fn check(&mut self, path: &Path, timeout: Duration) -> Result<Outcome, Failure> {
        let sent = writeln!(self.stdin, "{}", path.display()).and_then(|()| self.stdin.flush());
        let reply = match sent {
            // Each step (parsing the file, each document) has `timeout` to itself.
            // The whole file has thirty times that.
            Ok(()) => {
                let start = Instant::now();
                let mut step = Instant::now();
                loop {
                    let reply = self.replies.recv_timeout(timeout);
                    self.slowest = self.slowest.max(step.elapsed());
                    step = Instant::now();
                    match reply {
                        Ok(line) if line.contains("\"step\"") && start.elapsed() < timeout * 30 => {
                            continue;
                        }
                        Ok(line) if line.contains("\"step\"") => {
                            break Err(RecvTimeoutError::Timeout);
                        }
                        other => break other,
                    }
                }
            }
            Err(_) => Err(RecvTimeoutError::Disconnected),
        };
        match reply {
            Ok(line) => parse_reply(&line),
            Err(RecvTimeoutError::Timeout) => {
                self.stop();
                Err(Failure {
                    kind: "hang".into(),
                    detail: format!(
                        "one step (parsing the file, or one document) took over {timeout:?}, or the whole file over {:?}",
                        timeout * 30
                    ),
                })
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
                Err(Failure {
                    kind: "crash".into(),
                    detail: format!("the worker died ({status}); its stderr is above"),
                })
            }
        }
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
    }
}

fn parse_reply(line: &str) -> Result<Outcome, Failure> {
    let v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
    let n = |i: usize| v["ok"][i].as_u64().unwrap_or(0) as usize;
    if v.get("ok").is_some() {
        Ok(Outcome {
            refused_file: v["ok"][0].as_bool().unwrap_or(false),
            documents: n(1),
            rendered: n(2),
            refused: n(3),
            judged: n(4),
        })
    } else {
        Err(Failure {
            kind: v["fail"][0].as_str().unwrap_or("worker").to_owned(),
            detail: v["fail"][1]
                .as_str()
                .map_or_else(|| format!("unexpected answer: {line}"), str::to_owned),
        })
    }
}

fn replay(args: &Args) -> Result<bool, String> {
    let mut files = Vec::new();
    for p in &args.replay {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| format!("{}: {e}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(p.clone());
        }
    }
    let timeout = Duration::from_millis(args.case_timeout_ms);
    let mut worker = Worker::spawn(args)?;
    let mut passed = true;
    for file in &files {
        if !worker.alive() {
            worker = Worker::spawn(args)?;
        }
        match worker.check(file, timeout) {
            Ok(o) => println!("ok    {} ({})", file.display(), summary(&o)),
            Err(f) => {
                passed = false;
                println!("FAIL  {}: {}: {}", file.display(), f.kind, f.detail);
            }
        }
    }
    println!("{} file(s) replayed", files.len());
    Ok(passed)
}

fn summary(o: &Outcome) -> String {
    if o.refused_file {
        "file refused".into()
    } else {
        format!(
            "{} document(s): {} rendered ({} judged as Kubernetes objects), {} refused",
            o.documents, o.rendered, o.judged, o.refused
        )
    }
}

/// One generated input.
struct Case {
    bytes: Vec<u8>,
    ext: &'static str,
    origin: String,
}

/// What inputs are made from: the Kinds and their schemas, the fixtures as values and as text.
struct Seeds {
    kinds: Vec<Kind>,
    fixtures: Vec<Value>,
    texts: Vec<(Vec<u8>, &'static str)>,
}

fn seeds(registry: &Registry) -> Result<Seeds, String> {
    let mut fixtures = Vec::new();
    let mut texts = Vec::new();
    for dir in ["tests/data", "examples"] {
        let dir = root().join(dir);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
            let docs =
                documents::parse(&f.display().to_string(), &text).map_err(|e| e.to_string())?;
            let values: Vec<Value> = docs.into_iter().map(|d| d.value).collect();
            texts.push((text.into_bytes(), "yaml"));
            for v in &values {
                texts.push((v.to_string().into_bytes(), "json"));
                texts.push((
                    serde_json::to_string_pretty(v)
                        .unwrap_or_default()
                        .into_bytes(),
                    "json",
                ));
            }
            texts.push((
                Value::Array(values.clone()).to_string().into_bytes(),
                "json",
            ));
            fixtures.extend(values);
        }
    }
    let kinds = registry
        .kinds()
        .map(|(_, k)| {
            let mut schema = k.spec_schema.clone();
            // The CRD's schema: Kubernetes types inlined where the plugin names them.
            if host::kube_schema::inline_refs(&mut schema).is_err() {
                schema = k.spec_schema.clone();
            }
            let version = k.versions.first().cloned().unwrap_or_default();
            let api_version = if k.group.is_empty() {
                version
            } else {
                format!("{}/{version}", k.group)
            };
            Kind {
                fixtures: fixtures
                    .iter()
                    .filter(|f| {
                        f["kind"] == k.kind.as_str() && f["apiVersion"] == api_version.as_str()
                    })
                    .cloned()
                    .collect(),
                api_version,
                kind: k.kind.clone(),
                schema,
            }
        })
        .collect();
    Ok(Seeds {
        kinds,
        fixtures,
        texts,
    })
}

fn make_case(rng: &mut Rng, seeds: &Seeds) -> Case {
    match rng.below(10) {
        0..=4 => {
            let mut docs = vec![spec::resource(rng, &seeds.kinds, &seeds.fixtures)];
            if rng.one_in(10) {
                docs.push(spec::resource(rng, &seeds.kinds, &seeds.fixtures));
            }
            let kind = docs[0]["kind"].as_str().unwrap_or("?").to_owned();
            let value = match rng.below(10) {
                0 => json!({ "apiVersion": "v1", "kind": "List", "items": docs }),
                1 => Value::Array(docs),
                _ => docs.swap_remove(0),
            };
            let bytes = if rng.one_in(3) {
                serde_json::to_string_pretty(&value).unwrap_or_default()
            } else {
                value.to_string()
            };
            Case {
                bytes: bytes.into_bytes(),
                ext: "json",
                origin: format!("a generated {kind}"),
            }
        }
        5..=8 => {
            let (mut bytes, ext) = rng.pick(&seeds.texts).clone();
            let others: Vec<Vec<u8>> = seeds.texts.iter().map(|(t, _)| t.clone()).collect();
            let n = rng.between(1, 5);
            for _ in 0..n {
                text::mutate(rng, &mut bytes, &others);
            }
            Case {
                bytes,
                ext,
                origin: format!("a fixture's {ext} with {n} mutation(s)"),
            }
        }
        _ => Case {
            bytes: text::generate(rng),
            ext: "yaml",
            origin: "a generated document".into(),
        },
    }
}

/// The failing case, shrunk (for at most a minute) while it fails the same way.
fn shrink(
    worker: &mut Worker,
    workdir: &Path,
    case: Case,
    failure: &Failure,
    timeout: Duration,
    args: &Args,
) -> Case {
    let path = workdir.join(format!("shrinking.{}", case.ext));
    let mut fails = |bytes: &[u8]| {
        if std::fs::write(&path, bytes).is_err() {
            return false;
        }
        if !worker.alive() {
            match Worker::spawn(args) {
                Ok(w) => *worker = w,
                Err(_) => return false,
            }
        }
        matches!(worker.check(&path, timeout), Err(f) if f.kind == failure.kind)
    };
    let bytes = crate::minimize::minimize(&case.bytes, Duration::from_secs(60), &mut fails);
    Case { bytes, ..case }
}

/// FNV-1a, to name corpus files after their content.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn save(corpus: &Path, failure: &Failure, case: &Case) -> Result<PathBuf, String> {
    std::fs::create_dir_all(corpus).map_err(|e| format!("{}: {e}", corpus.display()))?;
    let path = corpus.join(format!(
        "{}-{:016x}.{}",
        failure.kind,
        fnv(&case.bytes),
        case.ext
    ));
    std::fs::write(&path, &case.bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

#[derive(Debug, Default)]
struct Tally {
    cases: u64,
    files_refused: u64,
    documents: u64,
    rendered: u64,
    judged: u64,
    refused: u64,
    failures: u64,
}

impl Tally {
    fn line(&self, elapsed: Duration, slowest: Duration) -> String {
        format!(
            "{:.0} s: {} cases ({:.0}/s): {} files refused, {} documents, {} resources rendered ({} judged as Kubernetes objects), {} refused; slowest step {} ms; {} failure(s)",
            elapsed.as_secs_f64(),
            self.cases,
            self.cases as f64 / elapsed.as_secs_f64().max(1e-9),
            self.files_refused,
            self.documents,
            self.rendered,
            self.judged,
            self.refused,
            slowest.as_millis(),
            self.failures
        )
    }
}

fn fuzz(args: &Args) -> Result<bool, String> {
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let registry = registry(args.cache_dir.as_deref()).map_err(|e| e.to_string())?;
    let seeds = seeds(&registry)?;
    drop(registry);
    let workdir = std::env::temp_dir().join(format!("render-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&workdir).map_err(|e| format!("{}: {e}", workdir.display()))?;
    let timeout = Duration::from_millis(args.case_timeout_ms);
    let (cases, budget): (Box<dyn Iterator<Item = u64>>, _) = match args.case {
        Some(n) => (Box::new(std::iter::once(n)), None),
        None => (Box::new(0..), Some(Duration::from_secs(args.seconds))),
    };
    println!(
        "render-fuzz: seed {seed}, {}, {} Kinds, failures to {}",
        budget.map_or_else(|| "one case".to_owned(), |b| format!("{} s", b.as_secs())),
        seeds.kinds.len(),
        args.corpus.display()
    );
    let start = Instant::now();
    let mut worker = Worker::spawn(args)?;
    let mut tally = Tally::default();
    let mut kept: BTreeMap<String, usize> = BTreeMap::new();
    let mut last_report = Instant::now();
    let mut slowest = Duration::ZERO;
    for n in cases {
        if budget.is_some_and(|b| start.elapsed() >= b) {
            break;
        }
        let case = make_case(&mut Rng::for_case(seed, n), &seeds);
        let path = workdir.join(format!("input.{}", case.ext));
        std::fs::write(&path, &case.bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        if !worker.alive() {
            slowest = slowest.max(worker.slowest);
            worker = Worker::spawn(args)?;
        }
        tally.cases += 1;
        match worker.check(&path, timeout) {
            Ok(o) => {
                tally.files_refused += u64::from(o.refused_file);
                tally.documents += o.documents as u64;
                tally.rendered += o.rendered as u64;
                tally.judged += o.judged as u64;
                tally.refused += o.refused as u64;
                if args.case.is_some() {
                    println!("case {n} ({}): passed, {}", case.origin, summary(&o));
                    println!("  input: {}", path.display());
                }
            }
            Err(f) => {
                tally.failures += 1;
                let count = kept.entry(f.kind.clone()).or_default();
                *count += 1;
                if *count <= 3 {
                    let case = shrink(&mut worker, &workdir, case, &f, timeout, args);
                    let saved = save(&args.corpus, &f, &case)?;
                    println!("FAILED: {}: {}", f.kind, f.detail);
                    println!("  case {n} of seed {seed} ({})", case.origin);
                    println!("  input: {}", saved.display());
                    println!(
                        "  replay: cargo run -p render-fuzz -- --replay {}",
                        saved.display()
                    );
                    println!("  again:  cargo run -p render-fuzz -- --seed {seed} --case {n}");
                }
                if !args.keep_going {
                    break;
                }
            }
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            println!(
                "  {}",
                tally.line(start.elapsed(), slowest.max(worker.slowest))
            );
            last_report = Instant::now();
        }
    }
    slowest = slowest.max(worker.slowest);
    drop(worker);
    if args.case.is_none() {
        let _ = std::fs::remove_dir_all(&workdir);
    }
    println!(
        "render-fuzz: seed {seed}: {}",
        tally.line(start.elapsed(), slowest)
    );
    Ok(tally.failures == 0)
}

//! One plugin call: a fresh store and instance with no filesystem, network, environment or
//! arguments, a fixed clock, fixed randomness, a memory cap and a deadline.
//!
//! The deadline is an epoch deadline, which wasmtime checks only while wasm code runs: a host
//! call that blocks would outlive it. So no host call given to a plugin may block. Time stands
//! still in the sandbox, and every wait on the monotonic clock is over at once ([`StillTime`]);
//! stdin is closed, stdout discards, stderr is a bounded in-memory pipe (all always ready);
//! sockets cannot be created, name lookups are refused and there are no preopened directories, so
//! no other pollable exists; `poll` on an empty list traps.

use std::time::Duration;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime::{PoolConcurrencyLimitError, ResourceLimiter, Store, Trap};
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};
use wasmtime_wasi::{
    Deterministic, HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView,
    WasiView,
};

use super::PluginError;
use super::bindings::{Instance as Bindings, Pre as PluginPre};
use super::{Limits, TICK};
use crate::error::MAX_ERROR_MESSAGE;
use crate::units::bounded;

/// How many resource handles (pollables, streams) a call may hold at once.
const MAX_HANDLES: usize = 10_000;
/// How much of a plugin's stderr is kept, to explain a panic.
const STDERR_CAPACITY: usize = 16 << 10;
/// The bytes every random source cycles through.
const RANDOM_SEED: [u8; 8] = [0x5e, 0xed, 0x0f, 0x0b, 0x1a, 0xc0, 0xff, 0xee];

/// The state of one call's store.
pub(crate) struct Sandbox {
    wasi: WasiCtx,
    table: ResourceTable,
    memory_cap: usize,
    /// The bytes of all linear memories of the store together: a component may define several
    /// (one per core module), and the cap holds for their sum, not for each.
    memory_total: usize,
    /// The total a refused growth would have reached.
    denied_growth: Option<usize>,
}

impl WasiView for Sandbox {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl ResourceLimiter for Sandbox {
    /// Called for every growth of every memory of the store, and when a memory is created (with
    /// `current` 0 and `desired` its minimum size), so the running sum covers them all. Memories
    /// never shrink. A growth allowed here that then fails in the host (the operating system
    /// refusing memory) stays counted: the count errs on the side of the cap.
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self
            .memory_total
            .saturating_sub(current)
            .saturating_add(desired);
        if total > self.memory_cap {
            self.denied_growth = Some(total);
            return Ok(false);
        }
        self.memory_total = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }
}

/// A clock stopped at the Unix epoch.
struct StoppedClock;

impl HostWallClock for StoppedClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for StoppedClock {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        0
    }
}

/// The monotonic clock plugins get, in place of wasmtime-wasi's: it reads 0, like the WASI
/// context's [`StoppedClock`], and a wait on it (`subscribe-duration`, `subscribe-instant`) is
/// over at once. wasmtime-wasi's own waits in real time, on the host, where the epoch deadline
/// cannot stop it: `std::thread::sleep(Duration::MAX)` would never return.
///
/// A sleep thus returns at once. A guest that waits for the clock to move instead loops in wasm,
/// where the epoch deadline stops it.
struct StillTime<'a>(&'a mut ResourceTable);

/// Names [`StillTime`] to the linker.
struct WithStillTime;

impl HasData for WithStillTime {
    type Data<'a> = StillTime<'a>;
}

/// A wait that is already over.
struct Elapsed;

#[wasmtime_wasi::async_trait]
impl Pollable for Elapsed {
    async fn ready(&mut self) {}
}

impl StillTime<'_> {
    fn elapsed(&mut self) -> wasmtime::Result<Resource<DynPollable>> {
        let wait = self.0.push(Elapsed)?;
        subscribe(self.0, wait)
    }
}

impl monotonic_clock::Host for StillTime<'_> {
    fn now(&mut self) -> wasmtime::Result<monotonic_clock::Instant> {
        Ok(0)
    }

    fn resolution(&mut self) -> wasmtime::Result<monotonic_clock::Duration> {
        Ok(1)
    }

    fn subscribe_instant(
        &mut self,
        _when: monotonic_clock::Instant,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        self.elapsed()
    }

    fn subscribe_duration(
        &mut self,
        _duration: monotonic_clock::Duration,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        self.elapsed()
    }
}

/// Adds WASI to `linker` as plugins get it: wasmtime-wasi's synchronous preview 2, with the
/// monotonic clock replaced by [`StillTime`].
pub(crate) fn add_to_linker(linker: &mut Linker<Sandbox>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)?;
    linker.allow_shadowing(true);
    let added = monotonic_clock::add_to_linker::<Sandbox, WithStillTime>(linker, |s| {
        StillTime(&mut s.table)
    });
    linker.allow_shadowing(false);
    added
}

/// A store for one call (or one session): fresh WASI context, limiter and stderr capture.
pub(crate) fn store(
    engine: &wasmtime::Engine,
    limits: Limits,
) -> (Store<Sandbox>, MemoryOutputPipe) {
    let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
    let wasi = WasiCtxBuilder::new()
        .stderr(stderr.clone())
        .wall_clock(StoppedClock)
        .monotonic_clock(StoppedClock)
        .secure_random(Deterministic::new(RANDOM_SEED.to_vec()))
        .insecure_random(Deterministic::new(RANDOM_SEED.to_vec()))
        .insecure_random_seed(0)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build();
    let state = Sandbox {
        wasi,
        table: {
            // Every handle a guest holds (a clock subscription is two) is host memory outside
            // the linear-memory cap; a render needs a handful.
            let mut table = ResourceTable::new();
            table.set_max_capacity(MAX_HANDLES);
            table
        },
        memory_cap: limits.memory_bytes,
        memory_total: 0,
        denied_growth: None,
    };
    let mut store = Store::new(engine, state);
    store.limiter(|s| s);
    // What the host copies out of the guest in one call (a render's manifests) is bounded by
    // the output cap before it is copied, not after: wasmtime's default would let a guest make
    // the host allocate 128 MiB.
    store.set_hostcall_fuel(limits.hostcall_fuel());
    arm_deadline(&mut store, limits);
    (store, stderr)
}

/// The text wasmtime gives when a guest hands the host more than its hostcall fuel allows (its
/// error type is private).
const FUEL_EXHAUSTED: &str = "fuel allocated for hostcalls has been exhausted";

/// Sets the store's deadline to `limits.deadline` from now.
pub(crate) fn arm_deadline(store: &mut Store<Sandbox>, limits: Limits) {
    let ticks = limits.deadline.as_nanos().div_ceil(TICK.as_nanos()).max(1);
    store.set_epoch_deadline(u64::try_from(ticks).unwrap_or(u64::MAX));
}

/// Runs `f` against a fresh instance of `pre` under `limits`.
pub(crate) fn call<R>(
    pre: &PluginPre,
    engine: &wasmtime::Engine,
    limits: Limits,
    f: impl FnOnce(&Bindings, &mut Store<Sandbox>) -> wasmtime::Result<R>,
) -> Result<R, PluginError> {
    let (mut store, stderr) = store(engine, limits);
    let result = pre
        .instantiate(&mut store)
        .and_then(|instance| f(&instance, &mut store));
    result.map_err(|e| classify(&e, store.data(), &stderr, limits))
}

/// A result of a call made on an existing store, classified like [`call`]'s.
pub(crate) fn check<R>(
    result: wasmtime::Result<R>,
    store: &Store<Sandbox>,
    stderr: &MemoryOutputPipe,
    limits: Limits,
) -> Result<R, PluginError> {
    result.map_err(|e| classify(&e, store.data(), stderr, limits))
}

fn classify(
    e: &wasmtime::Error,
    state: &Sandbox,
    stderr: &MemoryOutputPipe,
    limits: Limits,
) -> PluginError {
    // The pool refuses an instance before any guest code runs; nothing else is known then.
    if e.is::<PoolConcurrencyLimitError>() {
        return PluginError::Busy(format!("{e:#}"));
    }
    if let Some(tried) = state.denied_growth {
        return PluginError::Memory {
            limit: limits.memory_bytes,
            tried,
        };
    }
    if e.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
        return PluginError::Deadline(limits.deadline);
    }
    if format!("{e:#}").contains(FUEL_EXHAUSTED) {
        return PluginError::HandedTooMuch {
            limit: limits.hostcall_fuel(),
        };
    }
    let err = String::from_utf8_lossy(&stderr.contents()).into_owned();
    if let Some(at) = err.find("panicked at") {
        let message = err[at..].lines().take(2).collect::<Vec<_>>().join(": ");
        return PluginError::Panic(bounded(message, MAX_ERROR_MESSAGE));
    }
    // A trap's message carries the wasm backtrace, as deep as the guest's stack.
    PluginError::Trap(bounded(format!("{e:#}"), MAX_ERROR_MESSAGE))
}

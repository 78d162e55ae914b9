//! One plugin call: a fresh store and instance with no filesystem, network, environment or
//! arguments, a fixed clock, fixed randomness, a memory cap and a deadline.

use std::time::Duration;

use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, Store, Trap};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{
    Deterministic, HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView,
    WasiView,
};

use super::bindings::{Plugin as Bindings, PluginPre};
use super::{Limits, TICK};
use crate::error::PluginError;

/// How much of a plugin's stderr is kept, to explain a panic.
const STDERR_CAPACITY: usize = 16 << 10;
/// The bytes every random source cycles through.
const RANDOM_SEED: [u8; 8] = [0x5e, 0xed, 0x0f, 0x0b, 0x1a, 0xc0, 0xff, 0xee];

/// The state of one call's store.
pub(crate) struct Sandbox {
    wasi: WasiCtx,
    table: ResourceTable,
    memory_cap: usize,
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
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_cap {
            self.denied_growth = Some(desired);
            return Ok(false);
        }
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
        table: ResourceTable::new(),
        memory_cap: limits.memory_bytes,
        denied_growth: None,
    };
    let mut store = Store::new(engine, state);
    store.limiter(|s| s);
    arm_deadline(&mut store, limits);
    (store, stderr)
}

/// Sets the store's deadline to `limits.deadline` from now.
pub(crate) fn arm_deadline(store: &mut Store<Sandbox>, limits: Limits) {
    let ticks = limits.deadline.as_nanos().div_ceil(TICK.as_nanos()).max(1);
    store.set_epoch_deadline(u64::try_from(ticks).unwrap_or(u64::MAX));
}

/// Runs `f` against a fresh instance of `pre` under `limits`.
pub(crate) fn call<R>(
    pre: &PluginPre<Sandbox>,
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
    if let Some(tried) = state.denied_growth {
        return PluginError::Memory {
            limit: limits.memory_bytes,
            tried,
        };
    }
    if e.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
        return PluginError::Deadline(limits.deadline);
    }
    let err = String::from_utf8_lossy(&stderr.contents()).into_owned();
    if let Some(at) = err.find("panicked at") {
        let message = err[at..].lines().take(2).collect::<Vec<_>>().join(": ");
        return PluginError::Panic(message);
    }
    PluginError::Trap(format!("{e:#}"))
}

//! A fuzzer for the render path, on stable Rust.
//!
//! It makes input files for `host render` and checks each along the path the command takes
//! ([`check`]): read, parse ([`host::documents`]), build each resource, render it through the
//! built-in plugins ([`host::registry::Registry::render`]), write the manifests. Inputs are:
//!
//! - resources of every Kind the plugins serve, with specs generated from the Kind's own schema
//!   or the fixtures of `tests/data` mutated ([`spec`]);
//! - the fixtures' YAML and JSON damaged line by line and byte by byte, and documents built to
//!   hurt a parser ([`text`]).
//!
//! A supervisor makes the inputs and a worker process checks them ([`run`]), so a hang is caught
//! by a timeout and a crash (a stack overflow, an abort) by the worker's exit, and the input that
//! caused either is kept like any other failure, shrunk first ([`minimize`]) so that a person
//! can read it.

pub mod check;
pub mod kube;
pub mod minimize;
pub mod rng;
pub mod run;
pub mod spec;
pub mod text;
pub mod values;

pub use run::Args;

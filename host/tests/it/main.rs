//! The host's integration tests: one binary, one module per concern.

mod cli;
mod crds;
mod errors;
mod judge;
mod operator;
mod render;
mod roundtrip;
mod sandbox;
mod support;

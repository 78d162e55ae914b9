//! The host's integration tests: one binary, one module per concern.

mod chart;
mod check;
mod cli;
mod crds;
mod dev;
mod diff;
mod errors;
mod flood;
mod image;
mod judge;
mod migration;
mod monitoring;
mod oci;
mod operator;
mod plugins;
mod release;
mod render;
mod reporting;
mod roundtrip;
mod sandbox;
mod scaffold;
mod security;
mod shards;
mod signatures;
mod support;

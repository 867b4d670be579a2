//! Getting bytes to Python fast: the loader plan (`SampleExec →
//! PayloadTakeExec`) and its bounded read-ahead.

mod loader;
pub mod prefetch;

pub use loader::{LoadedBatch, Loader, Prefetch};

//! Getting bytes to Python fast: the loader plan (`SampleExec →
//! PayloadTakeExec`) and its bounded read-ahead.

pub mod draws;
mod loader;
pub mod prefetch;

pub use draws::{DrawPlan, SampleExec};
pub use loader::{LoadedBatch, Loader, Prefetch};

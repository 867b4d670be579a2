//! Getting bytes to Python fast: the loader plan (`SampleExec →
//! PayloadTakeExec`) and its bounded read-ahead.

mod loader;
pub mod prefetch;
mod state;

pub use loader::{LoadedBatch, Loader, Prefetch};
pub use state::{LoaderState, ReaderPlace};

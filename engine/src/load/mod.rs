//! Getting bytes to Python fast: the loader plan (`SampleExec →
//! PayloadTakeExec`) and its bounded read-ahead.

mod exposures;
mod host;
mod loader;
mod metadata;
pub mod prefetch;
mod request;
mod state;

pub use exposures::{exposures, RunShape};
pub use loader::{LoadedBatch, Loader, Prefetch};
pub use metadata::BatchMetadata;
pub use request::{LoaderRequest, DEFAULT_PREFETCH_BATCHES, DEFAULT_PREFETCH_BYTES};
pub use state::{LoaderState, ReaderPlace, StateValue};

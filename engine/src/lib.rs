//! DatasetRT engine: immutable payload caches, versioned metadata snapshots,
//! DataFusion queries over the training population, and stateless sampling.
//!
//! The modules are layers, lowest first; each names only those below it
//! (`tests/it/layers.rs` checks):
//!
//! * [`store`]: bytes on disk, local or in a bucket: shards, a fixed-width
//!   index read in place, a manifest, checksums, codecs, atomic publish, and
//!   [`store::CacheSet`], the one read path of records by identity.
//! * [`sample`]: which rows, in which order: stateless samplers (draw `k` of
//!   epoch `e` is `f(seed, e, k)`) and [`sample::DrawPlan`], the arithmetic of
//!   blocks, readers and resume positions.
//! * [`catalog`]: a dataset is a set of caches plus numbered, immutable metadata
//!   snapshots; updates are validated and committed here.
//! * [`query`]: a DataFusion session over the active snapshot (tables
//!   `metadata` and `payloads`) and every node and rule (`query::exec`).
//! * [`load`]: the loader plan, its read-ahead, remote prefetching, and
//!   loader states.

pub mod catalog;
pub mod error;
pub mod load;
pub mod query;
pub mod sample;
pub mod store;

pub use catalog::{Dataset, OpenOptions, Snapshot};

/// Threads the engine uses by default (payload reads, SQL partitions, the
/// runtime's workers): `$DATASETRT_THREADS` when it is a positive number,
/// else the cores this process may use. The one place that decides it.
pub fn threads() -> usize {
    std::env::var("DATASETRT_THREADS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
}
pub use error::{Culprit, Error, RecordAt, Result};

/// A tokio runtime per process. A child created by `fork()` inherits the
/// parent's runtime object but none of its threads: it gets a new one, and
/// the inherited one is leaked (dropping it would wait for threads that do
/// not exist in the child).
pub struct ProcessRuntime {
    slot: std::sync::Mutex<Option<(u32, std::sync::Arc<tokio::runtime::Runtime>)>>,
}

impl ProcessRuntime {
    pub const fn new() -> Self {
        ProcessRuntime {
            slot: std::sync::Mutex::new(None),
        }
    }

    /// This process's runtime, made by `build` the first time (in this process).
    pub fn get(
        &self,
        build: impl FnOnce() -> std::io::Result<tokio::runtime::Runtime>,
    ) -> std::io::Result<std::sync::Arc<tokio::runtime::Runtime>> {
        let pid = std::process::id();
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((owner, rt)) = slot.as_ref() {
            if *owner == pid {
                return Ok(rt.clone());
            }
        }
        if let Some((_, stale)) = slot.take() {
            std::mem::forget(stale);
        }
        let rt = std::sync::Arc::new(build()?);
        *slot = Some((pid, rt.clone()));
        Ok(rt)
    }

    /// Whether this process was forked from one that had started its
    /// runtime (and has not made its own yet).
    pub fn inherited(&self) -> bool {
        let slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        slot.as_ref()
            .is_some_and(|(owner, _)| *owner != std::process::id())
    }
}

impl Default for ProcessRuntime {
    fn default() -> Self {
        Self::new()
    }
}

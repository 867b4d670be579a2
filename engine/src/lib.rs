//! DatasetRT engine: immutable payload caches, versioned metadata snapshots,
//! DataFusion queries over the training population, and stateless sampling.
//!
//! The modules are layers, lowest first; each names only those below it
//! (`tests/it/layers.rs` checks):
//!
//! * [`store`]: bytes on disk, local or in a bucket: shards, a fixed-width
//!   index read in place, a manifest, checksums, codecs, atomic publish, and
//!   [`store::CacheSet`], the one read path of records by identity.
//! * [`imports`]: foreign formats read to build caches (WebDataset tar
//!   shards), beside `store` and above it.
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
pub mod imports;
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

/// A lock a panicked holder left poisoned is taken as it is: every critical
/// section in the engine and the binding leaves its data valid at each step
/// (a slot filled or not, a map entry inserted whole), so the panic is
/// reported where it happened and the lock's other users go on. One rule,
/// here, for every `Mutex`, `RwLock` and `Condvar` wait.
pub trait Unpoison<G> {
    /// The guard, poisoned or not.
    fn unpoisoned(self) -> G;
}

impl<G> Unpoison<G> for std::sync::LockResult<G> {
    fn unpoisoned(self) -> G {
        self.unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Stack of each thread of the engine's runtimes (SQL is planned and run
/// there). DataFusion walks plans and expressions recursively; with its
/// `recursive_protection` the tree walks grow their stack on the heap, but
/// evaluating, cloning and dropping an expression of 20,000 terms (a
/// generated `OR` chain, long `+` or `||` chains) still recurses once per
/// term, and the 2 MiB tokio default ended the process with SIGSEGV at
/// 1,000. Only the pages a thread touches are backed by memory.
pub const THREAD_STACK: usize = 64 << 20;

/// Threads that wait on the disk rather than compute: mapping the files a
/// batch's draws land in and reading their headers, a few small reads each.
/// The disk serves many at once and a waiting thread holds no core, so
/// these are many more than [`threads`] (on a snapshot larger than the page
/// cache, one thread took 3.3 s to map a 10^9-row first batch's partitions).
pub const IO_THREADS: usize = 16;

/// `f` of each of `items` on up to `threads` threads, each taking the next
/// item no thread has taken; the first error stops them and is returned.
pub fn try_each<T: Sync>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> Result<()> + Sync,
) -> Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let threads = threads.clamp(1, items.len().max(1));
    if threads == 1 {
        return items.iter().try_for_each(f);
    }
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let failed = std::sync::Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while let Some(item) = items.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    if let Err(e) = f(item) {
                        stop.store(true, Ordering::Relaxed);
                        failed.lock().unpoisoned().get_or_insert(e);
                        return;
                    }
                }
            });
        }
    });
    match failed.into_inner().unpoisoned() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

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
        let mut slot = self.slot.lock().unpoisoned();
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
        let slot = self.slot.lock().unpoisoned();
        slot.as_ref()
            .is_some_and(|(owner, _)| *owner != std::process::id())
    }
}

impl Default for ProcessRuntime {
    fn default() -> Self {
        Self::new()
    }
}

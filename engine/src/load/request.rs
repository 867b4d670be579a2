//! One loader request: everything a reader needs to plan its draws and
//! start reading, with the defaults and the checks in one place. Every front
//! end builds one (the native loader, the torch dataset, the Ray source), so
//! a default cannot differ between them and a value is checked once.

use std::sync::Arc;

use super::{LoaderState, Prefetch};
use crate::catalog::{Dataset, Snapshot};
use crate::sample::{DrawPlan, Sampling};
use crate::{Error, Result};

/// The most draws one batch may hold.
pub const MAX_BATCH_SIZE: u64 = 1 << 31;
/// The most batches a loader may buffer ahead.
pub const MAX_PREFETCH_BATCHES: u64 = 1 << 20;
/// The most payload readers one loader may run.
pub const MAX_THREADS: u64 = 1024;
/// Decoded payload bytes one rank buffers ahead by default; its DataLoader
/// workers share them (each gets its part).
pub const DEFAULT_PREFETCH_BYTES: usize = 64 << 20;
/// Batches a reader buffers ahead by default.
pub const DEFAULT_PREFETCH_BATCHES: usize = 8;

/// What one reader (rank `rank` of `world_size`, worker `worker` of
/// `num_workers`) reads: draws of epoch `epoch` of `sampling` over snapshot
/// `snapshot` (default: the active one), or the rest of a saved state.
#[derive(Debug, Clone, PartialEq)]
pub struct LoaderRequest {
    pub batch_size: u64,
    /// Required unless `resume` gives the sequence: sampling is never
    /// silently random.
    pub seed: Option<u64>,
    pub epoch: u64,
    pub sampling: Sampling,
    /// Draws per epoch (default: what `sampling` takes over the snapshot).
    pub epoch_len: Option<u64>,
    pub snapshot: Option<u64>,
    pub drop_last: bool,
    pub rank: u32,
    pub world_size: u32,
    pub worker: u32,
    pub num_workers: u32,
    /// First block to deliver (a reader of a contiguous range, as Ray's read
    /// tasks are); a resume state replaces it.
    pub start_block: u64,
    /// A saved state: its sequence, snapshot and position win.
    pub resume: Option<LoaderState>,
    /// Concurrent payload readers (default: the cores over `num_workers`).
    pub threads: Option<u64>,
    /// Decoded bytes buffered ahead (default: 64 MiB over `num_workers`).
    pub prefetch_bytes: Option<u64>,
    pub prefetch_batches: u64,
    /// Follow the head within each epoch under this run's schedule
    /// ([`crate::catalog::schedule`]).
    pub run: Option<String>,
}

impl Default for LoaderRequest {
    fn default() -> Self {
        LoaderRequest {
            batch_size: 64,
            seed: None,
            epoch: 0,
            sampling: Sampling::Replacement,
            epoch_len: None,
            snapshot: None,
            drop_last: false,
            rank: 0,
            world_size: 1,
            worker: 0,
            num_workers: 1,
            start_block: 0,
            resume: None,
            threads: None,
            prefetch_bytes: None,
            prefetch_batches: DEFAULT_PREFETCH_BATCHES as u64,
            run: None,
        }
    }
}

fn in_range(name: &str, value: u64, low: u64, high: u64) -> Result<()> {
    if (low..=high).contains(&value) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{name} must be in [{low}, {high}], got {value}"
        )))
    }
}

impl LoaderRequest {
    /// Check every value (the plan's checks against the snapshot come later).
    pub fn validate(&self) -> Result<()> {
        in_range("batch_size", self.batch_size, 1, MAX_BATCH_SIZE)?;
        if self.seed.is_none() && self.resume.is_none() {
            return Err(Error::invalid(
                "seed must be an int (got None); sampling is never silently random",
            ));
        }
        if let Some(n) = self.epoch_len {
            in_range("epoch_len", n, 1, u64::MAX)?;
        }
        if let Some(n) = self.snapshot {
            in_range("snapshot", n, 0, i64::MAX as u64)?;
        }
        if let Some(n) = self.threads {
            in_range("threads", n, 1, MAX_THREADS)?;
        }
        if let Some(n) = self.prefetch_bytes {
            in_range("prefetch_bytes", n, 1, i64::MAX as u64)?;
        }
        if let Some(run) = &self.run {
            crate::catalog::schedule::check_run(run)?;
        }
        in_range(
            "prefetch_batches",
            self.prefetch_batches,
            1,
            MAX_PREFETCH_BATCHES,
        )?;
        self.reader(1).validate()
    }

    /// This reader's share before the snapshot is known.
    fn reader(&self, epoch_len: u64) -> DrawPlan {
        DrawPlan {
            sampling: self.sampling,
            seed: self.seed.unwrap_or(0),
            epoch: self.epoch,
            epoch_len,
            batch_size: self.batch_size as usize,
            start_block: self.start_block,
            drop_last: self.drop_last,
            rank: self.rank,
            world_size: self.world_size,
            worker: self.worker,
            num_workers: self.num_workers,
            run: self.run.clone(),
        }
    }

    /// The snapshot and the draws this reader delivers: checked here, with
    /// a resume state checked against `dataset`.
    pub fn plan(&self, dataset: &Dataset) -> Result<(Arc<Snapshot>, DrawPlan)> {
        self.validate()?;
        let (snapshot, plan) = match &self.resume {
            Some(state) => state.resume(dataset, &self.reader(1))?,
            None => {
                let snapshot = match self.snapshot {
                    Some(n) => dataset.snapshot_at(n)?,
                    None => dataset.snapshot(),
                };
                let epoch_len = snapshot.epoch_len(self.sampling, self.epoch_len)?;
                (snapshot, self.reader(epoch_len))
            }
        };
        plan.validate()?;
        Ok((snapshot, plan))
    }

    /// The read-ahead limits: what was asked, else the rank's defaults
    /// shared among its workers (one loader alone gets all of them).
    pub fn prefetch(&self) -> Prefetch {
        let workers = self.num_workers.max(1) as usize;
        let bytes = self
            .prefetch_bytes
            .map_or(DEFAULT_PREFETCH_BYTES / workers, |b| b as usize);
        let concurrency = self
            .threads
            .map_or((crate::threads() / workers).max(1), |t| t as usize);
        Prefetch {
            bytes,
            batches: self.prefetch_batches as usize,
            concurrency,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> LoaderRequest {
        LoaderRequest {
            seed: Some(1),
            ..LoaderRequest::default()
        }
    }

    #[test]
    fn every_bad_value_is_refused_naming_it() {
        let refused = |r: LoaderRequest, needle: &str| {
            let err = r.validate().unwrap_err();
            assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
            assert!(err.to_string().contains(needle), "{err}");
        };
        refused(LoaderRequest::default(), "never silently random");
        refused(
            LoaderRequest {
                batch_size: 0,
                ..request()
            },
            "batch_size",
        );
        refused(
            LoaderRequest {
                batch_size: MAX_BATCH_SIZE + 1,
                ..request()
            },
            "batch_size",
        );
        refused(
            LoaderRequest {
                epoch_len: Some(0),
                ..request()
            },
            "epoch_len",
        );
        refused(
            LoaderRequest {
                threads: Some(0),
                ..request()
            },
            "threads",
        );
        refused(
            LoaderRequest {
                prefetch_bytes: Some(0),
                ..request()
            },
            "prefetch_bytes",
        );
        refused(
            LoaderRequest {
                prefetch_batches: 0,
                ..request()
            },
            "prefetch_batches",
        );
        refused(
            LoaderRequest {
                rank: 2,
                world_size: 2,
                ..request()
            },
            "rank 2",
        );
        refused(
            LoaderRequest {
                worker: 3,
                num_workers: 3,
                ..request()
            },
            "worker 3",
        );
        assert!(request().validate().is_ok());
    }

    #[test]
    fn workers_share_the_ranks_default_read_ahead_unless_told() {
        let one = request().prefetch();
        assert_eq!(one.bytes, DEFAULT_PREFETCH_BYTES);
        assert_eq!(one.concurrency, crate::threads());
        let four = LoaderRequest {
            num_workers: 4,
            ..request()
        }
        .prefetch();
        assert_eq!(four.bytes, DEFAULT_PREFETCH_BYTES / 4);
        assert_eq!(four.concurrency, (crate::threads() / 4).max(1));
        let told = LoaderRequest {
            num_workers: 4,
            threads: Some(3),
            prefetch_bytes: Some(1000),
            ..request()
        }
        .prefetch();
        assert_eq!((told.bytes, told.concurrency, told.batches), (1000, 3, 8));
    }
}

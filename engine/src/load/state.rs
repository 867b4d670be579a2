//! A loader's place in an epoch as plain data: what `state_dict()` returns and
//! `resume=` takes. It names the snapshot by number and fingerprint, so a
//! state saved before later updates still resumes the population it was
//! drawing from, and a state that no longer matches is refused.

use std::sync::Arc;

use crate::catalog::{Dataset, Snapshot};
use crate::sample::{DrawPlan, Sampling};
use crate::{Error, Result};

/// Where an epoch of draws stands: the global sequence (seed, epoch,
/// sampling, epoch_len over snapshot `snapshot`) and the draws consumed.
///
/// A state taken inside one reader (a DataLoader worker, as torchdata's
/// `StatefulDataLoader` takes them) also names that reader in `reader`: its
/// `position` is then global as if the consumer took this reader's batch
/// last (true of the worker it took a batch from last), and the reader
/// resumed alone continues with its own next batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderState {
    pub seed: u64,
    pub epoch: u64,
    pub sampling: Sampling,
    pub epoch_len: u64,
    pub batch_size: usize,
    pub snapshot: u64,
    pub fingerprint: String,
    /// Draws of the global sequence consumed so far.
    pub position: u64,
    /// The reader that took this state, for a state taken inside one.
    pub reader: Option<ReaderPlace>,
}

/// One reader of a loader layout and where it continues on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaderPlace {
    pub rank: u32,
    pub world_size: u32,
    pub worker: u32,
    pub num_workers: u32,
    /// The start block of the plan in which this reader continues alone.
    pub resume_block: u64,
}

impl LoaderState {
    /// The state of `plan` over `snapshot` once this reader has delivered
    /// `batches` batches (see [`DrawPlan::position_after`]).
    pub fn after(plan: &DrawPlan, snapshot: &Snapshot, batches: u64) -> Self {
        LoaderState {
            seed: plan.seed,
            epoch: plan.epoch,
            sampling: plan.sampling,
            epoch_len: plan.epoch_len,
            batch_size: plan.batch_size,
            snapshot: snapshot.number(),
            fingerprint: snapshot.fingerprint().to_string(),
            position: plan.position_after(batches),
            reader: None,
        }
    }

    /// The state inside one reader of `plan` once it delivered `batches`
    /// batches of its own (see [`LoaderState::reader`]).
    pub fn after_reader(plan: &DrawPlan, snapshot: &Snapshot, batches: u64) -> Self {
        LoaderState {
            position: plan.position_through(batches),
            reader: Some(ReaderPlace {
                rank: plan.rank,
                world_size: plan.world_size,
                worker: plan.worker,
                num_workers: plan.num_workers,
                resume_block: plan.reader_resume_block(batches),
            }),
            ..Self::after(plan, snapshot, 0)
        }
    }

    /// Check this state against `dataset` and return the snapshot it was
    /// drawing from and the plan that continues it: `reader`'s rank, workers,
    /// `batch_size` and `drop_last`, this state's sequence and position.
    pub fn resume(
        &self,
        dataset: &Dataset,
        reader: &DrawPlan,
    ) -> Result<(Arc<Snapshot>, DrawPlan)> {
        if self.epoch_len == 0 {
            return Err(Error::invalid("the state's epoch_len must be positive"));
        }
        let snapshot = dataset.snapshot_at(self.snapshot).map_err(|e| {
            Error::invalid(format!(
                "the state was saved at snapshot {}, which this dataset does not have ({e})",
                self.snapshot
            ))
        })?;
        if snapshot.fingerprint() != self.fingerprint {
            return Err(Error::invalid(format!(
                "the state was saved at snapshot {} with fingerprint {}, but that snapshot now \
                 has fingerprint {}",
                self.snapshot,
                self.fingerprint,
                snapshot.fingerprint()
            )));
        }
        reader.validate()?;
        let mut plan = DrawPlan {
            sampling: self.sampling,
            seed: self.seed,
            epoch: self.epoch,
            epoch_len: self.epoch_len,
            start_block: 0,
            ..reader.clone()
        };
        if let Some(place) = &self.reader {
            let layout =
                |r: u32, rs: u32, w: u32, ws: u32| format!("rank {r} of {rs}, worker {w} of {ws}");
            let saved = layout(
                place.rank,
                place.world_size,
                place.worker,
                place.num_workers,
            );
            let here = layout(
                reader.rank,
                reader.world_size,
                reader.worker,
                reader.num_workers,
            );
            if saved != here || self.batch_size != reader.batch_size {
                return Err(Error::invalid(format!(
                    "this state was taken inside one reader ({saved}, batch_size {}) and \
                     resumes only that reader, not {here} with batch_size {}; for another \
                     layout resume from the state of the whole loader (a StatefulDataLoader's \
                     state_dict(), or state_dict(batches_seen))",
                    self.batch_size, reader.batch_size
                )));
            }
            plan.start_block = place.resume_block;
            plan.validate()?;
            return Ok((snapshot, plan));
        }
        plan.start_block = plan.resume_block(self.position).map_err(|_| {
            Error::invalid(format!(
                "position {} is not a multiple of batch_size {}; resume with batch_size={}",
                self.position, plan.batch_size, self.batch_size
            ))
        })?;
        plan.validate()?;
        Ok((snapshot, plan))
    }
}

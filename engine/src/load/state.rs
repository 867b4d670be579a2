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

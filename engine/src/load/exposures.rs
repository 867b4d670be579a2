//! What a checkpoint trained on: every sample drawn up to a loader state,
//! with its count, recomputed from the state and the snapshots (the draw
//! sequence is a pure function of them); nothing per sample is stored.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::LoaderState;
use crate::catalog::schedule::{Entry, Schedule, Segments};
use crate::catalog::{Dataset, Snapshot};
use crate::sample::{DrawPlan, Sampling};
use crate::{Error, Result};

/// Which epochs a run drew before its state, and how its epochs were cut.
#[derive(Debug, Clone, Default)]
pub struct RunShape {
    /// The first epoch the run drew (0 unless it started later).
    pub first_epoch: u64,
    /// The snapshot each epoch drew from where it was not the state's (a
    /// loader that followed the head: `TorchDataset.history()`).
    pub snapshots: BTreeMap<u64, u64>,
    /// Ranks the epochs were padded or cut for (1: the epoch as drawn).
    pub world_size: u32,
    pub drop_last: bool,
    /// The draws per epoch the loader was given (`None`: each epoch's
    /// snapshot's default, and the state's own length for its snapshot).
    pub epoch_len: Option<u64>,
}

/// Draws counted per pass (bounds the memory of the rows drawn).
const CHUNK: u64 = 1 << 20;

/// Each sample `(cache_id, sample_id)` drawn by the run up to `state`, with
/// the number of times, sorted. Epochs before the state's are counted
/// whole (as cut for `shape`'s ranks), the state's up to its position.
pub fn exposures(
    dataset: &Dataset,
    state: &LoaderState,
    shape: &RunShape,
) -> Result<Vec<(i64, i64, u64)>> {
    check_shape(state, shape)?;
    // the state's own snapshot, checked as a resume checks it
    let reader = reader_plan(state, shape);
    check_position(state, &reader)?;
    let (own, _) = LoaderState {
        reader: None,
        position: 0,
        ..state.clone()
    }
    .resume(dataset, &reader)?;
    let schedule = match &state.run {
        Some(run) => Some(Schedule::open(own.dir(), run)?),
        None => None,
    };
    let mut counts: Tallies = HashMap::new();
    for epoch in shape.first_epoch..=state.epoch {
        // the state's own epoch is drawn from the state's snapshot, whatever
        // the history says
        let snapshot = match shape.snapshots.get(&epoch) {
            Some(&n) if n != own.number() && epoch != state.epoch => dataset.snapshot_at(n)?,
            _ => own.clone(),
        };
        let epoch_len = match snapshot.number() == own.number() {
            true => state.epoch_len,
            false => snapshot.epoch_len(state.sampling, shape.epoch_len)?,
        };
        let plan = DrawPlan {
            epoch,
            epoch_len,
            ..reader.clone()
        };
        let draws = match epoch == state.epoch {
            true => state.position,
            false => plan.total_draws(),
        };
        let entries = schedule_entries(schedule.as_ref(), state.run.as_deref(), epoch)?;
        if !entries.is_empty() {
            count_scheduled(&own, &entries, &plan, draws, &mut counts)?;
            continue;
        }
        let (_, tally) = counts
            .entry(snapshot.number())
            .or_insert_with(|| (snapshot.clone(), vec![0u32; snapshot.num_rows()]));
        count_epoch(&snapshot, state.sampling, state.seed, &plan, draws, tally)?;
    }
    by_sample(&counts)
}

/// The run's epochs must start at or before the state's, and its history
/// name none after it.
fn check_shape(state: &LoaderState, shape: &RunShape) -> Result<()> {
    if shape.first_epoch > state.epoch {
        return Err(Error::invalid(format!(
            "the run's first epoch ({}) is after the state's ({})",
            shape.first_epoch, state.epoch
        )));
    }
    if let Some((&e, _)) = shape.snapshots.range(state.epoch + 1..).next() {
        return Err(Error::invalid(format!(
            "the history names epoch {e}, after the state's epoch {}",
            state.epoch
        )));
    }
    Ok(())
}

/// A state's position lies within its epoch: its draws, with the last
/// blocks' padding for the run's ranks (a position past them is no
/// loader's, and counting it would take ever more passes).
fn check_position(state: &LoaderState, reader: &DrawPlan) -> Result<()> {
    let most = reader.total_draws();
    if state.position > most {
        return Err(Error::invalid(format!(
            "the state's position {} is past what epoch {} holds: {} draws of {} in batches \
             of {} for {} ranks ({most} with the last batches' padding); pass the run's \
             world_size if it had more ranks",
            state.position,
            state.epoch,
            state.epoch_len,
            state.sampling.name(),
            reader.batch_size,
            reader.world_size,
        )));
    }
    Ok(())
}

/// The draws of the state's reader: all of an epoch (one reader, no
/// workers), cut as for `shape`'s ranks.
fn reader_plan(state: &LoaderState, shape: &RunShape) -> DrawPlan {
    DrawPlan {
        sampling: state.sampling,
        seed: state.seed,
        epoch: state.epoch,
        epoch_len: state.epoch_len,
        batch_size: state.batch_size.max(1),
        start_block: 0,
        drop_last: shape.drop_last,
        rank: 0,
        world_size: shape.world_size.max(1),
        worker: 0,
        num_workers: 1,
        run: state.run.clone(),
    }
}

/// The entries of the run's `schedule` (if it has one) for `epoch`: none,
/// or entries from draw 0 on.
fn schedule_entries(
    schedule: Option<&Schedule>,
    run: Option<&str>,
    epoch: u64,
) -> Result<Vec<Entry>> {
    let entries = match schedule {
        Some(s) => s.read(epoch)?,
        None => Vec::new(),
    };
    if entries.first().is_some_and(|e| e.from != 0) {
        return Err(Error::invalid(format!(
            "the schedule of run {:?} for epoch {epoch} does not say where the epoch \
             started (no entry for draw 0): it was damaged or cut",
            run.unwrap_or_default()
        )));
    }
    Ok(entries)
}

/// The draws of `counts` per sample `(cache_id, sample_id)`, sorted.
fn by_sample(counts: &Tallies) -> Result<Vec<(i64, i64, u64)>> {
    let mut by_sample: HashMap<(i64, i64), u64> = HashMap::new();
    for (snapshot, tally) in counts.values() {
        for (row, &n) in tally.iter().enumerate().filter(|(_, &n)| n > 0) {
            *by_sample.entry(snapshot.identity(row)?).or_default() += u64::from(n);
        }
    }
    let mut out: Vec<(i64, i64, u64)> =
        by_sample.into_iter().map(|((c, s), n)| (c, s, n)).collect();
    out.sort_unstable();
    Ok(out)
}

/// Draws counted per row, by snapshot.
type Tallies = HashMap<u64, (Arc<Snapshot>, Vec<u32>)>;

/// Add draws `0..draws` of `plan`'s epoch of a run that followed the head
/// (by its schedule's `entries`) to `counts`.
fn count_scheduled(
    own: &Snapshot,
    entries: &[Entry],
    plan: &DrawPlan,
    draws: u64,
    counts: &mut Tallies,
) -> Result<()> {
    let mut segments = Segments::default();
    segments.extend(own.dir(), entries, 0)?;
    let mut opened = std::collections::BTreeMap::new();
    let how = (plan.sampling, plan.seed, plan.epoch, plan.epoch_len);
    for k in 0..draws {
        let i = segments.of(k);
        let (snapshot, _) = segments.drawer(i, own.dir(), &mut opened, how)?;
        let snapshot = snapshot.clone();
        let row = segments.row(i, k)? as usize;
        let (_, tally) = counts
            .entry(snapshot.number())
            .or_insert_with(|| (snapshot.clone(), vec![0u32; snapshot.num_rows()]));
        tally[row] = tally[row].saturating_add(1);
    }
    Ok(())
}

/// Add draws `0..draws` of `plan`'s epoch over `snapshot` to `tally` (per row).
fn count_epoch(
    snapshot: &Snapshot,
    sampling: Sampling,
    seed: u64,
    plan: &DrawPlan,
    draws: u64,
    tally: &mut [u32],
) -> Result<()> {
    let sampler = snapshot.sampler(sampling, seed, plan.epoch, plan.epoch_len)?;
    let mut at = 0;
    while at < draws {
        let end = (at + CHUNK).min(draws);
        for row in sampler.rows(at..end, crate::threads())? {
            tally[row as usize] = tally[row as usize].saturating_add(1);
        }
        at = end;
    }
    Ok(())
}

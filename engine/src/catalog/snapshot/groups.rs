//! The rows of each group of a snapshot's mixture, found from the grouping
//! column when an epoch is drawn, and the epoch's sampler that draws them
//! by the mixture's shares.

use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::{Array, AsArray};
use arrow::datatypes::DataType;

use super::mixture::Mixture;
use super::read::Snapshot;
use crate::sample::{mix_key, EpochSampler, Group, Interleave, MixtureDraws, Sampling};
use crate::Unpoison;
use crate::{Error, Result};

/// A group's sampler by mode, seed, epoch, group and balanced block length.
type SamplerKey = (Sampling, u64, u64, usize, u64);

/// The rows of each group of a mixture in one population, and each
/// group's weights: found once per population and grouping, whatever the
/// shares (a mixture changed during a run keeps its groups).
#[derive(Debug)]
pub struct GroupRows {
    /// By the mixture's values; empty for a value no row has.
    rows: Vec<Arc<[u32]>>,
    weights: Vec<Vec<f64>>,
    /// Each group's sampler, by [`SamplerKey`]: a change of
    /// shares during an epoch draws on with them.
    samplers: Mutex<std::collections::HashMap<SamplerKey, EpochSampler>>,
}

impl GroupRows {
    /// The rows of each of `values` in `snapshot`'s column `column`, read
    /// (and every chunk checked) from the column files.
    fn find(snapshot: &Snapshot, column: &str, values: &[String]) -> Result<GroupRows> {
        let schema = snapshot.schema();
        let k = schema.index_of(column).map_err(|_| {
            Error::invalid(format!(
                "the mixture groups by column {column:?}, which snapshot {} does not have",
                snapshot.number()
            ))
        })?;
        if snapshot.num_rows() > u32::MAX as usize {
            return Err(Error::invalid(format!(
                "a mixture draws from at most 2^32 - 1 rows; snapshot {} has {}",
                snapshot.number(),
                snapshot.num_rows()
            )));
        }
        let index: std::collections::HashMap<&str, usize> = values
            .iter()
            .enumerate()
            .map(|(g, v)| (v.as_str(), g))
            .collect();
        let weights = snapshot.weights()?;
        let mut rows: Vec<Vec<u32>> = vec![Vec::new(); values.len()];
        let mut masses: Vec<Vec<f64>> = vec![Vec::new(); values.len()];
        let mut start = 0usize;
        for (part, w) in (0..snapshot.num_partitions()).zip(weights.parts()) {
            let column = snapshot.partition_columns(part, &[k])?.remove(0);
            let text = arrow::compute::cast(&column, &DataType::Utf8).map_err(|e| {
                Error::invalid(format!(
                    "the mixture's column {:?} ({}) has no text form: {e}",
                    schema.field(k).name(),
                    column.data_type()
                ))
            })?;
            let text = text.as_string::<i32>();
            for (i, value) in text.iter().enumerate() {
                if let Some(&g) = value.and_then(|v| index.get(v)) {
                    rows[g].push((start + i) as u32);
                    masses[g].push(w[i]);
                }
            }
            start += column.len();
        }
        Ok(GroupRows {
            rows: rows.into_iter().map(Arc::from).collect(),
            weights: masses,
            samplers: Mutex::default(),
        })
    }

    /// Group `g`'s sampler (built once per epoch, mode, seed and draws).
    /// `draws` is the group's draws in the epoch: balanced sampling rounds
    /// each row's count over all of them (one block of `draws`), so a row
    /// gets the floor or the ceiling of its expected count per epoch, as
    /// without a mixture; the other modes pass over the group's rows.
    fn sampler(
        &self,
        g: usize,
        value: &str,
        (sampling, seed, epoch): (Sampling, u64, u64),
        draws: u64,
    ) -> Result<EpochSampler> {
        let (rows, weights) = (&self.rows[g], &self.weights[g]);
        let len = match sampling {
            Sampling::Balanced => draws.max(1),
            _ => rows.len() as u64,
        };
        let key = (sampling, seed, epoch, g, len);
        let mut kept = self.samplers.lock().unpoisoned();
        if let Some(sampler) = kept.get(&key) {
            return Ok(sampler.clone());
        }
        let sampler = EpochSampler::new(
            sampling,
            rows.len(),
            &|| Ok(weights.into()),
            None,
            mix_key(seed, value.as_bytes()),
            epoch,
            len,
        )
        .map_err(|e| Error::invalid(format!("mixture group {value:?}: {e}")))?;
        // this epoch's and the next one's, for every group
        if kept.len() >= 2 * self.rows.len() {
            kept.retain(|k, _| k.2 >= epoch);
        }
        kept.insert(key, sampler.clone());
        Ok(sampler)
    }

    /// Each group's rows and their weight in all.
    pub fn sizes(&self) -> impl Iterator<Item = (usize, f64)> + '_ {
        self.rows
            .iter()
            .zip(&self.weights)
            .map(|(r, w)| (r.len(), w.iter().sum()))
    }
}

/// The groups found last, by what they were found from (the grouping
/// column's and the weight column's files, and the values): a mixture
/// changed during a run reuses them, so the change costs its interleaving.
type GroupKey = (Vec<String>, Vec<String>);
type Found = Mutex<Vec<(GroupKey, Arc<GroupRows>)>>;

fn found() -> &'static Found {
    static FOUND: OnceLock<Found> = OnceLock::new();
    FOUND.get_or_init(Default::default)
}

/// Groups kept per process.
const KEPT_GROUPS: usize = 4;

/// The rows of `mixture`'s groups in `snapshot`.
pub fn group_rows(snapshot: &Snapshot, mixture: &Mixture) -> Result<Arc<GroupRows>> {
    let files = snapshot.column_files(&[mixture.column(), "weight"]);
    let key = (files, mixture.values().to_vec());
    let mut kept = found().lock().unpoisoned();
    if let Some((_, rows)) = kept.iter().find(|(k, _)| *k == key) {
        return Ok(rows.clone());
    }
    let rows = Arc::new(GroupRows::find(
        snapshot,
        mixture.column(),
        mixture.values(),
    )?);
    if kept.len() >= KEPT_GROUPS {
        kept.remove(0);
    }
    kept.push((key, rows.clone()));
    Ok(rows)
}

/// Draws per epoch of a mixture when the caller does not choose: the rows
/// of its groups of positive share.
pub fn default_epoch_len(snapshot: &Snapshot, mixture: &Mixture) -> Result<u64> {
    let groups = group_rows(snapshot, mixture)?;
    Ok(groups
        .sizes()
        .zip(mixture.shares().parts())
        .filter(|(_, &part)| part > 0)
        .map(|((rows, _), _)| rows as u64)
        .sum())
}

/// The sampler of one epoch of `epoch_len` draws of `mixture` over
/// `snapshot`: each group of positive share drawn by `sampling` over its
/// own rows and weights, under a seed of its own (from the group's value,
/// so a group keeps its sequence when the shares change).
pub fn sampler(
    snapshot: &Snapshot,
    mixture: &Mixture,
    (sampling, seed, epoch): (Sampling, u64, u64),
    epoch_len: u64,
) -> Result<EpochSampler> {
    let found = group_rows(snapshot, mixture)?;
    let interleave = Arc::new(Interleave::new(mixture.shares().clone()));
    let draws = interleave.counts(epoch_len);
    let parts = mixture.shares().parts();
    let mut groups = Vec::with_capacity(parts.len());
    for (g, value) in mixture.values().iter().enumerate() {
        if parts[g] == 0 {
            groups.push(None);
            continue;
        }
        let (rows, weights) = (&found.rows[g], &found.weights[g]);
        if !weights.iter().any(|&w| w > 0.0) {
            return Err(Error::invalid(format!(
                "mixture group {value:?} (column {:?}) has a share of {} but no row of positive \
                 weight in snapshot {}: set the mixture again without it",
                mixture.column(),
                mixture.shares().share(g),
                snapshot.number()
            )));
        }
        let sampler = found.sampler(g, value, (sampling, seed, epoch), draws[g])?;
        groups.push(Some(Group {
            rows: rows.clone(),
            sampler,
        }));
    }
    Ok(EpochSampler::mixture(
        seed,
        epoch,
        Arc::new(MixtureDraws::new(interleave, groups)?),
    ))
}

/// Check `mixture` against `snapshot` before it is committed: its column
/// is there, and every group of positive share has a row of positive
/// weight.
pub fn check(snapshot: &Snapshot, mixture: &Mixture) -> Result<()> {
    let found = group_rows(snapshot, mixture)?;
    for ((value, (rows, mass)), &part) in mixture
        .values()
        .iter()
        .zip(found.sizes())
        .zip(mixture.shares().parts())
    {
        if part > 0 && mass.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
            let what = match rows {
                0 => "no row".to_string(),
                n => format!("{n} rows, all of weight 0,"),
            };
            return Err(Error::invalid(format!(
                "mixture group {value:?} has {what} in column {:?} of snapshot {}; give it \
                 share 0 or leave it out",
                mixture.column(),
                snapshot.number()
            )));
        }
    }
    Ok(())
}

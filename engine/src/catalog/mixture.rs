//! A snapshot's mixture: target shares of the groups of rows that one
//! column's values make, stored in the manifest with the population (so it
//! is versioned, named by the fingerprint and in every state), and the
//! groups' rows found from the column when an epoch is drawn.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::{Array, AsArray};
use arrow::datatypes::DataType;
use xxhash_rust::xxh3::Xxh3;

use super::snapshot::{escape, unescape};
use super::Snapshot;
use crate::sample::{mix_key, EpochSampler, Group, Interleave, MixtureDraws, Sampling, Shares};
use crate::Unpoison;
use crate::{Error, Result};

/// A mixture as stored: the grouping column, each group's value (as text:
/// the column's values cast to strings) and the shares, in one order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mixture {
    column: String,
    values: Vec<String>,
    shares: Shares,
}

/// The columns a mixture may not group by: they name or weigh each row.
const NOT_GROUPS: [&str; 3] = ["cache_id", "sample_id", "weight"];

impl Mixture {
    /// `shares` by value of `column` (see [`Shares::from_f64`]); values
    /// must be distinct.
    pub fn new(column: &str, shares: &[(String, f64)]) -> Result<Mixture> {
        if NOT_GROUPS.contains(&column) {
            return Err(Error::invalid(format!(
                "a mixture groups rows by a column of their own, not {column:?}"
            )));
        }
        let mut values: Vec<String> = shares.iter().map(|(v, _)| v.clone()).collect();
        values.sort();
        if let Some(twice) = values.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::invalid(format!(
                "the mixture names group {:?} twice",
                twice[0]
            )));
        }
        let numbers: Vec<f64> = shares.iter().map(|(_, s)| *s).collect();
        Ok(Mixture {
            column: column.to_string(),
            values: shares.iter().map(|(v, _)| v.clone()).collect(),
            shares: Shares::from_f64(&numbers)?,
        })
    }

    pub fn column(&self) -> &str {
        &self.column
    }

    /// The groups' values, in the shares' order.
    pub fn values(&self) -> &[String] {
        &self.values
    }

    pub fn shares(&self) -> &Shares {
        &self.shares
    }

    /// The manifest's lines: `mixture=<column>`, then `group=<part> <value>`
    /// per group (names escaped).
    pub(super) fn write_lines(&self, body: &mut String) {
        let _ = writeln!(body, "mixture={}", escape(&self.column));
        for (value, part) in self.values.iter().zip(self.shares.parts()) {
            let _ = writeln!(body, "group={part} {}", escape(value));
        }
    }

    /// Fold this mixture into a population's fingerprint: a population with
    /// another mixture draws another sequence.
    pub(super) fn fingerprint(&self, population: &str) -> String {
        let mut h = Xxh3::new();
        h.update(population.as_bytes());
        let mut lines = String::new();
        self.write_lines(&mut lines);
        h.update(b"\0mixture\0");
        h.update(lines.as_bytes());
        format!("{:032x}", h.digest128())
    }
}

/// A manifest's mixture as its lines are read (see [`Mixture::write_lines`]).
#[derive(Debug, Default)]
pub(super) struct MixtureLines {
    column: Option<String>,
    groups: Vec<(String, u32)>,
}

impl MixtureLines {
    /// Take a `mixture` or `group` line; the error says what is wrong.
    pub(super) fn line(&mut self, key: &str, value: &str) -> std::result::Result<(), String> {
        let bad = || format!("bad {key} line {key}={value}");
        match key {
            "mixture" => self.column = Some(unescape(value).ok_or_else(bad)?),
            _ => {
                let (part, name) = value.split_once(' ').ok_or_else(bad)?;
                let part = part.parse().map_err(|_| bad())?;
                self.groups.push((unescape(name).ok_or_else(bad)?, part));
            }
        }
        Ok(())
    }

    pub(super) fn finish(self) -> std::result::Result<Option<Mixture>, String> {
        let Some(column) = self.column else {
            return match self.groups.is_empty() {
                true => Ok(None),
                false => Err("group lines without a mixture line".into()),
            };
        };
        let (values, parts): (Vec<String>, Vec<u32>) = self.groups.into_iter().unzip();
        let shares = Shares::new(parts.clone()).map_err(|e| e.to_string())?;
        if shares.parts() != parts {
            return Err(format!(
                "the mixture's parts {parts:?} are not in lowest terms"
            ));
        }
        Ok(Some(Mixture {
            column,
            values,
            shares,
        }))
    }
}

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

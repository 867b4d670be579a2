//! What draws read from a snapshot: its weights, each partition's alias
//! table, and the epoch samplers (kept for reuse) over its rows.

use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::AsArray;
use arrow::buffer::ScalarBuffer;
use arrow::datatypes::{Field, Float64Type};

use super::columns::Positions;
use super::columns::{open_part_column, COLUMNS_DIR};
use super::groups;
use super::manifest::PartitionEntry;
use super::mixture::Mixture;
use super::read::Snapshot;
use crate::sample::{
    mass, AliasTable, DrawPlan, EpochSampler, PartitionSource, PartitionedWeights, Sampling,
};
use crate::store::CacheSet;
use crate::Unpoison;
use crate::{Error, Result};

/// Where a snapshot's per-partition weights and alias tables come from: a
/// table is named by its partition's weight column hash and built from
/// that column (mapped for the build only: the table is what draws read).
#[derive(Debug)]
struct WeightTables {
    dir: PathBuf,
    /// The manifest (error messages).
    path: PathBuf,
    partitions: Vec<PartitionEntry>,
    /// Each partition's weight mass, as the top table was built from.
    masses: Vec<f64>,
    field: Field,
    at: Positions,
}

impl WeightTables {
    /// Where partition `p`'s table is stored: named by its weight column.
    fn table_file(&self, p: usize) -> PathBuf {
        let hash = &self.partitions[p].columns[self.at.weight].hash;
        self.dir.join(COLUMNS_DIR).join(format!("{hash}.alias"))
    }
}

impl PartitionSource for WeightTables {
    fn table(&self, p: usize) -> Result<AliasTable> {
        match self.stored(p)? {
            Some(table) => Ok(table),
            None => self.rebuild(p),
        }
    }

    fn stored(&self, p: usize) -> Result<Option<AliasTable>> {
        AliasTable::stored(&self.table_file(p), self.partitions[p].rows)
    }

    fn rebuild(&self, p: usize) -> Result<AliasTable> {
        AliasTable::build_stored(&self.table_file(p), &self.weights(p)?.as_ref().into())
    }

    fn weights(&self, p: usize) -> Result<ScalarBuffer<f64>> {
        let (_, column) = open_part_column(
            &self.dir,
            &self.path,
            p,
            &self.partitions[p],
            self.at.weight,
            Some(&self.field),
            &self.at,
        )?;
        let weights = column
            .whole()?
            .as_primitive::<Float64Type>()
            .values()
            .clone();
        // draws found this partition by its recorded mass: a manifest
        // whose mass is not its weights' would skew every draw
        let summed = mass(&weights);
        if summed != self.masses[p] {
            return Err(Error::corrupt(
                &self.path,
                format!(
                    "partition {p}'s weights sum to {summed:?}, its manifest records {:?}",
                    self.masses[p]
                ),
            ));
        }
        Ok(weights)
    }
}

pub const NO_ROW: u64 = u64::MAX;

/// Samplers a snapshot keeps: this epoch's and the next one's (the remote
/// read-ahead plans past the epoch's end).
const KEPT_SAMPLERS: usize = 2;

impl Snapshot {
    /// Draws per epoch of `sampling` over this population: `epoch_len` when
    /// given, else the mode's default (the population's size, or for
    /// `balanced` the classes times the largest class).
    pub fn epoch_len(&self, sampling: Sampling, epoch_len: Option<u64>) -> Result<u64> {
        match (epoch_len, &self.mixture) {
            (Some(len), _) => Ok(len),
            (None, Some(m)) => groups::default_epoch_len(self, m),
            (None, None) => sampling.default_epoch_len(self.rows, &|| self.weights()),
        }
    }

    /// Make what every epoch of `sampling` draws through, before any draw:
    /// for draws with replacement, the alias table of each partition a draw
    /// can land in (mapped where stored, else built and stored, so that a
    /// host's other processes map it). Other modes keep nothing between
    /// epochs. A loader that is about to fork its workers calls this once.
    pub fn prepare_draws(&self, sampling: Sampling) -> Result<()> {
        match (sampling, &self.mixture) {
            (Sampling::Replacement, None) => self.partitioned()?.prepare_all(crate::threads()),
            _ => Ok(()),
        }
    }

    /// The sampler of epoch `epoch` of `sampling` over this population: draw
    /// `k` is row `sampler.row(k)`. Under a mixture, the mixture's draws.
    pub fn sampler(
        &self,
        sampling: Sampling,
        seed: u64,
        epoch: u64,
        epoch_len: u64,
    ) -> Result<EpochSampler> {
        self.kept_sampler(self.mixture.as_ref(), (sampling, seed, epoch, epoch_len))
    }

    /// The sampler of `sampling` over this population's rows by their
    /// weights alone, whatever its mixture: a run's segment without a
    /// mixture drawn through a snapshot of the same rows that has one.
    pub fn plain_sampler(
        &self,
        sampling: Sampling,
        seed: u64,
        epoch: u64,
        epoch_len: u64,
    ) -> Result<EpochSampler> {
        self.kept_sampler(None, (sampling, seed, epoch, epoch_len))
    }

    fn kept_sampler(
        &self,
        mixture: Option<&Mixture>,
        (sampling, seed, epoch, epoch_len): (Sampling, u64, u64, u64),
    ) -> Result<EpochSampler> {
        let key = (mixture.is_some(), sampling, seed, epoch, epoch_len);
        // held while building: a second user of the same epoch waits and reuses it
        let mut kept = self.samplers.lock().unpoisoned();
        if let Some((_, sampler)) = kept.iter().find(|(k, _)| *k == key) {
            return Ok(sampler.clone());
        }
        let sampler = match mixture {
            Some(m) => groups::sampler(self, m, (sampling, seed, epoch), epoch_len)?,
            None => {
                let partitioned = match sampling {
                    Sampling::Replacement | Sampling::Balanced => Some(self.partitioned()?),
                    _ => None,
                };
                EpochSampler::new(
                    sampling,
                    self.rows,
                    &|| self.weights(),
                    partitioned.as_ref(),
                    seed,
                    epoch,
                    epoch_len,
                )?
            }
        };
        if kept.len() >= KEPT_SAMPLERS {
            kept.remove(0);
        }
        kept.push((key, sampler.clone()));
        Ok(sampler)
    }

    /// The sampler of `plan`'s epoch over this population.
    pub fn epoch_sampler(&self, plan: &DrawPlan) -> Result<EpochSampler> {
        self.sampler(plan.sampling, plan.seed, plan.epoch, plan.epoch_len)
    }

    /// The weights as weighted and balanced draws read them: the
    /// partitions' masses (from the manifest; summed from the weights for a
    /// manifest older than version 4), and per partition, when a draw first
    /// lands there, its alias table (mapped, or built and stored next to the
    /// column files as `<weight column hash>.alias`, shared by every process
    /// and every snapshot with that weight column) or its block sums.
    pub fn partitioned(&self) -> Result<Arc<PartitionedWeights>> {
        if let Some(partitioned) = self.partitioned.get() {
            return Ok(partitioned.clone());
        }
        let masses = self
            .partitions
            .iter()
            .map(|part| match part.entry.mass {
                Some(m) => Ok(m),
                None => Ok(mass(
                    self.column(part, self.weight_col)?
                        .whole()?
                        .as_primitive::<Float64Type>()
                        .values(),
                )),
            })
            .collect::<Result<Vec<f64>>>()?;
        let rows: Vec<usize> = self.partitions.iter().map(|p| p.rows).collect();
        let source = WeightTables {
            dir: self.dir().to_path_buf(),
            path: self.path.clone(),
            partitions: self.partitions.iter().map(|p| p.entry.clone()).collect(),
            masses: masses.clone(),
            field: self.schema.field(self.weight_col).clone(),
            at: self.positions(),
        };
        let partitioned = Arc::new(PartitionedWeights::new(&rows, &masses, Box::new(source))?);
        Ok(self.partitioned.get_or_init(|| partitioned).clone())
    }

    /// The first row of `(cache position, sample_id)` in this population, if any.
    /// `caches` must be the dataset's caches, sorted by id.
    pub fn row_of(
        &self,
        caches: &CacheSet,
        cache_pos: usize,
        sample_id: u64,
    ) -> Result<Option<usize>> {
        let table = match self.rows_by_sample.get() {
            Some(table) => table,
            None => {
                let parts = self.identities()?;
                self.rows_by_sample
                    .get_or_init(|| rows_by_sample(caches, &parts))
            }
        };
        Ok(
            match table.get(cache_pos).and_then(|t| t.get(sample_id as usize)) {
                Some(&row) if row != NO_ROW => Some(row as usize),
                _ => None,
            },
        )
    }
}

/// For each cache (sorted by id) and sample, the first row of the
/// population (given as each partition's identity columns) that draws it
/// (`NO_ROW` if none).
fn rows_by_sample(caches: &CacheSet, parts: &[(&[i64], &[i64])]) -> Vec<Vec<u64>> {
    let mut table: Vec<Vec<u64>> = caches
        .iter()
        .map(|c| vec![NO_ROW; c.records() as usize])
        .collect();
    let mut pos = 0usize;
    let mut end: usize = parts.iter().map(|(ids, _)| ids.len()).sum();
    for (ids, samples) in parts.iter().rev() {
        let start = end - ids.len();
        for i in (0..ids.len()).rev() {
            if caches.get(pos).map(|c| c.id()) != Some(ids[i]) {
                // rows are validated on update; a crafted file only loses rows here
                match caches.binary_search_by_key(&ids[i], |c| c.id()) {
                    Ok(found) => pos = found,
                    Err(_) => continue,
                }
            }
            if let Some(slot) = usize::try_from(samples[i])
                .ok()
                .and_then(|s| table[pos].get_mut(s))
            {
                *slot = (start + i) as u64;
            }
        }
        end = start;
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::snapshot::{
        column_hash, publish, store_partition, write_manifest, Known, Partitioned,
    };
    use arrow::array::RecordBatch;
    use std::path::Path;

    /// Samples `0..weights.len()` of cache 1, weighing `weights`.
    fn population(weights: &[f64]) -> RecordBatch {
        let rows: Vec<(i64, i64, f64)> = (0..).zip(weights).map(|(s, &w)| (1, s, w)).collect();
        crate::catalog::snapshot::read::tests::population(&rows)
    }

    /// `weights` published in partitions of `per` rows in `dir`, opened.
    fn open(dir: &Path, weights: &[f64], per: usize) -> Snapshot {
        let batch = population(weights);
        let schema = batch.schema();
        let made = Partitioned::new(&schema, &[batch], per, None, |_, _, _| Ok(())).unwrap();
        let n = publish(dir, &made, 0, "", None, None).unwrap();
        Snapshot::open(dir, n).unwrap()
    }

    #[test]
    fn a_row_of_weight_zero_is_never_drawn() {
        let dir = tempfile::tempdir().unwrap();
        // partitions [0, 0], [3, 0] and [0, 1]: the first weighs nothing
        let snapshot = open(dir.path(), &[0.0, 0.0, 3.0, 0.0, 0.0, 1.0], 2);
        let sampler = snapshot.sampler(Sampling::Replacement, 11, 0, 200).unwrap();
        let mut drawn = [0usize; 6];
        for k in 0..200 {
            drawn[sampler.row(k).unwrap() as usize] += 1;
        }
        assert_eq!(
            [drawn[0], drawn[1], drawn[3], drawn[4]],
            [0; 4],
            "{drawn:?}"
        );
        assert!(drawn[2] > drawn[5] && drawn[5] > 0, "{drawn:?}");
        // a partition's alias table is made when a draw first lands there,
        // and stored beside the column files, named by its weight column
        let weight = snapshot.schema().index_of("weight").unwrap();
        for (p, part) in snapshot.partition_entries().iter().enumerate() {
            let hash = &part.columns[weight].hash;
            let table = dir.path().join(COLUMNS_DIR).join(format!("{hash}.alias"));
            assert_eq!(table.exists(), p > 0, "partition {p}");
        }
    }

    #[test]
    fn an_epoch_is_the_population_unless_told_or_drawn_by_weight_without_replacement() {
        let dir = tempfile::tempdir().unwrap();
        let weights = [1.0, 0.0, 2.0, 0.0, 0.5];
        let snapshot = open(dir.path(), &weights, 2);
        assert_eq!(snapshot.epoch_len(Sampling::Replacement, None).unwrap(), 5);
        assert_eq!(snapshot.epoch_len(Sampling::Permutation, None).unwrap(), 5);
        // rows of weight 0 are never drawn without replacement
        let weighted = Sampling::WeightedWithoutReplacement;
        assert_eq!(snapshot.epoch_len(weighted, None).unwrap(), 3);
        assert_eq!(
            snapshot.epoch_len(Sampling::Balanced, Some(12)).unwrap(),
            12
        );
        // the weights as draws read them, partition after partition
        let read = snapshot.weights().unwrap();
        assert_eq!(read.parts().len(), 3);
        assert_eq!(read.to_vec(), weights);
        // a permutation draws every row once an epoch
        let sampler = snapshot.sampler(Sampling::Permutation, 3, 0, 5).unwrap();
        let mut rows: Vec<u64> = (0..5).map(|k| sampler.row(k).unwrap()).collect();
        rows.sort_unstable();
        assert_eq!(rows, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn weights_that_do_not_sum_to_their_partitions_recorded_mass_are_refused_when_drawn() {
        let dir = tempfile::tempdir().unwrap();
        let batch = population(&[1.0, 2.0, 3.0]);
        let schema = batch.schema();
        let hashes: Vec<String> = schema
            .fields()
            .iter()
            .zip(batch.columns())
            .map(|(f, a)| column_hash(f, a))
            .collect();
        let mut entry =
            store_partition(dir.path(), &batch, &hashes, &mut Known::default()).unwrap();
        assert_eq!(entry.mass, Some(6.0));
        entry.mass = Some(5.0);
        let n = write_manifest(dir.path(), &[entry], 0, "", None, None).unwrap();
        let snapshot = Snapshot::open(dir.path(), n).unwrap();
        let sampler = snapshot.sampler(Sampling::Replacement, 1, 0, 10).unwrap();
        let drawn = sampler.row(0);
        assert!(matches!(drawn, Err(Error::Corrupt { .. })), "{drawn:?}");
    }
}

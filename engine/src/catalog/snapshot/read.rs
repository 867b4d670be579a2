//! Reading a snapshot: the runtime [`Snapshot`] over a manifest and its
//! column files, mapped partition by partition as reads need them.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::buffer::ScalarBuffer;
use arrow::datatypes::{Field, Int64Type, Schema, SchemaRef};

use arrow::datatypes::Float64Type;

use super::columns::{open_part_column, Column, Positions};
use super::manifest::{read_manifest, PartitionEntry};
use super::mixture::Mixture;
use super::partition::{address, KnownHashes, Prior};
use crate::catalog::ranges::ColumnRange;
use crate::sample::{EpochSampler, PartitionedWeights, Sampling, Weights};
use crate::{Error, Result};

/// A kept epoch sampler's key: (by the mixture, sampling, seed, epoch,
/// epoch_len).
pub(super) type SamplerKey = (bool, Sampling, u64, u64, u64);

/// One immutable population: `cache_id`, `sample_id`, user columns, `weight`,
/// stored as an ordered list of partitions (each its own column files).
#[derive(Debug)]
pub struct Snapshot {
    pub(super) number: u64,
    pub(super) path: PathBuf,
    pub(super) schema: SchemaRef,
    pub(super) rows: usize,
    pub(super) partitions: Vec<Partition>,
    /// Positions in each partition's `columns` of `cache_id`, `sample_id`
    /// and `weight`.
    pub(super) cache_col: usize,
    pub(super) sample_col: usize,
    pub(super) weight_col: usize,
    /// Every partition as one batch, every chunk checked (built on first use).
    pub(super) batches: OnceLock<Vec<RecordBatch>>,
    pub(super) fingerprint: String,
    pub(super) note: String,
    pub(super) created_unix_ms: u64,
    pub(super) parent: Option<u64>,
    /// Target shares of groups of rows, if the population has them.
    pub(super) mixture: Option<Mixture>,
    pub(super) rows_by_sample: OnceLock<Vec<Vec<u64>>>,
    /// Weighted and balanced draws: the partitions' masses, each
    /// partition's alias table and block sums made when a draw first lands
    /// there.
    pub(super) partitioned: OnceLock<Arc<PartitionedWeights>>,
    /// The epoch samplers built last, by [`SamplerKey`]:
    /// a loader's draws and its read-ahead walk the same epoch, and a sorted
    /// order (weighted without replacement, balanced) is built once for both.
    pub(super) samplers: Mutex<Vec<(SamplerKey, EpochSampler)>>,
    /// This process reads the snapshot: `cleanup` keeps it (`None` where no
    /// lease can be written).
    _lease: Option<crate::catalog::lease::Lease>,
}

/// Rows `start .. start + rows` of a snapshot: one column file per column,
/// mapped when a read first needs the partition (partition 0 at `open`).
#[derive(Debug)]
pub(super) struct Partition {
    /// Its place in the snapshot's list (for error messages).
    pub(super) index: usize,
    pub(super) start: usize,
    pub(super) rows: usize,
    /// Its manifest lines: rows and column files (hash, CRC, length, name).
    pub(super) entry: PartitionEntry,
    pub(super) opened: OnceLock<Opened>,
}

/// A partition's columns, each mapped on first use (the identity columns
/// with the partition).
#[derive(Debug)]
pub(super) struct Opened {
    pub(super) columns: Vec<OnceLock<Column>>,
    /// The values of `cache_id` and `sample_id`, for reads that check them
    /// first (`identity`).
    pub(super) ids: ScalarBuffer<i64>,
    pub(super) samples: ScalarBuffer<i64>,
}

/// Map partition `i` (`entry`) of the snapshot at `path`: partition 0
/// (`expected` None) every column, whose fields it returns (the snapshot's
/// schema); any other its identity columns, the rest on first use.
fn open_partition(
    dir: &Path,
    path: &Path,
    i: usize,
    entry: &PartitionEntry,
    expected: Option<&[arrow::datatypes::FieldRef]>,
    at: &Positions,
) -> Result<(Vec<Field>, Opened)> {
    let mut fields = Vec::with_capacity(entry.columns.len());
    let columns: Vec<OnceLock<Column>> = entry.columns.iter().map(|_| OnceLock::new()).collect();
    for (k, slot) in columns.iter().enumerate() {
        if expected.is_some() && k != at.cache && k != at.sample {
            continue;
        }
        let want = expected.map(|e| e[k].as_ref());
        let (field, column) = open_part_column(dir, path, i, entry, k, want, at)?;
        fields.push(field);
        let _ = slot.set(column);
    }
    let values = |k: usize| {
        let column = columns[k].get().expect("identity columns are opened above");
        let array: &ArrayRef = column.array.get().expect("decoded when opened");
        array.as_primitive::<Int64Type>().values().clone()
    };
    let opened = Opened {
        ids: values(at.cache),
        samples: values(at.sample),
        columns,
    };
    Ok((fields, opened))
}

impl Snapshot {
    pub fn file_name(number: u64) -> String {
        super::manifest::file_name(number)
    }

    pub fn parse_file_name(name: &str) -> Option<u64> {
        let stem = name.strip_suffix(".snapshot")?;
        (stem.len() == 8 && stem.bytes().all(|b| b.is_ascii_digit())).then(|| stem.parse().ok())?
    }

    /// Read snapshot `number` from `dir`: check its manifest and map the
    /// column files of every partition. A column file with a chunk table
    /// (its sidecar, see `store::chunks`) is checked chunk by chunk as it is
    /// read, so opening it checks only the bytes that locate its array; one
    /// without is checked whole here (once per host). The columns the
    /// loader reads (identities, weights) are decoded here, the others on
    /// first use.
    pub fn open(dir: &Path, number: u64) -> Result<Snapshot> {
        // before reading: a cleanup either sees the lease or has finished
        let lease = crate::catalog::lease::Lease::take(dir, number);
        let path = dir.join(Self::file_name(number));
        let manifest = read_manifest(dir, number)?;
        let bad = |detail: String| Error::corrupt(&path, detail);
        let first = &manifest.partitions[0];
        let position = |name: &str| {
            first
                .columns
                .iter()
                .position(|c| c.name == name)
                .ok_or_else(|| bad(format!("snapshot lacks a column {name:?}")))
        };
        let at = Positions {
            cache: position("cache_id")?,
            sample: position("sample_id")?,
            weight: position("weight")?,
        };
        let (fields, zero) = open_partition(dir, &path, 0, first, None, &at)?;
        let mut partitions = Vec::with_capacity(manifest.partitions.len());
        let mut start = 0;
        for (index, entry) in manifest.partitions.iter().cloned().enumerate() {
            partitions.push(Partition {
                index,
                start,
                rows: entry.rows,
                entry,
                opened: OnceLock::new(),
            });
            start += partitions.last().expect("pushed").rows;
        }
        let _ = partitions[0].opened.set(zero);
        let (cache_col, sample_col, weight_col) = (at.cache, at.sample, at.weight);
        Ok(Snapshot {
            number,
            path,
            schema: Arc::new(Schema::new(fields)),
            rows: manifest.rows,
            partitions,
            cache_col,
            sample_col,
            weight_col,
            batches: OnceLock::new(),
            fingerprint: manifest.fingerprint,
            note: manifest.note,
            created_unix_ms: manifest.created_unix_ms,
            parent: manifest.parent,
            mixture: manifest.mixture,
            rows_by_sample: OnceLock::new(),
            partitioned: OnceLock::new(),
            samplers: Mutex::default(),
            _lease: lease,
        })
    }

    /// Content fingerprint (xxh3-128 over rows, column names and column
    /// contents): equal fingerprints mean equal populations.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// What made this snapshot (`update_metadata`, the SQL of `select`, ...).
    pub fn note(&self) -> &str {
        &self.note
    }

    pub fn created_unix_ms(&self) -> u64 {
        self.created_unix_ms
    }

    /// The head this snapshot was committed on, if recorded.
    pub fn parent(&self) -> Option<u64> {
        self.parent
    }

    /// The target shares of groups of rows the population is drawn by.
    pub fn mixture(&self) -> Option<&Mixture> {
        self.mixture.as_ref()
    }

    /// The partitions as the manifest names them: what a commit of the
    /// same rows (another mixture) names again.
    pub fn partition_entries(&self) -> Vec<PartitionEntry> {
        self.partitions.iter().map(|p| p.entry.clone()).collect()
    }

    /// The content hashes of columns `names` in every partition (a column
    /// it lacks contributes nothing): what identifies their values.
    pub fn column_files(&self, names: &[&str]) -> Vec<String> {
        self.partitions
            .iter()
            .flat_map(|p| p.entry.columns.iter())
            .filter(|c| names.contains(&c.name.as_str()))
            .map(|c| format!("{}:{}", c.name, c.hash))
            .collect()
    }

    pub fn number(&self) -> u64 {
        self.number
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The whole population, one record batch per partition over the mapped
    /// files, every chunk of every column checked (once per host, in
    /// parallel).
    pub fn batches(&self) -> Result<&[RecordBatch]> {
        if let Some(batches) = self.batches.get() {
            return Ok(batches);
        }
        let every: Vec<usize> = (0..self.schema.fields().len()).collect();
        let batches = (0..self.partitions.len())
            .map(|part| {
                let arrays = self.partition_columns(part, &every)?;
                RecordBatch::try_new(self.schema.clone(), arrays)
                    .map_err(|e| Error::corrupt(&self.path, e.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(self.batches.get_or_init(|| batches))
    }

    /// Columns `columns` (positions in the schema) of partition `part`,
    /// every chunk of them checked (once per host): what a query that reads
    /// those columns of that partition maps, and nothing else.
    pub fn partition_columns(&self, part: usize, columns: &[usize]) -> Result<Vec<ArrayRef>> {
        let part = &self.partitions[part];
        columns
            .iter()
            .map(|&k| self.column(part, k)?.whole().cloned())
            .collect()
    }

    /// The rows of partition `part`.
    pub fn partition_rows(&self, part: usize) -> usize {
        self.partitions[part].rows
    }

    /// The least and greatest value of column `k` in partition `part`, if
    /// its manifest records them.
    pub fn range(&self, part: usize, k: usize) -> Option<ColumnRange> {
        self.partitions[part].entry.columns.get(k)?.range
    }

    pub fn num_rows(&self) -> usize {
        self.rows
    }

    /// How many partitions hold the rows.
    pub fn num_partitions(&self) -> usize {
        self.partitions.len()
    }

    /// The `(cache_id, sample_id)` column hashes of each partition: an
    /// update whose partition has one of these pairs needs no new check of
    /// its identities (they were checked when this snapshot was written).
    pub fn identity_hashes(&self) -> HashSet<(&str, &str)> {
        self.partitions
            .iter()
            .map(|p| {
                (
                    p.entry.columns[self.cache_col].hash.as_str(),
                    p.entry.columns[self.sample_col].hash.as_str(),
                )
            })
            .collect()
    }

    /// The hash of every decoded fixed-width column without nulls of the
    /// partitions mapped so far, by the address of its values (see
    /// [`Partitioned::new`]). The files are immutable and mapped read-only:
    /// the same bytes at the same address are the same content.
    pub fn prior(&self) -> Prior<'_> {
        let mut known: KnownHashes<'_> = HashMap::new();
        for part in &self.partitions {
            let Some(opened) = part.opened.get() else {
                continue;
            };
            for (k, column) in opened.columns.iter().enumerate() {
                if let Some(array) = column.get().and_then(|c| c.array.get()) {
                    let nullable = self.schema.field(k).is_nullable();
                    let at = address(&array.to_data(), nullable);
                    if at.0 != 0 {
                        known.insert(at, part.entry.columns[k].hash.as_str());
                    }
                }
            }
        }
        Prior {
            partition_rows: self.partitions.iter().map(|p| p.rows).collect(),
            hashes: known,
        }
    }

    /// Partition `part`'s columns, mapped on first use.
    fn opened<'a>(&self, part: &'a Partition) -> Result<&'a Opened> {
        if let Some(opened) = part.opened.get() {
            return Ok(opened);
        }
        let (_, opened) = open_partition(
            self.dir(),
            &self.path,
            part.index,
            &part.entry,
            Some(self.schema.fields()),
            &self.positions(),
        )?;
        Ok(part.opened.get_or_init(|| opened))
    }

    /// Column `k` of partition `part`, mapped on first use.
    pub(super) fn column<'a>(&self, part: &'a Partition, k: usize) -> Result<&'a Column> {
        let opened = self.opened(part)?;
        if let Some(column) = opened.columns[k].get() {
            return Ok(column);
        }
        let (_, column) = open_part_column(
            self.dir(),
            &self.path,
            part.index,
            &part.entry,
            k,
            Some(self.schema.field(k)),
            &self.positions(),
        )?;
        Ok(opened.columns[k].get_or_init(|| column))
    }

    /// Where the columns every partition has are.
    pub(super) fn positions(&self) -> Positions {
        Positions {
            cache: self.cache_col,
            sample: self.sample_col,
            weight: self.weight_col,
        }
    }

    /// The snapshot's directory (its manifest's).
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// The partition of `row` and the row's position in it.
    #[inline]
    fn locate(&self, row: usize) -> (&Partition, usize) {
        let at = match self.partitions.len() {
            1 => 0,
            _ => self.partitions.partition_point(|p| p.start <= row) - 1,
        };
        let part = &self.partitions[at];
        (part, row - part.start)
    }

    /// Rows `rows` of the population (in that order, repeats allowed) as
    /// one record batch of every column: the partitions they lie in are read
    /// (every chunk checked, once per host), then one gather. No thread pool
    /// is involved, so a process forked from one that ran queries may call it.
    pub fn take(&self, rows: &[u64]) -> Result<RecordBatch> {
        let mut parts: Vec<usize> = Vec::new();
        let mut indices = Vec::with_capacity(rows.len());
        for &row in rows {
            let at = usize::try_from(row)
                .ok()
                .filter(|&r| r < self.rows)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "row {row} of snapshot {}, which has {} rows",
                        self.number, self.rows
                    ))
                })?;
            let (part, r) = self.locate(at);
            let slot = match parts.iter().position(|&p| p == part.index) {
                Some(slot) => slot,
                None => {
                    parts.push(part.index);
                    parts.len() - 1
                }
            };
            indices.push((slot, r));
        }
        let every: Vec<usize> = (0..self.schema.fields().len()).collect();
        let batches = parts
            .iter()
            .map(|&part| {
                let arrays = self.partition_columns(part, &every)?;
                RecordBatch::try_new(self.schema.clone(), arrays)
                    .map_err(|e| Error::corrupt(&self.path, e.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        if batches.is_empty() {
            return Ok(RecordBatch::new_empty(self.schema.clone()));
        }
        let refs: Vec<&RecordBatch> = batches.iter().collect();
        Ok(arrow::compute::interleave_record_batch(&refs, &indices)?)
    }

    /// `(cache_id, sample_id)` of row `row`: a loader's read, which checks
    /// only the chunks those two values lie in.
    #[inline]
    pub fn identity(&self, row: usize) -> Result<(i64, i64)> {
        let (part, r) = self.locate(row);
        let part = self.opened(part)?;
        let column = |k: usize| part.columns[k].get().expect("opened with the partition");
        column(self.cache_col).check(&part.ids, r)?;
        column(self.sample_col).check(&part.samples, r)?;
        Ok((part.ids[r], part.samples[r]))
    }

    /// Ask the kernel to start reading, without waiting, what
    /// [`Snapshot::identity`] of each of `rows` will read, after mapping the
    /// partitions they lie in on [`crate::IO_THREADS`]: the reads of a
    /// batch's draws then go to the disk together instead of one after
    /// another. Advice only: a row that cannot be read is left to
    /// `identity` to report.
    pub fn advise_identities(&self, rows: &[usize]) {
        let mut unopened: Vec<&Partition> = rows
            .iter()
            .filter(|&&r| r < self.rows)
            .map(|&r| self.locate(r).0)
            .filter(|part| part.opened.get().is_none())
            .collect();
        unopened.sort_unstable_by_key(|part| part.index);
        unopened.dedup_by_key(|part| part.index);
        // a failure is the draw's to report (`identity`), not advice's
        let _ = crate::try_each(&unopened, crate::IO_THREADS, |part| {
            self.opened(part).map(|_| ())
        });
        for &row in rows.iter().filter(|&&r| r < self.rows) {
            let (part, r) = self.locate(row);
            let Some(part) = part.opened.get() else {
                continue; // it failed to open: `identity` reports that
            };
            let column = |k: usize| part.columns[k].get().expect("opened with the partition");
            column(self.cache_col).advise(&part.ids, r);
            column(self.sample_col).advise(&part.samples, r);
        }
    }

    /// The `cache_id` and `sample_id` columns whole, one pair of slices per
    /// partition, every chunk checked.
    pub fn identities(&self) -> Result<Vec<(&[i64], &[i64])>> {
        self.partitions
            .iter()
            .map(|part| {
                let ids = self.column(part, self.cache_col)?.whole()?;
                let samples = self.column(part, self.sample_col)?.whole()?;
                Ok((
                    ids.as_primitive::<Int64Type>().values().as_ref(),
                    samples.as_primitive::<Int64Type>().values().as_ref(),
                ))
            })
            .collect()
    }

    /// The weight column whole (a slice per partition), every chunk checked.
    pub fn weights(&self) -> Result<Weights<'_>> {
        let parts = self
            .partitions
            .iter()
            .map(|part| {
                Ok(self
                    .column(part, self.weight_col)?
                    .whole()?
                    .as_primitive::<Float64Type>()
                    .values()
                    .as_ref())
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Weights::new(parts))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::catalog::snapshot::partition::Partitioned;
    use crate::catalog::snapshot::write::publish;
    use arrow::array::{Float64Array, Int32Array, Int64Array};
    use arrow::datatypes::{DataType, Float64Type};

    /// Rows of `(cache_id, sample_id, weight)` (the snapshot folder's
    /// tests' population).
    pub(in crate::catalog::snapshot) fn population(rows: &[(i64, i64, f64)]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("cache_id", DataType::Int64, false),
            Field::new("sample_id", DataType::Int64, false),
            Field::new("weight", DataType::Float64, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.2))),
            ],
        )
        .unwrap()
    }

    /// `batch` stored in partitions of `per` rows as the first snapshot of
    /// `dir`; its number.
    fn publish_rows(dir: &Path, batch: RecordBatch, per: usize, note: &str) -> u64 {
        let schema = batch.schema();
        let made = Partitioned::new(&schema, &[batch], per, None, |_, _, _| Ok(())).unwrap();
        publish(dir, &made, 0, note, None, None).unwrap()
    }

    #[test]
    fn a_published_snapshot_opens_with_every_row_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let rows: Vec<(i64, i64, f64)> = (0..10)
            .map(|i| (100 + i / 4, i % 4, 0.5 * i as f64))
            .collect();
        let n = publish_rows(dir.path(), population(&rows), 3, "made\tby a test");
        let snapshot = Snapshot::open(dir.path(), n).unwrap();
        assert_eq!(snapshot.number(), n);
        assert_eq!(
            snapshot.path(),
            dir.path().join(Snapshot::file_name(n)).as_path()
        );
        assert_eq!(snapshot.dir(), dir.path());
        assert_eq!(snapshot.note(), "made\tby a test");
        assert_eq!(snapshot.parent(), None);
        assert!(snapshot.mixture().is_none());
        assert_eq!(snapshot.fingerprint().len(), 32);
        let schema = snapshot.schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["cache_id", "sample_id", "weight"]);

        assert_eq!((snapshot.num_rows(), snapshot.num_partitions()), (10, 4));
        let sizes: Vec<usize> = (0..4).map(|p| snapshot.partition_rows(p)).collect();
        assert_eq!(sizes, [3, 3, 3, 1]);
        assert_eq!(snapshot.range(1, 1), Some(ColumnRange::Int(0, 3)));
        for (row, &(cache, sample, _)) in rows.iter().enumerate() {
            assert_eq!(
                snapshot.identity(row).unwrap(),
                (cache, sample),
                "row {row}"
            );
        }
        // the whole population, partition after partition
        let weights: Vec<f64> = snapshot
            .batches()
            .unwrap()
            .iter()
            .flat_map(|b| b.column(2).as_primitive::<Float64Type>().values().to_vec())
            .collect();
        assert_eq!(weights, rows.iter().map(|r| r.2).collect::<Vec<_>>());
        let samples: Vec<i64> = snapshot
            .identities()
            .unwrap()
            .iter()
            .flat_map(|(_, samples)| samples.iter().copied())
            .collect();
        assert_eq!(samples, rows.iter().map(|r| r.1).collect::<Vec<_>>());
        // each partition's identity columns, as an update compares them
        assert_eq!(snapshot.identity_hashes().len(), 4);
    }

    #[test]
    fn a_snapshot_file_name_is_its_number_in_eight_digits() {
        assert_eq!(Snapshot::file_name(42), "00000042.snapshot");
        for n in [0, 7, 99_999_999] {
            assert_eq!(Snapshot::parse_file_name(&Snapshot::file_name(n)), Some(n));
        }
        for other in [
            "42.snapshot",
            "0000004x.snapshot",
            "+0000042.snapshot",
            "00000042.snapshot.tmp",
            "00000042",
        ] {
            assert_eq!(Snapshot::parse_file_name(other), None, "{other}");
        }
    }

    #[test]
    fn a_snapshot_without_identity_columns_of_the_right_type_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let no_samples = Arc::new(Schema::new(vec![
            Field::new("cache_id", DataType::Int64, false),
            Field::new("weight", DataType::Float64, false),
        ]));
        let batch = RecordBatch::try_new(
            no_samples,
            vec![
                Arc::new(Int64Array::from(vec![1, 1])),
                Arc::new(Float64Array::from(vec![1.0, 2.0])),
            ],
        )
        .unwrap();
        let n = publish_rows(dir.path(), batch, 4, "");
        let opened = Snapshot::open(dir.path(), n);
        assert!(matches!(opened, Err(Error::Corrupt { .. })), "{opened:?}");

        let dir = tempfile::tempdir().unwrap();
        let int32_samples = Arc::new(Schema::new(vec![
            Field::new("cache_id", DataType::Int64, false),
            Field::new("sample_id", DataType::Int32, false),
            Field::new("weight", DataType::Float64, false),
        ]));
        let batch = RecordBatch::try_new(
            int32_samples,
            vec![
                Arc::new(Int64Array::from(vec![1, 1])),
                Arc::new(Int32Array::from(vec![0, 1])),
                Arc::new(Float64Array::from(vec![1.0, 2.0])),
            ],
        )
        .unwrap();
        let n = publish_rows(dir.path(), batch, 4, "");
        let opened = Snapshot::open(dir.path(), n);
        assert!(matches!(opened, Err(Error::Corrupt { .. })), "{opened:?}");
    }

    /// Samples `range` of cache 7, sample `i` weighing `i + 1`.
    fn rows(range: std::ops::Range<i64>) -> RecordBatch {
        let rows: Vec<(i64, i64, f64)> = range.map(|s| (7, s, (s + 1) as f64)).collect();
        population(&rows)
    }

    /// The rows of each partition `batches` are cut into, knowing `prior`.
    fn cut(batches: &[RecordBatch], per: usize, prior: Option<&Prior<'_>>) -> Vec<usize> {
        let schema = batches[0].schema();
        let made = Partitioned::new(&schema, batches, per, prior, |_, _, _| Ok(())).unwrap();
        made.parts().map(|p| p.unwrap().0.num_rows()).collect()
    }

    #[test]
    fn a_population_no_larger_than_its_snapshot_is_cut_as_the_snapshot_was() {
        let dir = tempfile::tempdir().unwrap();
        let batches = [rows(0..10)];
        let n = publish_rows(dir.path(), batches[0].clone(), 4, "");
        let snapshot = Snapshot::open(dir.path(), n).unwrap();
        let sizes: Vec<usize> = (0..snapshot.num_partitions())
            .map(|p| snapshot.partition_rows(p))
            .collect();
        assert_eq!(sizes, [4, 4, 2]);
        // a reweight or a filter is cut as the snapshot is, whatever `per` is now
        let prior = snapshot.prior();
        assert_eq!(cut(&batches, 6, Some(&prior)), [4, 4, 2]);
        assert_eq!(cut(&[rows(0..7)], 6, Some(&prior)), [4, 3]);
        // more rows, or partitions larger than `per` (lowered): every `per` rows
        assert_eq!(cut(&[rows(0..11)], 6, Some(&prior)), [6, 5]);
        assert_eq!(cut(&batches, 3, Some(&prior)), [3, 3, 3, 1]);
        // the snapshot's own columns handed back: the same partitions and files
        let again = Partitioned::new(
            &batches[0].schema(),
            snapshot.batches().unwrap(),
            6,
            Some(&snapshot.prior()),
            |_, _, _| Ok(()),
        )
        .unwrap();
        let stored: Vec<Vec<String>> = snapshot
            .partition_entries()
            .iter()
            .map(|p| p.columns.iter().map(|c| c.hash.clone()).collect())
            .collect();
        let hashed: Vec<Vec<String>> = again.parts().map(|p| p.unwrap().1.to_vec()).collect();
        assert_eq!(hashed, stored);
    }
}

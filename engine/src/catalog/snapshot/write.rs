//! Writing a snapshot: storing each partition's column files (only those
//! not stored yet) and publishing the manifest that names them.

use std::collections::HashMap;
use std::path::Path;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Float64Type;

use super::columns::{store_columns, StoredChecksums};
use super::manifest::{read_manifest, write_manifest, ColumnEntry, PartitionEntry};
use super::mixture::Mixture;
use super::partition::Partitioned;
use crate::catalog::ranges::ColumnRange;
use crate::{Error, Result};

/// Write `population` as the first free snapshot number at or above
/// `number`, created only if absent (a number another writer took is
/// skipped, never overwritten). `parent` is the head it is committed on.
/// Returns the number. The caller makes it the head (see `commit`). Only
/// column files not stored yet are written: an update that changes a few
/// partitions writes only their changed columns.
pub fn publish(
    dir: &Path,
    population: &Partitioned,
    number: u64,
    note: &str,
    parent: Option<u64>,
    mixture: Option<&Mixture>,
) -> Result<u64> {
    let mut known = Known::of_parent(dir, parent);
    let partitions = population
        .parts()
        .map(|part| {
            let (batch, hashes) = part?;
            store_partition(dir, &batch, hashes, &mut known)
        })
        .collect::<Result<Vec<_>>>()?;
    write_manifest(dir, &partitions, number, note, parent, mixture)
}

/// What a writer knows of column files already stored, by content hash:
/// their checksums, the mass of each weight column and the range of each
/// column (from a parent's manifest and the partitions stored before).
#[derive(Debug, Default)]
pub(in crate::catalog) struct Known {
    checksums: HashMap<String, StoredChecksums>,
    masses: HashMap<String, f64>,
    ranges: HashMap<String, Option<ColumnRange>>,
    /// Files written are not recorded as checked for the host: they are
    /// linked elsewhere before anyone reads them, which changes the file
    /// version such a record names (see `assemble::prepare`).
    pub(in crate::catalog) unrecorded: bool,
}

impl Known {
    /// What the manifest of snapshot `parent` in `dir` records (nothing if
    /// it cannot be read: every file is then checked from disk).
    pub(in crate::catalog) fn of_parent(dir: &Path, parent: Option<u64>) -> Known {
        let mut known = Known::default();
        if let Some(manifest) = parent.and_then(|p| read_manifest(dir, p).ok()) {
            known.add(&manifest.partitions);
        }
        known
    }

    /// The checksums of the column files known, by content hash.
    pub(in crate::catalog) fn checksums(&self) -> &HashMap<String, StoredChecksums> {
        &self.checksums
    }

    /// Learn what `partitions` (as a manifest names them) record.
    pub(in crate::catalog) fn add(&mut self, partitions: &[PartitionEntry]) {
        for part in partitions {
            for c in &part.columns {
                if let (Some(crc), Some(len)) = (c.crc, c.len) {
                    self.checksums.insert(c.hash.clone(), (crc, len));
                }
                if c.range.is_some() {
                    self.ranges.insert(c.hash.clone(), c.range);
                }
            }
            let weight = part.columns.iter().find(|c| c.name == "weight");
            if let (Some(mass), Some(weight)) = (part.mass, weight) {
                self.masses.insert(weight.hash.clone(), mass);
            }
        }
    }
}

/// Store the columns of partition `batch` (content hashes `hashes`) under
/// `dir/columns`, writing only those not stored yet, and describe it as a
/// manifest names it: rows, weight mass, and each column's file and range.
pub(in crate::catalog) fn store_partition(
    dir: &Path,
    batch: &RecordBatch,
    hashes: &[String],
    known: &mut Known,
) -> Result<PartitionEntry> {
    let schema = batch.schema();
    let weight_at = schema
        .index_of("weight")
        .map_err(|_| Error::invalid("a population needs a weight column"))?;
    let stored = store_columns(dir, batch, hashes, &known.checksums, !known.unrecorded)?;
    let weight_hash = &hashes[weight_at];
    let mass = match known.masses.get(weight_hash) {
        Some(&mass) => mass,
        None => {
            let weights = batch
                .column(weight_at)
                .as_primitive_opt::<Float64Type>()
                .ok_or_else(|| Error::invalid("a population's weight column is Float64"))?;
            let mass = crate::sample::mass(weights.values());
            known.masses.insert(weight_hash.clone(), mass);
            mass
        }
    };
    let mut columns = Vec::with_capacity(stored.len());
    for (k, (field, (hash, crc, len))) in schema.fields().iter().zip(stored).enumerate() {
        known.checksums.insert(hash.clone(), (crc, len));
        let range = *known
            .ranges
            .entry(hash.clone())
            .or_insert_with(|| ColumnRange::of(batch.column(k)));
        columns.push(ColumnEntry {
            hash,
            name: field.name().clone(),
            crc: Some(crc),
            len: Some(len),
            range,
        });
    }
    Ok(PartitionEntry {
        rows: batch.num_rows(),
        mass: Some(mass),
        columns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::snapshot::columns::{column_hash, COLUMNS_DIR};
    use crate::catalog::snapshot::read::tests::population;

    /// Samples `range` of cache 7, sample `i` weighing `i + 1`.
    fn rows(range: std::ops::Range<i64>) -> RecordBatch {
        let rows: Vec<(i64, i64, f64)> = range.map(|s| (7, s, (s + 1) as f64)).collect();
        population(&rows)
    }

    #[test]
    fn a_stored_partition_records_its_rows_mass_ranges_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let batch = rows(0..5);
        let hashes: Vec<String> = (batch.schema().fields().iter().zip(batch.columns()))
            .map(|(f, a)| column_hash(f, a))
            .collect();
        let mut known = Known::default();
        let entry = store_partition(dir.path(), &batch, &hashes, &mut known).unwrap();
        assert_eq!(entry.rows, 5);
        // weights 1 + 2 + 3 + 4 + 5
        assert_eq!(entry.mass, Some(15.0));
        let names: Vec<&str> = entry.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["cache_id", "sample_id", "weight"]);
        assert_eq!(entry.columns[0].range, Some(ColumnRange::Int(7, 7)));
        assert_eq!(entry.columns[1].range, Some(ColumnRange::Int(0, 4)));
        assert_eq!(entry.columns[2].range, Some(ColumnRange::Float(1.0, 5.0)));
        for (c, hash) in entry.columns.iter().zip(&hashes) {
            assert_eq!(&c.hash, hash);
            let file = dir.path().join(COLUMNS_DIR).join(format!("{hash}.arrow"));
            assert_eq!(std::fs::metadata(&file).unwrap().len(), c.len.unwrap());
            let checksums = known.checksums().get(hash).copied();
            assert_eq!(checksums, Some((c.crc.unwrap(), c.len.unwrap())));
        }
        // a writer on this snapshot knows its files from the manifest
        let n =
            write_manifest(dir.path(), std::slice::from_ref(&entry), 0, "", None, None).unwrap();
        assert_eq!(
            Known::of_parent(dir.path(), Some(n)).checksums(),
            known.checksums()
        );
        // and nothing of a parent it cannot read
        assert!(Known::of_parent(dir.path(), Some(n + 1))
            .checksums()
            .is_empty());
        // a population without weights is refused
        let unweighted = batch.project(&[0, 1]).unwrap();
        let refused = store_partition(dir.path(), &unweighted, &hashes[..2], &mut known);
        assert!(
            matches!(refused, Err(Error::InvalidInput { .. })),
            "{refused:?}"
        );
    }
}

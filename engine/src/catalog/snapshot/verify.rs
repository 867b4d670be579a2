//! Checking stored files against their manifest: each column file's
//! length and CRC-32C (once per version of the file per process), its chunk
//! table, and the alias tables derived from the weights.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::columns::COLUMNS_DIR;
use super::manifest::{read_manifest, SnapshotManifest};
use crate::sample::AliasTable;
use crate::store::checksum::crc32c;
use crate::store::chunks::{self, ChunkTable};
use crate::store::ipc;
use crate::Error;

/// Every problem of snapshot `number`'s manifest and column files, each file
/// read and checked in full (the per-process cache of verified files is not
/// consulted). With `tables`, also every chunk table (`<hash>.arrow.chunks`)
/// of a good column file that is present but does not describe it: damaged,
/// stale, or with chunk checksums the file does not have. Readers ignore a
/// table that does not match the manifest (they check the file whole), but
/// one sealed with wrong chunk checksums would fail reads of a good file. A
/// missing table is no problem (the file is checked whole). Tables in
/// `tables` are skipped and added there (snapshots share columns).
pub fn verify_files(
    dir: &Path,
    number: u64,
    mut tables: Option<&mut std::collections::HashSet<PathBuf>>,
) -> Vec<Error> {
    let manifest = match read_manifest(dir, number) {
        Ok(m) => m,
        Err(e) => return vec![e],
    };
    let mut problems = Vec::new();
    // partitions of equal content share a file: each is read once
    let mut seen = HashSet::new();
    for entry in manifest.columns().filter(|c| seen.insert(c.hash.as_str())) {
        let file = dir.join(COLUMNS_DIR).join(format!("{}.arrow", entry.hash));
        // mapped, not read into memory: a file's pages are the page
        // cache's, which the kernel takes back after the check
        let checked = crate::store::fs::map_buffer(&file, "snapshot column").and_then(|bytes| {
            match (entry.crc, entry.len) {
                (Some(crc), Some(len)) if bytes.len() as u64 != len || crc32c(&bytes) != crc => {
                    return Err(Error::corrupt(
                        &file,
                        format!("snapshot column file does not match its manifest ({number:08})"),
                    ))
                }
                (Some(crc), Some(len)) => {
                    if let Some(seen) = tables.as_deref_mut() {
                        problems.extend(check_table(&file, &bytes, len, crc, seen));
                    }
                }
                _ => {}
            }
            ipc::decode(&file, bytes).map(|_| ())
        });
        if let Err(e) = checked {
            problems.push(e);
        }
    }
    problems.extend(verify_alias_tables(dir, &manifest));
    problems
}

/// The problems of the stored alias tables of `manifest`'s weight columns
/// (derived data: each damaged one is removed, to be built again from the
/// weights when a draw next needs it, and reported).
fn verify_alias_tables(dir: &Path, manifest: &SnapshotManifest) -> Vec<Error> {
    let mut problems = Vec::new();
    let mut seen = HashSet::new();
    for part in &manifest.partitions {
        let Some(weight) = part.columns.iter().find(|c| c.name == "weight") else {
            continue;
        };
        let table = dir.join(COLUMNS_DIR).join(format!("{}.alias", weight.hash));
        if !seen.insert(weight.hash.as_str()) || !table.exists() {
            continue;
        }
        if let Err(e) = AliasTable::verify(&table, part.rows) {
            let removed = std::fs::remove_file(&table).is_ok();
            problems.push(Error::corrupt(
                &table,
                format!(
                    "alias table (derived from the weights) is damaged: {e}; {}",
                    match removed {
                        true => "removed, it is built again when a weighted draw needs it",
                        false => "remove it: it is built again when a weighted draw needs it",
                    }
                ),
            ));
        }
    }
    problems
}

/// The problem of good column file `file` (its `bytes`, of length `len` and
/// CRC-32C `crc`) with its chunk table, if the table is present, not in
/// `seen`, and does not describe it.
fn check_table(
    file: &Path,
    bytes: &[u8],
    len: u64,
    crc: u32,
    seen: &mut std::collections::HashSet<PathBuf>,
) -> Option<Error> {
    let table = ChunkTable::sidecar(file);
    if !seen.insert(table.clone()) {
        return None;
    }
    let stored = std::fs::read(&table).ok()?;
    let describes =
        ChunkTable::decode(&stored, len, crc).is_some_and(|t| t.crcs == chunks::chunk_crcs(bytes));
    (!describes).then(|| {
        Error::corrupt(
            &table,
            format!("chunk table does not describe its column file {} (readers then check that file whole; an update that keeps the column writes a new table)", file.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::snapshot::{column_hash, store_partition, write_manifest, Known};
    use crate::sample::Weights;
    use arrow::array::{Float64Array, Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    /// Snapshot 0 of `dir`: one partition of three rows. The path of its
    /// weight column file.
    fn write_snapshot(dir: &Path) -> PathBuf {
        let schema = Arc::new(Schema::new(vec![
            Field::new("cache_id", DataType::Int64, false),
            Field::new("sample_id", DataType::Int64, false),
            Field::new("weight", DataType::Float64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![1, 1, 1])),
                Arc::new(Int64Array::from(vec![0, 1, 2])),
                Arc::new(Float64Array::from(vec![1.0, 2.0, 3.0])),
            ],
        )
        .unwrap();
        let hashes: Vec<String> = schema
            .fields()
            .iter()
            .zip(batch.columns())
            .map(|(f, a)| column_hash(f, a))
            .collect();
        let entry = store_partition(dir, &batch, &hashes, &mut Known::default()).unwrap();
        write_manifest(dir, &[entry], 0, "", None, None).unwrap();
        dir.join(COLUMNS_DIR).join(format!("{}.arrow", hashes[2]))
    }

    #[test]
    fn verification_finds_a_damaged_column_file() {
        let dir = tempfile::tempdir().unwrap();
        let weight = write_snapshot(dir.path());
        assert!(verify_files(dir.path(), 0, None).is_empty());
        let mut bytes = std::fs::read(&weight).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x10;
        std::fs::write(&weight, &bytes).unwrap();
        let problems = verify_files(dir.path(), 0, None);
        assert!(
            matches!(problems.as_slice(), [Error::Corrupt { path, .. }] if *path == weight),
            "{problems:?}"
        );
        // a snapshot that is not there is one problem
        let missing = verify_files(dir.path(), 1, None);
        assert!(
            matches!(missing.as_slice(), [Error::NotFound { .. }]),
            "{missing:?}"
        );
    }

    #[test]
    fn verification_finds_a_chunk_table_that_does_not_describe_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let weight = write_snapshot(dir.path());
        let mut tables = HashSet::new();
        assert!(verify_files(dir.path(), 0, Some(&mut tables)).is_empty());
        // one table a column file
        assert_eq!(tables.len(), 3);
        let sidecar = ChunkTable::sidecar(&weight);
        assert!(tables.contains(&sidecar));
        let mut bytes = std::fs::read(&sidecar).unwrap();
        bytes[20] ^= 0x01;
        std::fs::write(&sidecar, &bytes).unwrap();
        // tables checked before (another snapshot's) are not checked again
        assert!(verify_files(dir.path(), 0, Some(&mut tables)).is_empty());
        let problems = verify_files(dir.path(), 0, Some(&mut HashSet::new()));
        assert!(
            matches!(problems.as_slice(), [Error::Corrupt { path, .. }] if *path == sidecar),
            "{problems:?}"
        );
        // the column file itself is good
        assert!(verify_files(dir.path(), 0, None).is_empty());
    }

    #[test]
    fn a_damaged_alias_table_is_removed_and_reported_and_a_good_one_kept() {
        let dir = tempfile::tempdir().unwrap();
        let weight = write_snapshot(dir.path());
        let table = weight.with_extension("alias");
        let manifest = read_manifest(dir.path(), 0).unwrap();
        AliasTable::build_stored(&table, &Weights::from(&[1.0, 2.0, 3.0])).unwrap();
        assert!(verify_alias_tables(dir.path(), &manifest).is_empty());
        assert!(table.exists());

        std::fs::write(&table, b"not an alias table").unwrap();
        let problems = verify_alias_tables(dir.path(), &manifest);
        assert!(
            matches!(problems.as_slice(), [Error::Corrupt { path, .. }] if *path == table),
            "{problems:?}"
        );
        // derived data: removed, to be built again from the weights
        assert!(!table.exists());
        assert!(verify_alias_tables(dir.path(), &manifest).is_empty());
    }
}

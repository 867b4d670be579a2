//! A cache's files besides its shards, and its publication: the index and
//! the attributes with their chunk tables, the manifest with a new cache id,
//! fsynced and renamed into place.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use arrow::array::{ArrayRef, Int64Array, RecordBatch, RecordBatchOptions};
use arrow::datatypes::{DataType, Field, Schema};

use crate::store::checksum::crc32c;
use crate::store::chunks::{self, ChunkTable};
use crate::store::codec::Codec;
use crate::store::format::{
    encode_index_header, IndexEntry, ATTRIBUTES_FILE, INDEX_FILE, MANIFEST_FILE,
};
use crate::store::fs::{sync_dir, write_atomic};
use crate::store::host::records;
use crate::store::ipc;
use crate::store::manifest::Manifest;
use crate::{Error, Result};

/// The manifest of a new cache `name` whose index and attributes are
/// written: a new cache id, created now.
pub(super) fn new_manifest(
    name: &str,
    records: u64,
    codec: Codec,
    shard_bytes: Vec<u64>,
    index_crc32c: u32,
    attributes: &ipc::Written,
) -> Manifest {
    Manifest {
        name: name.to_string(),
        cache_id: new_cache_id(name),
        records,
        codec,
        shard_bytes,
        index_crc32c,
        attributes_bytes: attributes.len,
        attributes_crc32c: attributes.crc,
        created_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
    }
}

/// Write `manifest` into `staging` (which holds the rest of its cache) and
/// publish it under its name in `root`: fsynced, renamed, `root` fsynced.
pub(super) fn publish(
    root: &Path,
    staging: &Path,
    manifest: Manifest,
) -> Result<(Manifest, PathBuf)> {
    write_atomic(&staging.join(MANIFEST_FILE), manifest.encode().as_bytes())?;
    sync_dir(staging)?;
    let final_dir = root.join(&manifest.name);
    if final_dir.exists() {
        return Err(Error::invalid(format!(
            "a cache named {:?} was published at {} while this one was being written",
            manifest.name,
            final_dir.display()
        )));
    }
    fs::rename(staging, &final_dir).map_err(Error::io(&final_dir))?;
    sync_dir(root)?;
    Ok((manifest, final_dir))
}

/// The `attributes` of source `name`'s `records` records: one row per record
/// (or no columns), under names that are valid and not reserved.
pub(super) fn check_attributes(name: &str, records: u64, attributes: &RecordBatch) -> Result<()> {
    if records == 0 {
        return Err(Error::invalid(format!(
            "source {name:?} yielded no samples"
        )));
    }
    if attributes.num_columns() > 0 && attributes.num_rows() as u64 != records {
        return Err(Error::invalid(format!(
            "source {name:?}: {} attribute rows for {} records",
            attributes.num_rows(),
            records
        )));
    }
    for field in attributes.schema().fields() {
        crate::store::check_column_name(field.name())
            .map_err(|e| Error::invalid(format!("source {name:?}: metadata key: {e}")))?;
        if crate::store::RESERVED_COLUMNS.contains(&field.name().as_str()) {
            return Err(Error::invalid(format!(
                "source {name:?}: metadata key {:?} is reserved (cache_id, sample_id and weight are set by DatasetRT)",
                field.name()
            )));
        }
    }
    Ok(())
}

/// Write the index of `index_entries` into `staging`, and its chunk table; the
/// CRC-32C of the entries.
pub(super) fn write_index(staging: &Path, index_entries: &[IndexEntry]) -> Result<u32> {
    let mut body = Vec::with_capacity(index_entries.len() * 32);
    for e in index_entries {
        body.extend_from_slice(&e.encode());
    }
    let index_crc32c = crc32c(&body);
    let mut index = encode_index_header(index_entries.len() as u64, index_crc32c).to_vec();
    index.extend_from_slice(&body);
    let index_path = staging.join(INDEX_FILE);
    write_atomic(&index_path, &index)?;
    // chunk tables: a reader checks the chunks it reads, once per host,
    // instead of every file whole at every open (see reader.rs)
    let entries = ChunkTable {
        file_len: body.len() as u64,
        file_crc: index_crc32c,
        crcs: chunks::chunk_crcs(&body),
    };
    entries.write_sidecar(&index_path)?;
    records::record_checked(&index_path, entries.crcs.len());
    Ok(index_crc32c)
}

/// Write the attributes of the `records` records into `staging` (a
/// `sample_id` column, then `attributes`' columns), and its chunk table.
pub(super) fn write_attributes(
    staging: &Path,
    records: u64,
    attributes: &RecordBatch,
) -> Result<ipc::Written> {
    let n = records as usize;
    let mut fields: Vec<Arc<Field>> =
        vec![Arc::new(Field::new("sample_id", DataType::Int64, false))];
    let mut columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from_iter_values(0..n as i64))];
    fields.extend(attributes.schema().fields().iter().cloned());
    columns.extend(attributes.columns().iter().cloned());
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(n)),
    )?;
    let attributes_path = staging.join(ATTRIBUTES_FILE);
    let written = ipc::write_temp(&attributes_path, &schema, &[batch])?;
    fs::rename(&written.path, &attributes_path).map_err(Error::io(&attributes_path))?;
    let table = ChunkTable::of_file(&attributes_path).map_err(Error::io(&attributes_path))?;
    if (table.file_len, table.file_crc) != (written.len, written.crc) {
        return Err(Error::io(&attributes_path)(std::io::Error::other(
            "the attributes file reads back other than it was written",
        )));
    }
    table.write_sidecar(&attributes_path)?;
    records::record_checked(&attributes_path, table.crcs.len());
    Ok(written)
}

fn new_cache_id(name: &str) -> i64 {
    use std::hash::BuildHasher;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let h =
        std::collections::hash_map::RandomState::new().hash_one((name, nanos, std::process::id()));
    // 53 bits: exact in float64 and JSON, positive in every integer type.
    (h >> 11) as i64
}

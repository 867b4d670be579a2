//! Reading score logs: the segments of one run, each checked, and the newest
//! row of each draw (`epoch`, `position`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::{Path, PathBuf};

use arrow::array::{Array, BooleanArray, RecordBatch, UInt64Array};
use arrow::compute::{concat_batches, filter_record_batch};
use arrow::datatypes::Schema;

use super::SEGMENT_SCHEMA;
use crate::store::checksum::crc32c;
use crate::store::{fs as sfs, ipc};
use crate::{Error, Result};

/// What an Arrow IPC file starts (and ends) with.
const MAGIC: &[u8] = b"ARROW1";

/// The published segments of one run's folder, oldest first: by name, which
/// starts with the time the segment was written (20 digits). A temporary
/// file (a leading dot) is not a segment yet; no folder, no segments.
pub fn segments(run_dir: &Path) -> Result<Vec<PathBuf>> {
    let io = |source| Error::Io {
        path: run_dir.to_path_buf(),
        source,
    };
    let entries = match std::fs::read_dir(run_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let name = entry.map_err(io)?.file_name();
        let bytes = name.as_encoded_bytes();
        if bytes.ends_with(b".arrow") && !bytes.starts_with(b".") {
            names.push(name);
        }
    }
    names.sort();
    Ok(names.into_iter().map(|n| run_dir.join(n)).collect())
}

/// The rows of one segment file, checked: a whole Arrow IPC file (its
/// leading and trailing magic, a footer and arrays that decode) of the
/// segment columns; else `Corrupt` naming it (`NotFound` if it is gone).
pub fn read_segment(path: &Path) -> Result<RecordBatch> {
    let buffer = sfs::map_buffer(path, "score log segment")?;
    if let Some(sealed) = sealed_crc(path) {
        let found = crc32c(buffer.as_slice());
        if found != sealed {
            return Err(Error::corrupt(
                path,
                format!(
                    "its CRC-32C is {found:08x}, not the {sealed:08x} its name was sealed \
                     with: the segment was damaged after it was written"
                ),
            ));
        }
    }
    if !buffer.as_slice().starts_with(MAGIC) {
        return Err(Error::corrupt(
            path,
            format!(
                "not a whole Arrow IPC file ({} bytes): cut short or overwritten",
                buffer.len()
            ),
        ));
    }
    let (schema, batches) = ipc::decode(path, buffer)?;
    if columns(&schema) != columns(&SEGMENT_SCHEMA) {
        return Err(Error::corrupt(
            path,
            format!(
                "its columns are {:?}, not a segment's {:?}",
                columns(&schema),
                columns(&SEGMENT_SCHEMA)
            ),
        ));
    }
    let batches: Vec<RecordBatch> = batches
        .into_iter()
        .map(|b| b.with_schema(SEGMENT_SCHEMA.clone()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::corrupt(path, format!("its columns may hold nulls: {e}")))?;
    Ok(concat_batches(&SEGMENT_SCHEMA, &batches)?)
}

/// The CRC-32C a segment's name seals it with (`...-c<8 hex digits>.arrow`);
/// `None` for a segment written before segments were sealed.
fn sealed_crc(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?.strip_suffix(".arrow")?;
    let (_, hex) = name.rsplit_once("-c")?;
    let hex_digits = hex.len() == 8 && hex.bytes().all(|b| b.is_ascii_hexdigit());
    hex_digits.then(|| u32::from_str_radix(hex, 16).ok())?
}

/// A schema's columns as (name, type) pairs.
fn columns(schema: &Schema) -> Vec<(String, String)> {
    schema
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().to_string()))
        .collect()
}

/// The rows of one run, in the order they were flushed, each draw
/// (`epoch`, `position`) keeping its newest row: that of the last segment,
/// and within one segment the last one appended (a step replayed after a
/// resume replaces its rows). `None` when the run has no segment.
pub fn read_run(run_dir: &Path) -> Result<Option<RecordBatch>> {
    let paths = segments(run_dir)?;
    if paths.is_empty() {
        return Ok(None);
    }
    let parts = paths
        .iter()
        .map(|p| read_segment(p))
        .collect::<Result<Vec<_>>>()?;
    let rows = concat_batches(&SEGMENT_SCHEMA, &parts)?;
    let u64s = |i: usize| {
        rows.column(i)
            .as_any()
            .downcast_ref::<UInt64Array>()
            .expect("segment columns are checked")
            .clone()
    };
    let (epoch, position) = (u64s(0), u64s(1));
    let keep = newest(rows.num_rows(), |i| {
        (u128::from(epoch.value(i)) << 64) | u128::from(position.value(i))
    });
    Ok(Some(match keep {
        None => rows, // no draw logged twice
        Some(keep) => filter_record_batch(&rows, &keep)?,
    }))
}

/// Which of `n` rows are the last of their key (`None`: every one is).
fn newest(n: usize, key: impl Fn(usize) -> u128) -> Option<BooleanArray> {
    let mut last: HashMap<u128, usize, BuildHasherDefault<KeyHasher>> =
        HashMap::with_capacity_and_hasher(n, BuildHasherDefault::default());
    for i in 0..n {
        last.insert(key(i), i);
    }
    (last.len() != n).then(|| (0..n).map(|i| Some(last[&key(i)] == i)).collect())
}

/// A multiplicative hash of integer keys (draw positions are dense: no
/// attacker picks them, and SipHash costs more than the lookup).
#[derive(Default)]
pub(super) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u128(&mut self, key: u128) {
        let folded = (key as u64) ^ ((key >> 64) as u64).rotate_left(29);
        self.0 = (self.0 ^ folded)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(26);
    }

    fn write_u64(&mut self, key: u64) {
        self.write_u128(u128::from(key));
    }

    // identities `(cache_id, sample_id)` hash as two words, not 16 bytes
    fn write_i64(&mut self, key: i64) {
        self.write_u64(key as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Positions, ScoreWriter};
    use super::*;

    fn log(dir: &Path, rows: &[(u64, u64, f64)]) {
        let writer = ScoreWriter::new(dir.to_path_buf(), 0, "0", 1 << 20).unwrap();
        for &(epoch, position, value) in rows {
            writer
                .append(
                    epoch,
                    Positions::From(position),
                    &[1],
                    &[position as i64],
                    &[value],
                )
                .unwrap();
        }
        writer.flush().unwrap();
    }

    fn values(batch: &RecordBatch) -> Vec<f64> {
        let v = batch.column(4).as_any();
        let v = v.downcast_ref::<arrow::array::Float64Array>().unwrap();
        v.values().to_vec()
    }

    #[test]
    fn a_draw_logged_again_keeps_its_newest_row_in_flush_order() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_run(&dir.path().join("none")).unwrap().is_none());
        log(dir.path(), &[(0, 0, 1.0), (0, 1, 2.0), (0, 0, 3.0)]);
        log(dir.path(), &[(0, 1, 4.0), (1, 0, 5.0)]);
        let rows = read_run(dir.path()).unwrap().unwrap();
        // (0, 0): the later row of the first segment; (0, 1): the second segment's
        assert_eq!(values(&rows), vec![3.0, 4.0, 5.0]);
    }

    #[test]
    fn a_flipped_bit_in_a_logged_value_is_corrupt_not_a_weight() {
        let dir = tempfile::tempdir().unwrap();
        log(dir.path(), &[(0, 0, 1.0), (0, 1, 2.0)]);
        let path = segments(dir.path()).unwrap().pop().unwrap();
        assert!(sealed_crc(&path).is_some(), "{path:?}");
        let mut raw = std::fs::read(&path).unwrap();
        // the f64 2.0 (0x4000000000000000): its top byte, in the value buffer
        let two = 2.0f64.to_le_bytes();
        let at = raw.windows(8).position(|w| w == two).unwrap();
        raw[at + 7] ^= 0x01;
        std::fs::write(&path, raw).unwrap();
        match read_run(dir.path()) {
            Err(Error::Corrupt {
                path: p, detail, ..
            }) => {
                assert_eq!(p, path);
                assert!(detail.contains("CRC-32C"), "{detail}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn a_segment_from_before_seals_is_still_read() {
        let dir = tempfile::tempdir().unwrap();
        log(dir.path(), &[(0, 0, 1.5)]);
        let path = segments(dir.path()).unwrap().pop().unwrap();
        let name = path.file_name().unwrap().to_str().unwrap();
        let old = dir
            .path()
            .join(format!("{}.arrow", &name[..name.len() - 16]));
        std::fs::rename(&path, &old).unwrap();
        assert_eq!(sealed_crc(&old), None);
        assert_eq!(values(&read_run(dir.path()).unwrap().unwrap()), vec![1.5]);
    }

    #[test]
    fn a_damaged_segment_is_corrupt_and_named() {
        let dir = tempfile::tempdir().unwrap();
        log(dir.path(), &[(0, 0, 1.0)]);
        let path = segments(dir.path()).unwrap().pop().unwrap();
        let whole = std::fs::read(&path).unwrap();
        for damaged in [
            &whole[..whole.len() / 2],
            &whole[..whole.len() - 1],
            &[][..],
        ] {
            std::fs::write(&path, damaged).unwrap();
            match read_run(dir.path()) {
                Err(Error::Corrupt { path: p, .. }) => assert_eq!(p, path),
                other => panic!("expected Corrupt, got {other:?}"),
            }
        }
    }
}

//! Column files: one Arrow IPC file per column of a partition, named by the
//! xxh3-128 hash of its content, checked chunk by chunk as it is read (its
//! chunk table, a sidecar) or whole when it has none.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arrow::array::{Array, ArrayData, ArrayRef, RecordBatch};
use arrow::buffer::ScalarBuffer;
use arrow::datatypes::{DataType, Field, Schema};
use xxhash_rust::xxh3::Xxh3;

use super::check::{mark_verified, verify_column};
use super::manifest::{read_manifest, ColumnEntry, PartitionEntry};
use crate::store::chunks::{self, ChunkCheck, ChunkTable};
use crate::store::host::records;
use crate::store::{fs, ipc};
use crate::{Error, Result};

pub const COLUMNS_DIR: &str = "columns";

/// Map column `k` of partition `i` (`entry`) of the snapshot at `path`:
/// its field must equal `expected` (partition 0's) when given; the identity
/// and weight columns are decoded here (of the right type and length,
/// without nulls).
pub(super) fn open_part_column(
    dir: &Path,
    path: &Path,
    i: usize,
    entry: &PartitionEntry,
    k: usize,
    expected: Option<&Field>,
    at: &Positions,
) -> Result<(Field, Column)> {
    let bad = |detail: String| Error::corrupt(path, detail);
    let (field, column) = open_column(dir, &entry.columns[k])?;
    if let Some(expected) = expected.filter(|e| **e != field) {
        return Err(bad(format!(
            "column {:?} is {} in partition {i}, {} in partition 0",
            field.name(),
            field.data_type(),
            expected.data_type()
        )));
    }
    let required = [
        (at.cache, "cache_id", DataType::Int64),
        (at.sample, "sample_id", DataType::Int64),
        (at.weight, "weight", DataType::Float64),
    ];
    if let Some((_, name, ty)) = required.into_iter().find(|r| r.0 == k) {
        if *field.data_type() != ty {
            return Err(bad(format!(
                "snapshot lacks a non-null {ty} column {name:?}"
            )));
        }
        let array = column.decode()?;
        if array.len() != entry.rows || array.null_count() != 0 {
            return Err(bad(format!(
                "column {name:?} has {} rows ({} null), partition {i} of the snapshot {}",
                array.len(),
                array.null_count(),
                entry.rows
            )));
        }
    }
    Ok((field, column))
}

/// One mapped column file of a snapshot and how its bytes are checked.
#[derive(Debug)]
pub(super) struct Column {
    file: PathBuf,
    /// The whole file, mapped.
    buffer: arrow::buffer::Buffer,
    /// `None`: the file was checked whole when the snapshot was opened (it
    /// has no chunk table: written before chunked checksums, or its sidecar
    /// was lost). Otherwise each chunk is checked before it is first read.
    chunks: Option<ChunkCheck>,
    /// The decoded array: at open for the columns the loader reads
    /// (identities, weights), on first use for the others.
    pub(super) array: OnceLock<ArrayRef>,
}

impl Column {
    /// The array, its every chunk checked.
    pub(super) fn whole(&self) -> Result<&ArrayRef> {
        if let Some(chunks) = &self.chunks {
            chunks.check_all(chunks::check_threads())?;
        }
        fs::advise(&self.buffer, fs::Access::Whole);
        self.decode()
    }

    /// The array, decoded on first use (only its metadata is read).
    fn decode(&self) -> Result<&ArrayRef> {
        if let Some(array) = self.array.get() {
            return Ok(array);
        }
        let array = decode_column(&self.file, self.buffer.clone())?;
        Ok(self.array.get_or_init(|| array))
    }

    /// The bytes of the mapping `values[row]` (this column's decoded Int64
    /// values) lies in; `None` if the decoder copied the values out of it.
    #[inline]
    fn place(&self, values: &ScalarBuffer<i64>, row: usize) -> Option<std::ops::Range<usize>> {
        let at = (values.inner().as_ptr() as usize).wrapping_sub(self.buffer.as_ptr() as usize);
        (at < self.buffer.len()).then(|| at + row * 8..at + row * 8 + 8)
    }

    /// Check value `row` of `values` (this column's decoded Int64 values)
    /// before it is read.
    #[inline]
    pub(super) fn check(&self, values: &ScalarBuffer<i64>, row: usize) -> Result<()> {
        let Some(chunks) = &self.chunks else {
            return Ok(());
        };
        match self.place(values, row) {
            Some(bytes) => chunks.check(bytes),
            // the decoder copied the values out of the mapping: check it all
            None => chunks.check_all(chunks::check_threads()),
        }
    }

    /// Ask the kernel to start reading what [`Column::check`] and a read
    /// of `values[row]` will touch, without waiting (advice only).
    pub(super) fn advise(&self, values: &ScalarBuffer<i64>, row: usize) {
        // without a chunk table the mapping is read with the kernel's read-ahead
        if let (Some(chunks), Some(bytes)) = (&self.chunks, self.place(values, row)) {
            chunks.advise(bytes);
        }
    }
}

/// The one array of a column file's bytes.
fn decode_column(file: &Path, buffer: arrow::buffer::Buffer) -> Result<ArrayRef> {
    one_column(file, ipc::decode_verified(file, buffer)?.1)
}

fn one_column(file: &Path, batches: Vec<RecordBatch>) -> Result<ArrayRef> {
    match batches.as_slice() {
        [one] if one.num_columns() == 1 => Ok(one.column(0).clone()),
        _ => Err(Error::corrupt(file, "expected one batch with one column")),
    }
}

/// Map the column file of manifest `entry` in `dir`: its field (named as
/// the manifest names it) and the column.
fn open_column(dir: &Path, entry: &ColumnEntry) -> Result<(Field, Column)> {
    let file = dir.join(COLUMNS_DIR).join(format!("{}.arrow", entry.hash));
    let buffer = fs::map_buffer(&file, "snapshot column")?;
    let table = match (entry.crc, entry.len) {
        (Some(crc), Some(len)) if buffer.len() as u64 == len => {
            ChunkTable::read_sidecar(&file, len, crc)
        }
        _ => None,
    };
    let (schema, column) = match table {
        Some(table) => {
            // read in place a few values at a time (a loader's draws, the
            // header) until a reader asks for it whole (`Column::whole`)
            fs::advise(&buffer, fs::Access::Sparse);
            let check = ChunkCheck::new(
                &file,
                buffer.clone(),
                0,
                table.crcs,
                records::host_key(&file),
            )?;
            let schema = ipc::checked_metadata(&file, &buffer, &|bytes| check.check(bytes))?;
            let column = Column {
                file,
                buffer,
                chunks: Some(check),
                array: OnceLock::new(),
            };
            (schema, column)
        }
        None => {
            verify_column(&file, buffer.len(), entry)?;
            let (schema, batches) = match entry.crc {
                Some(_) => ipc::decode_verified(&file, buffer.clone())?,
                None => ipc::decode(&file, buffer.clone())?, // a version-1 manifest: no checksum
            };
            let column = Column {
                array: OnceLock::from(one_column(&file, batches)?),
                file,
                buffer,
                chunks: None,
            };
            (schema, column)
        }
    };
    let field = match schema.fields().len() {
        1 => schema.field(0),
        _ => {
            return Err(Error::corrupt(
                &column.file,
                "expected one batch with one column",
            ))
        }
    };
    let field = Field::new(
        entry.name.as_str(),
        field.data_type().clone(),
        field.is_nullable(),
    );
    Ok((field, column))
}

/// xxh3-128 of an array's physical layout: type, length, offset, buffers,
/// null bitmap and children. Equal hashes mean equal content.
fn hash_array(data: &ArrayData, h: &mut Xxh3) {
    h.update(format!("{:?}", data.data_type()).as_bytes());
    h.update(&(data.len() as u64).to_le_bytes());
    h.update(&(data.offset() as u64).to_le_bytes());
    match data.nulls() {
        Some(nulls) => {
            h.update(b"N");
            h.update(&(nulls.offset() as u64).to_le_bytes());
            h.update(nulls.buffer().as_slice());
        }
        None => h.update(b"-"),
    }
    h.update(&(data.buffers().len() as u64).to_le_bytes());
    for b in data.buffers() {
        h.update(&(b.len() as u64).to_le_bytes());
        h.update(b.as_slice());
    }
    for child in data.child_data() {
        hash_array(child, h);
    }
}

/// The width of one value of `data` if it is a fixed-width primitive array
/// (one buffer of values, no children): such an array is hashed and stored
/// from the range of its buffer it covers, so a slice needs no copy.
pub(super) fn fixed_width(data: &ArrayData) -> Option<usize> {
    let width = data.data_type().primitive_width()?;
    (data.buffers().len() == 1 && data.child_data().is_empty()).then_some(width)
}

/// `hash_array` of a fixed-width array as if it were compacted (offset 0,
/// its values and null bits only): a slice hashes as a copy of it would.
fn hash_fixed(data: &ArrayData, width: usize, h: &mut Xxh3) {
    h.update(format!("{:?}", data.data_type()).as_bytes());
    h.update(&(data.len() as u64).to_le_bytes());
    h.update(&0u64.to_le_bytes());
    match data.nulls() {
        Some(nulls) => {
            h.update(b"N");
            h.update(&0u64.to_le_bytes());
            let mut bits = nulls.inner().sliced().as_slice().to_vec();
            if let (Some(last), tail @ 1..) = (bits.last_mut(), data.len() % 8) {
                *last &= (1u8 << tail) - 1;
            }
            h.update(&bits);
        }
        None => h.update(b"-"),
    }
    let values =
        &data.buffers()[0].as_slice()[data.offset() * width..(data.offset() + data.len()) * width];
    h.update(&1u64.to_le_bytes());
    h.update(&(values.len() as u64).to_le_bytes());
    h.update(values);
}

pub(in crate::catalog) fn column_hash(field: &Field, array: &ArrayRef) -> String {
    let mut h = Xxh3::new();
    h.update(if field.is_nullable() {
        b"nullable"
    } else {
        b"required"
    });
    let data = array.to_data();
    match fixed_width(&data) {
        Some(width) => hash_fixed(&data, width, &mut h),
        None => hash_array(&data, &mut h),
    }
    format!("{:032x}", h.digest128())
}

fn column_field(field: &Field) -> Field {
    Field::new("values", field.data_type().clone(), field.is_nullable())
}

/// A stored column file: content hash, CRC-32C and length of the file.
pub(in crate::catalog) type StoredColumn = (String, u32, u64);
/// CRC-32C and length of a stored file.
pub(in crate::catalog) type StoredChecksums = (u32, u64);

/// Make sure every column of `batch` (whose content hashes are `hashes`)
/// is stored under `dir/columns`; return each column's file in order.
/// Columns already stored are not written again; their checksums come from
/// `known` (the parent's manifest and the partitions stored before this
/// one) or, for a file nothing vouches for, from reading it once.
pub(in crate::catalog) fn store_columns(
    dir: &Path,
    batch: &RecordBatch,
    hashes: &[String],
    known: &HashMap<String, StoredChecksums>,
    record: bool,
) -> Result<Vec<StoredColumn>> {
    let columns_dir = dir.join(COLUMNS_DIR);
    std::fs::create_dir_all(&columns_dir).map_err(Error::io(&columns_dir))?;
    let mut stored = Vec::with_capacity(batch.num_columns());
    for ((field, array), hash) in batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .zip(hashes)
    {
        let hash = hash.clone();
        let path = columns_dir.join(format!("{hash}.arrow"));
        let from_parent = known.get(&hash).copied();
        // the checksums of a file on disk, taken in one read that also
        // gives its chunk table
        let from_disk = |path: &Path| -> Result<StoredChecksums> {
            let table = ChunkTable::of_file(path).map_err(Error::io(path))?;
            table.write_sidecar(path)?;
            Ok((table.file_crc, table.file_len))
        };
        let (crc, len) = match from_parent {
            Some(found) if path.exists() => found,
            // A file no parent vouches for (after a checkout back, or a
            // forced commit): its checksum is taken from disk, so first make
            // sure the disk holds this very column, not a damaged copy.
            _ if path.exists() => {
                let (_, batches) = ipc::read_mapped(&path, "snapshot column")?;
                let same = matches!(batches.as_slice(), [one] if one.num_columns() == 1
                    && one.column(0).to_data() == array.to_data());
                if !same {
                    return Err(Error::corrupt(
                        &path,
                        "snapshot column file does not hold the column its name promises",
                    ));
                }
                from_disk(&path)?
            }
            _ => {
                let schema = Arc::new(Schema::new(vec![column_field(field)]));
                let one = RecordBatch::try_new(schema.clone(), vec![array.clone()])?;
                let mut written = ipc::write_temp(&path, &schema, &[one])?;
                let chunks = ChunkTable {
                    file_len: written.len,
                    file_crc: written.crc,
                    crcs: std::mem::take(&mut written.chunks),
                };
                // the sidecar first: a column file on disk always has one
                // unless a crash came between them (then it is made below
                // by the next writer, and readers check the file whole)
                chunks.write_sidecar(&path)?;
                if fs::publish_no_replace(&written.path, &path)? {
                    // its checksums were taken as it was written: no second
                    // read, in this process or another of the host
                    if record {
                        mark_verified(&path);
                        records::record_checked(&path, chunks::chunk_count(written.len));
                    }
                    (written.crc, written.len)
                } else {
                    from_disk(&path)? // an equal column another writer stored meanwhile
                }
            }
        };
        ensure_sidecar(&path, len, crc)?;
        stored.push((hash, crc, len));
    }
    Ok(stored)
}

/// Give column file `path` (of `len` bytes, CRC-32C `crc`, as its manifest
/// says) its chunk table, unless it has it: a column stored before chunked
/// checksums, fetched from a bucket, or whose sidecar was lost. Reads the
/// file once.
pub(in crate::catalog) fn ensure_sidecar(path: &Path, len: u64, crc: u32) -> Result<()> {
    if ChunkTable::read_sidecar(path, len, crc).is_some() {
        return Ok(());
    }
    let table = ChunkTable::of_file(path).map_err(Error::io(path))?;
    if (table.file_len, table.file_crc) != (len, crc) {
        return Err(Error::corrupt(
            path,
            format!("snapshot column file does not match its manifest (crc32c {:08x} over {} bytes, manifest says {crc:08x} over {len})", table.file_crc, table.file_len),
        ));
    }
    table.write_sidecar(path)
}

/// Give every column file of snapshot `number` in `dir` its chunk table
/// (see `ensure_sidecar`), so that readers check it chunk by chunk.
pub fn ensure_sidecars(dir: &Path, number: u64) -> Result<()> {
    for entry in read_manifest(dir, number)?.columns() {
        if let (Some(crc), Some(len)) = (entry.crc, entry.len) {
            let file = dir.join(COLUMNS_DIR).join(format!("{}.arrow", entry.hash));
            ensure_sidecar(&file, len, crc)?;
        }
    }
    Ok(())
}

/// Positions of the columns every partition has.
#[derive(Debug, Clone)]
pub(super) struct Positions {
    pub(super) cache: usize,
    pub(super) sample: usize,
    pub(super) weight: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::checksum::crc32c;
    use arrow::array::{AsArray, Int32Array, Int64Array};
    use arrow::datatypes::Int64Type;

    fn int64(values: Vec<i64>) -> ArrayRef {
        Arc::new(Int64Array::from(values))
    }

    fn field(nullable: bool) -> Field {
        Field::new("x", DataType::Int64, nullable)
    }

    /// A batch of one column `x` of `values`, and its content hash.
    fn column_x(values: Vec<i64>) -> (RecordBatch, Vec<String>) {
        let schema = Arc::new(Schema::new(vec![field(false)]));
        let batch = RecordBatch::try_new(schema, vec![int64(values)]).unwrap();
        let hashes = vec![column_hash(&field(false), batch.column(0))];
        (batch, hashes)
    }

    /// The manifest entry of stored column `x`.
    fn entry((hash, crc, len): &StoredColumn) -> ColumnEntry {
        ColumnEntry {
            hash: hash.clone(),
            name: "x".to_string(),
            crc: Some(*crc),
            len: Some(*len),
            range: None,
        }
    }

    /// Column `entry` of `dir`, mapped and read whole (every chunk checked).
    fn read_whole(dir: &Path, entry: &ColumnEntry) -> Result<Vec<i64>> {
        let (field, column) = open_column(dir, entry)?;
        assert_eq!(field.name(), "x");
        assert_eq!(field.data_type(), &DataType::Int64);
        let array = column.whole()?;
        Ok(array.as_primitive::<Int64Type>().values().to_vec())
    }

    #[test]
    fn equal_columns_hash_equal_and_any_difference_changes_the_hash() {
        let hash = column_hash(&field(false), &int64(vec![1, 2, 3]));
        assert_eq!(hash.len(), 32);
        assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()), "{hash}");
        assert_eq!(hash, column_hash(&field(false), &int64(vec![1, 2, 3])));
        // the name is the manifest's: a renamed column keeps its file
        let renamed = Field::new("y", DataType::Int64, false);
        assert_eq!(hash, column_hash(&renamed, &int64(vec![1, 2, 3])));

        assert_ne!(hash, column_hash(&field(false), &int64(vec![1, 2, 4])));
        assert_ne!(hash, column_hash(&field(false), &int64(vec![1, 2])));
        assert_ne!(hash, column_hash(&field(true), &int64(vec![1, 2, 3])));
        let int32: ArrayRef = Arc::new(Int32Array::from(vec![1, 2, 3]));
        let int32_field = Field::new("x", DataType::Int32, false);
        assert_ne!(hash, column_hash(&int32_field, &int32));
        // a null is not the value stored under it
        let null: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None, Some(3)]));
        let zero = int64(vec![1, 0, 3]);
        assert_ne!(
            column_hash(&field(true), &null),
            column_hash(&field(true), &zero)
        );
    }

    #[test]
    fn a_slice_of_a_fixed_width_column_hashes_as_a_copy_of_its_values() {
        let whole = Int64Array::from((0..100).collect::<Vec<i64>>());
        let slice: ArrayRef = Arc::new(whole.slice(37, 20));
        assert_eq!(
            column_hash(&field(false), &slice),
            column_hash(&field(false), &int64((37..57).collect()))
        );
        // with nulls: the null bits of the slice's rows, not of the column's
        let values: Vec<Option<i64>> = (0..100).map(|i| (i % 3 != 0).then_some(i)).collect();
        let whole = Int64Array::from(values.clone());
        for (start, len) in [(5, 11), (8, 16), (1, 7), (0, 100)] {
            let slice: ArrayRef = Arc::new(whole.slice(start, len));
            let copy: ArrayRef = Arc::new(Int64Array::from(values[start..start + len].to_vec()));
            assert_eq!(
                column_hash(&field(true), &slice),
                column_hash(&field(true), &copy),
                "rows {start}..{}",
                start + len
            );
        }
    }

    #[test]
    fn a_stored_column_reads_back_and_an_equal_one_is_not_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let (batch, hashes) = column_x(vec![5, -1, 7]);
        let stored = store_columns(dir.path(), &batch, &hashes, &HashMap::new(), false).unwrap();
        assert_eq!(stored.len(), 1);
        let (hash, crc, len) = stored[0].clone();
        assert_eq!(hash, hashes[0]);
        // named by its content; the manifest's CRC-32C and length are the file's
        let file = dir.path().join(COLUMNS_DIR).join(format!("{hash}.arrow"));
        let bytes = std::fs::read(&file).unwrap();
        assert_eq!((crc32c(&bytes), bytes.len() as u64), (crc, len));
        // with its chunk table, so that readers check it a chunk at a time
        assert!(ChunkTable::read_sidecar(&file, len, crc).is_some());
        assert_eq!(
            read_whole(dir.path(), &entry(&stored[0])).unwrap(),
            [5, -1, 7]
        );

        // stored again, nothing known of the file: it is checked, not rewritten
        let modified = std::fs::metadata(&file).unwrap().modified().unwrap();
        let again = store_columns(dir.path(), &batch, &hashes, &HashMap::new(), false).unwrap();
        assert_eq!(again, stored);
        assert_eq!(
            std::fs::metadata(&file).unwrap().modified().unwrap(),
            modified
        );
        // and with its checksums known, as a parent's manifest gives them
        let known = HashMap::from([(hash, (crc, len))]);
        let known_again = store_columns(dir.path(), &batch, &hashes, &known, false).unwrap();
        assert_eq!(known_again, stored);
    }

    #[test]
    fn a_column_file_that_does_not_hold_the_column_its_name_promises_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (batch, hashes) = column_x(vec![1, 2, 3]);
        store_columns(dir.path(), &batch, &hashes, &HashMap::new(), false).unwrap();
        // another column said to be that file's content
        let (other, _) = column_x(vec![1, 2, 4]);
        let stored = store_columns(dir.path(), &other, &hashes, &HashMap::new(), false);
        assert!(matches!(stored, Err(Error::Corrupt { .. })), "{stored:?}");
    }

    #[test]
    fn a_damaged_column_file_is_refused_when_read() {
        let dir = tempfile::tempdir().unwrap();
        let (batch, hashes) = column_x((0..1_000).collect());
        let stored = store_columns(dir.path(), &batch, &hashes, &HashMap::new(), false).unwrap();
        let file = dir
            .path()
            .join(COLUMNS_DIR)
            .join(format!("{}.arrow", hashes[0]));
        let mut bytes = std::fs::read(&file).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x40;
        std::fs::write(&file, &bytes).unwrap();
        // checked chunk by chunk against its chunk table
        let read = read_whole(dir.path(), &entry(&stored[0]));
        assert!(matches!(read, Err(Error::Corrupt { .. })), "{read:?}");
        // without a chunk table, checked whole against the manifest
        std::fs::remove_file(ChunkTable::sidecar(&file)).unwrap();
        let read = read_whole(dir.path(), &entry(&stored[0]));
        assert!(matches!(read, Err(Error::Corrupt { .. })), "{read:?}");
    }

    #[test]
    fn a_lost_chunk_table_is_made_again_only_for_the_file_its_manifest_names() {
        let dir = tempfile::tempdir().unwrap();
        let (batch, hashes) = column_x(vec![4, 5, 6]);
        let stored = store_columns(dir.path(), &batch, &hashes, &HashMap::new(), false).unwrap();
        let (_, crc, len) = stored[0].clone();
        let file = dir
            .path()
            .join(COLUMNS_DIR)
            .join(format!("{}.arrow", hashes[0]));
        let sidecar = ChunkTable::sidecar(&file);
        std::fs::remove_file(&sidecar).unwrap();
        let refused = ensure_sidecar(&file, len, crc ^ 1);
        assert!(matches!(refused, Err(Error::Corrupt { .. })), "{refused:?}");
        assert!(!sidecar.exists());
        ensure_sidecar(&file, len, crc).unwrap();
        assert!(ChunkTable::read_sidecar(&file, len, crc).is_some());
        assert_eq!(
            read_whole(dir.path(), &entry(&stored[0])).unwrap(),
            [4, 5, 6]
        );
    }
}

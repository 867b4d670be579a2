//! Numbered, immutable metadata snapshots.
//!
//! A snapshot is a small text manifest (`NNNNNNNN.snapshot`) naming one
//! column file per column. Column files (`columns/<xxh3-128>.arrow`) are
//! uncompressed Arrow IPC files named by the hash of their content, so
//! snapshots share every column they do not change: a reweight writes only
//! the new `weight` column. Every file is mapped read-only and shared by every
//! process that opens it.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use arrow::array::{Array, ArrayData, ArrayRef, AsArray, RecordBatch};
use arrow::buffer::ScalarBuffer;
use arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema, SchemaRef};
use xxhash_rust::xxh3::Xxh3;

use super::mixture::{Mixture, MixtureLines};
use super::ranges::ColumnRange;
use crate::sample::{
    mass, AliasTable, DrawPlan, EpochSampler, PartitionSource, PartitionedWeights, Sampling,
    Weights,
};
use crate::store::checksum::{crc32c, open_sealed_text, seal_text};
use crate::store::chunks::{self, ChunkCheck, ChunkTable};
use crate::store::{fs, ipc, CacheSet};
use crate::{Error, Result};

const HEADER: &str = "datasetrt-snapshot";
/// Version 2 adds per-column checksums and lengths, `parent`, and escaping;
/// version 3 partitions (`partition=<rows>` before each partition's columns);
/// version 4 each partition's weight mass (`partition=<rows> <mass>`), so
/// that weighted draws pick a partition before reading any of its weights;
/// version 5 a mixture (`mixture=` and `group=` lines), written only by a
/// snapshot that has one, so that a build that would draw without it
/// refuses the snapshot.
const VERSION: u32 = 5;
/// The version of a manifest without a mixture.
const VERSION_PLAIN: u32 = 4;
pub const COLUMNS_DIR: &str = "columns";

/// One immutable population: `cache_id`, `sample_id`, user columns, `weight`,
/// stored as an ordered list of partitions (each its own column files).
#[derive(Debug)]
pub struct Snapshot {
    number: u64,
    path: PathBuf,
    schema: SchemaRef,
    rows: usize,
    partitions: Vec<Partition>,
    /// Positions in each partition's `columns` of `cache_id`, `sample_id`
    /// and `weight`.
    cache_col: usize,
    sample_col: usize,
    weight_col: usize,
    /// Every partition as one batch, every chunk checked (built on first use).
    batches: OnceLock<Vec<RecordBatch>>,
    fingerprint: String,
    note: String,
    created_unix_ms: u64,
    parent: Option<u64>,
    /// Target shares of groups of rows, if the population has them.
    mixture: Option<Mixture>,
    rows_by_sample: OnceLock<Vec<Vec<u64>>>,
    /// Weighted and balanced draws: the partitions' masses, each
    /// partition's alias table and block sums made when a draw first lands
    /// there.
    partitioned: OnceLock<Arc<PartitionedWeights>>,
    /// The epoch samplers built last, by [`SamplerKey`]:
    /// a loader's draws and its read-ahead walk the same epoch, and a sorted
    /// order (weighted without replacement, balanced) is built once for both.
    samplers: Mutex<Vec<(SamplerKey, EpochSampler)>>,
    /// This process reads the snapshot: `cleanup` keeps it (`None` where no
    /// lease can be written).
    _lease: Option<super::lease::Lease>,
}

/// Rows `start .. start + rows` of a snapshot: one column file per column,
/// mapped when a read first needs the partition (partition 0 at `open`).
#[derive(Debug)]
struct Partition {
    /// Its place in the snapshot's list (for error messages).
    index: usize,
    start: usize,
    rows: usize,
    /// Its manifest lines: rows and column files (hash, CRC, length, name).
    entry: PartitionEntry,
    opened: OnceLock<Opened>,
}

/// A partition's columns, each mapped on first use (the identity columns
/// with the partition).
#[derive(Debug)]
struct Opened {
    columns: Vec<OnceLock<Column>>,
    /// The values of `cache_id` and `sample_id`, for reads that check them
    /// first (`identity`).
    ids: ScalarBuffer<i64>,
    samples: ScalarBuffer<i64>,
}

/// Positions of the columns every partition has.
#[derive(Debug, Clone)]
struct Positions {
    cache: usize,
    sample: usize,
    weight: usize,
}

/// Map column `k` of partition `i` (`entry`) of the snapshot at `path`:
/// its field must equal `expected` (partition 0's) when given; the identity
/// and weight columns are decoded here (of the right type and length,
/// without nulls).
fn open_part_column(
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

/// One mapped column file of a snapshot and how its bytes are checked.
#[derive(Debug)]
struct Column {
    file: PathBuf,
    /// The whole file, mapped.
    buffer: arrow::buffer::Buffer,
    /// `None`: the file was checked whole when the snapshot was opened (it
    /// has no chunk table: written before chunked checksums, or its sidecar
    /// was lost). Otherwise each chunk is checked before it is first read.
    chunks: Option<ChunkCheck>,
    /// The decoded array: at open for the columns the loader reads
    /// (identities, weights), on first use for the others.
    array: OnceLock<ArrayRef>,
}

impl Column {
    /// The array, its every chunk checked.
    fn whole(&self) -> Result<&ArrayRef> {
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
    fn check(&self, values: &ScalarBuffer<i64>, row: usize) -> Result<()> {
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
    fn advise(&self, values: &ScalarBuffer<i64>, row: usize) {
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
                chunks::host_key(&file),
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

pub const NO_ROW: u64 = u64::MAX;

/// (by the mixture, sampling, seed, epoch, epoch_len)
type SamplerKey = (bool, Sampling, u64, u64, u64);

/// Samplers a snapshot keeps: this epoch's and the next one's (the remote
/// read-ahead plans past the epoch's end).
const KEPT_SAMPLERS: usize = 2;

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
fn fixed_width(data: &ArrayData) -> Option<usize> {
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

pub(super) fn column_hash(field: &Field, array: &ArrayRef) -> String {
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
pub(super) type StoredColumn = (String, u32, u64);
/// CRC-32C and length of a stored file.
pub(super) type StoredChecksums = (u32, u64);

/// Make sure every column of `batch` (whose content hashes are `hashes`)
/// is stored under `dir/columns`; return each column's file in order.
/// Columns already stored are not written again; their checksums come from
/// `known` (the parent's manifest and the partitions stored before this
/// one) or, for a file nothing vouches for, from reading it once.
pub(super) fn store_columns(
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
                        chunks::record_checked(&path, chunks::chunk_count(written.len));
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
pub(super) fn ensure_sidecar(path: &Path, len: u64, crc: u32) -> Result<()> {
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

/// xxh3-128 over rows, column names and column contents. One partition
/// gives the fingerprint snapshots had before partitions; several add each
/// partition's rows.
fn fingerprint(rows: usize, names: &[String], partitions: &[(usize, &[String])]) -> String {
    let mut h = Xxh3::new();
    h.update(&(rows as u64).to_le_bytes());
    for (part_rows, hashes) in partitions {
        if partitions.len() > 1 {
            h.update(b"partition");
            h.update(&(*part_rows as u64).to_le_bytes());
        }
        for (name, hash) in names.iter().zip(hashes.iter()) {
            h.update(name.as_bytes());
            h.update(b"\0");
            h.update(hash.as_bytes());
        }
    }
    format!("{:032x}", h.digest128())
}

/// Rows per partition a writer cuts a population into, unless told
/// otherwise: `DATASETRT_PARTITION_ROWS`, else 2^22 (a 32 MiB weight column
/// per partition: an update that changes a few partitions writes only
/// those). Readers take any partitioning.
pub fn default_partition_rows() -> usize {
    std::env::var("DATASETRT_PARTITION_ROWS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(1 << 22)
        .min(MAX_PARTITION_ROWS)
}

/// Rows of a partition are u32 (its alias table's entries): at most
/// 2^32 - 1 of them. A population has any number of partitions.
pub const MAX_PARTITION_ROWS: usize = u32::MAX as usize;

/// A new population cut into partitions, each column of each hashed: what
/// `publish` stores. It holds the rows as given and where each partition
/// ends, never the partitions themselves: a partition cut from several
/// batches is made (copied into one) when it is hashed and again when it is
/// stored, a window of partitions at a time, so that an update holds its
/// input and a few partitions, not a second copy of the population (40 GB
/// at 10^9 rows of five columns).
#[derive(Debug)]
pub struct Partitioned {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    /// The rows of each partition, in order.
    sizes: Vec<usize>,
    /// Per partition, the content hash of each column.
    hashes: Vec<Vec<String>>,
}

impl Partitioned {
    /// Cut `batches` (of `schema`) into partitions: when they hold no more
    /// rows than `known` (the active snapshot) and its partitions are no
    /// larger than `per`, as many rows as each of them has, in order; then,
    /// or else, `per` rows each (the last may be shorter). A partition cut from one batch keeps views of its
    /// fixed-width arrays (hashed and written from the range they cover);
    /// its other arrays, and every array of a partition cut from several
    /// batches, are copied into fresh arrays (so that its hash and file
    /// cover only its rows).
    ///
    /// A fixed-width column that is one of `known`'s own mapped arrays (a
    /// column of the active snapshot handed back unchanged, say through
    /// `get_metadata` and polars) takes that array's hash without reading
    /// its bytes.
    ///
    /// `check(first_row, partition, hashes)` is called on each partition
    /// once it is hashed, while it is held (the first error is returned).
    pub fn new(
        schema: &SchemaRef,
        batches: &[RecordBatch],
        per: usize,
        known: Option<&Snapshot>,
        check: impl FnMut(usize, &RecordBatch, &[String]) -> Result<()>,
    ) -> Result<Partitioned> {
        let sizes = cut(batches, per, known);
        Self::with_sizes(schema, batches, sizes, known, check)
    }

    /// Cut `batches` into partitions of `sizes` rows (which sum to their
    /// rows), hashed and checked as [`Partitioned::new`] says.
    pub(super) fn with_sizes(
        schema: &SchemaRef,
        batches: &[RecordBatch],
        sizes: Vec<usize>,
        known: Option<&Snapshot>,
        mut check: impl FnMut(usize, &RecordBatch, &[String]) -> Result<()>,
    ) -> Result<Partitioned> {
        let by_address = known.map(Snapshot::hashes_by_address).unwrap_or_default();
        // a window of partitions is hashed on the engine's threads together
        let window = crate::threads().clamp(1, 4);
        let mut parts = Cuts::new(schema, batches, &sizes);
        let mut hashes = Vec::with_capacity(sizes.len());
        let mut first_row = 0;
        loop {
            let made = parts.by_ref().take(window).collect::<Result<Vec<_>>>()?;
            if made.is_empty() {
                break;
            }
            for (part, h) in made.iter().zip(hash_partitions(&made, &by_address)) {
                check(first_row, part, &h)?;
                first_row += part.num_rows();
                hashes.push(h);
            }
        }
        Ok(Partitioned {
            schema: schema.clone(),
            batches: batches.to_vec(),
            sizes,
            hashes,
        })
    }

    pub fn num_rows(&self) -> usize {
        self.sizes.iter().sum()
    }

    /// Each partition, made again, with the content hash of each of its
    /// columns, in row order.
    pub(super) fn parts(&self) -> impl Iterator<Item = Result<(RecordBatch, &[String])>> + '_ {
        Cuts::new(&self.schema, &self.batches, &self.sizes)
            .zip(&self.hashes)
            .map(|(part, h)| Ok((part?, h.as_slice())))
    }
}

/// The rows of each partition of `batches` (see [`Partitioned::new`]).
fn cut(batches: &[RecordBatch], per: usize, known: Option<&Snapshot>) -> Vec<usize> {
    let per = per.max(1);
    // a population no larger than `known` (a reweight, a filter) is cut
    // as `known` is, then in partitions of `per` rows: a reweight then
    // shares every partition's other columns, and a filter those before
    // its first removed row, whatever cut snapshot 0's groups of caches
    // made; a larger one, or one whose partitions are larger than `per`
    // (the setting was lowered), is cut every `per` rows
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let fits = |s: &Snapshot| (0..s.num_partitions()).all(|p| s.partition_rows(p) <= per);
    let known: Vec<usize> = match known {
        Some(s) if rows <= s.num_rows() && fits(s) => (0..s.num_partitions())
            .map(|p| s.partition_rows(p))
            .collect(),
        _ => Vec::new(),
    };
    let mut sizes = Vec::new();
    let mut left = rows;
    while left > 0 {
        let take = known
            .get(sizes.len())
            .copied()
            .unwrap_or(per)
            .max(1)
            .min(left);
        sizes.push(take);
        left -= take;
    }
    sizes
}

/// The partitions of `batches` at `sizes`, made one at a time.
struct Cuts<'a> {
    schema: &'a SchemaRef,
    batches: &'a [RecordBatch],
    sizes: std::slice::Iter<'a, usize>,
    /// The batch the next partition starts in, and its row there.
    batch: usize,
    at: usize,
}

impl<'a> Cuts<'a> {
    fn new(schema: &'a SchemaRef, batches: &'a [RecordBatch], sizes: &'a [usize]) -> Self {
        Cuts {
            schema,
            batches,
            sizes: sizes.iter(),
            batch: 0,
            at: 0,
        }
    }

    fn make(&mut self, rows: usize) -> Result<RecordBatch> {
        let mut pieces = Vec::new();
        // whether the one piece is a whole batch as given
        let mut whole = false;
        let mut need = rows;
        while need > 0 {
            let Some(batch) = self.batches.get(self.batch) else {
                return Err(Error::internal("a partition was cut past the rows given"));
            };
            let take = need.min(batch.num_rows() - self.at);
            whole = pieces.is_empty() && take == batch.num_rows();
            if take > 0 {
                pieces.push(batch.slice(self.at, take));
            }
            self.at += take;
            need -= take;
            if self.at == batch.num_rows() {
                self.batch += 1;
                self.at = 0;
            }
        }
        let part = match pieces.as_slice() {
            [one] if whole => one.clone(),
            [one] => compact_variable(one)?,
            _ => compact(self.schema, &pieces)?,
        };
        tighten(part)
    }
}

impl Iterator for Cuts<'_> {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let rows = *self.sizes.next()?;
        Some(self.make(rows))
    }
}

/// `slice` (part of a batch) with its columns that are not fixed-width
/// copied into fresh arrays (their hash would cover their whole buffers);
/// fixed-width ones stay views of the batch (see [`hash_fixed`]).
pub(super) fn compact_variable(slice: &RecordBatch) -> Result<RecordBatch> {
    let columns = slice
        .columns()
        .iter()
        .map(|c| match fixed_width(&c.to_data()) {
            Some(_) => Ok(c.clone()),
            None => compact_one(&c.to_data()),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(slice.schema(), columns)?)
}

/// `data` (a slice) as one fresh array of its values.
fn compact_one(data: &ArrayData) -> Result<ArrayRef> {
    use arrow::array::{make_array, MutableArrayData};
    let mut out = MutableArrayData::new(vec![data], false, data.len());
    out.try_extend(0, 0, data.len())?;
    Ok(make_array(out.freeze()))
}

/// `pieces` (of `schema`) as one batch of fresh arrays that start at 0
/// (`concat`: dictionaries are merged, and one too large for its key type
/// is an error).
fn compact(schema: &SchemaRef, pieces: &[RecordBatch]) -> Result<RecordBatch> {
    let columns = (0..schema.fields().len())
        .map(|i| {
            let arrays: Vec<&dyn Array> = pieces.iter().map(|p| p.column(i).as_ref()).collect();
            Ok(arrow::compute::concat(&arrays)?)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// `batch` with every string or binary view column that holds more than
/// twice the bytes its rows refer to (a slice of a larger column, or a
/// copy of one: view arrays keep their source's data buffers) copied down
/// to those bytes, so that a partition's file and hash cover only its rows.
fn tighten(batch: RecordBatch) -> Result<RecordBatch> {
    fn loose(used: usize, buffers: &[arrow::buffer::Buffer]) -> bool {
        buffers.iter().map(|b| b.len()).sum::<usize>() > 2 * used + 1024
    }
    let mut changed = false;
    let columns = batch
        .columns()
        .iter()
        .map(|c| -> ArrayRef {
            match c.data_type() {
                DataType::Utf8View => {
                    let a = c.as_string_view();
                    if loose(a.total_buffer_bytes_used(), a.data_buffers()) {
                        changed = true;
                        return Arc::new(a.gc());
                    }
                }
                DataType::BinaryView => {
                    let a = c.as_binary_view();
                    if loose(a.total_buffer_bytes_used(), a.data_buffers()) {
                        changed = true;
                        return Arc::new(a.gc());
                    }
                }
                _ => {}
            }
            c.clone()
        })
        .collect();
    if !changed {
        return Ok(batch);
    }
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// Where a fixed-width array without nulls keeps its values: address of
/// the first, length, type, and its field's nullability (part of the hash).
type Address = (usize, usize, DataType, bool);

/// Content hashes of mapped column files by the address of their values.
type KnownHashes<'a> = HashMap<Address, &'a str>;

fn address(data: &ArrayData, nullable: bool) -> Address {
    match fixed_width(data) {
        Some(width) if data.nulls().is_none() => (
            data.buffers()[0].as_ptr() as usize + data.offset() * width,
            data.len(),
            data.data_type().clone(),
            nullable,
        ),
        _ => (0, 0, DataType::Null, nullable), // never a known address
    }
}

/// The content hash of every column of every partition, partitions hashed
/// on `crate::threads()` threads.
fn hash_partitions(parts: &[RecordBatch], known: &KnownHashes<'_>) -> Vec<Vec<String>> {
    let hash = |batch: &RecordBatch| -> Vec<String> {
        batch
            .schema()
            .fields()
            .iter()
            .zip(batch.columns())
            .map(
                |(f, a)| match known.get(&address(&a.to_data(), f.is_nullable())) {
                    Some(hash) => hash.to_string(),
                    None => column_hash(f, a),
                },
            )
            .collect()
    };
    let threads = crate::threads().min(parts.len()).max(1);
    if threads == 1 {
        return parts.iter().map(hash).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<Option<Vec<String>>> = vec![None; parts.len()];
    let done = Mutex::new(&mut out);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(part) = parts.get(i) else { break };
                let hashes = hash(part);
                done.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(hashes);
            });
        }
    });
    out.into_iter()
        .map(|h| h.expect("every partition hashed"))
        .collect()
}

/// Percent-encode `%` and control characters so that any column name or note
/// stays on one manifest line (a newline in a metadata key once made every
/// later `open` fail).
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '%' || c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

pub(super) fn unescape(text: &str) -> Option<String> {
    if !text.contains('%') {
        return Some(text.to_string());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A column file as a manifest names it: content hash, and (from version 2)
/// the CRC-32C and length of the whole file, checked before it is used.
#[derive(Debug, Clone)]
pub struct ColumnEntry {
    pub hash: String,
    pub name: String,
    pub crc: Option<u32>,
    pub len: Option<u64>,
    /// Its least and greatest value (a `range=` line after the column's:
    /// numeric columns written since ranges were recorded).
    pub range: Option<ColumnRange>,
}

/// One partition as a manifest names it: its rows, weight mass and column
/// files.
#[derive(Debug, Clone)]
pub struct PartitionEntry {
    pub rows: usize,
    /// The sum of its weights in row order ([`crate::sample::mass`]); `None`
    /// before version 4 (then summed from the weights when first needed).
    pub mass: Option<f64>,
    pub columns: Vec<ColumnEntry>,
}

/// A parsed, checksum-verified snapshot manifest.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub rows: usize,
    pub created_unix_ms: u64,
    /// The head this snapshot was committed on (`None` for the first one and
    /// for version-1 manifests, written before heads existed).
    pub parent: Option<u64>,
    pub note: String,
    pub fingerprint: String,
    /// At least one; every partition names the same columns in the same
    /// order (versions 1 and 2: one partition of every row).
    pub partitions: Vec<PartitionEntry>,
    /// The manifest's format version (1: columns carry no checksum; 3:
    /// partitions).
    pub version: u32,
    /// Target shares of groups of rows (version 5).
    pub mixture: Option<Mixture>,
}

impl Manifest {
    /// Every column file entry, partition after partition.
    pub fn columns(&self) -> impl Iterator<Item = &ColumnEntry> {
        self.partitions.iter().flat_map(|p| p.columns.iter())
    }
}

/// What identifies one version of a file: path, length, modification time,
/// inode.
type FileVersion = (PathBuf, u64, std::time::SystemTime, u64);

/// Processes verify each column file once per version: files are
/// content-addressed and never rewritten, so a file that passed its check
/// stays good; one changed in place gets a new modification time and is
/// checked again.
fn verified() -> &'static std::sync::Mutex<std::collections::HashSet<FileVersion>> {
    static VERIFIED: OnceLock<std::sync::Mutex<std::collections::HashSet<FileVersion>>> =
        OnceLock::new();
    VERIFIED.get_or_init(Default::default)
}

fn file_version(path: &Path) -> Option<FileVersion> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some((
        path.to_path_buf(),
        meta.len(),
        meta.modified().ok()?,
        meta.ino(),
    ))
}

fn mark_verified(file: &Path) {
    if let Some(key) = file_version(file) {
        verified()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key);
    }
}

/// Check a column file against its manifest entry: the mapped length, then
/// the CRC-32C of the file read (not of the mapping; see `crc32c_file`) —
/// once per version of the file per process, and not at all when another
/// process of the host checked this version: the host's record is an empty
/// file named by [`chunks::host_key`] (files with a chunk table keep a bitmap
/// of checked chunks there instead, see [`ChunkCheck`]), made only after a
/// check that read the file.
fn verify_column(file: &Path, mapped_len: usize, entry: &ColumnEntry) -> Result<()> {
    let (Some(crc), Some(len)) = (entry.crc, entry.len) else {
        return Ok(()); // a version-1 manifest: nothing to check against
    };
    if let Some(key) = file_version(file) {
        if verified()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&key)
        {
            return Ok(());
        }
    }
    if mapped_len as u64 != len {
        return Err(Error::corrupt(
            file,
            format!("snapshot column file is {mapped_len} bytes, its manifest says {len}"),
        ));
    }
    // the record names the version about to be read: one changed meanwhile
    // gets no record
    let record = chunks::host_key(file);
    if record.as_deref().is_some_and(Path::exists) {
        mark_verified(file);
        return Ok(());
    }
    let (found, read) = crate::store::checksum::crc32c_file(file).map_err(Error::io(file))?;
    if found != crc || read != len {
        return Err(Error::corrupt(
            file,
            format!("snapshot column file checksum mismatch (crc32c {found:08x} over {read} bytes, manifest says {crc:08x} over {len})"),
        ));
    }
    mark_verified(file);
    if let Some(record) = &record {
        chunks::record_whole(record);
    }
    Ok(())
}

/// What a writer knows of column files already stored, by content hash:
/// their checksums, the mass of each weight column and the range of each
/// column (from a parent's manifest and the partitions stored before).
#[derive(Debug, Default)]
pub(super) struct Known {
    checksums: HashMap<String, StoredChecksums>,
    masses: HashMap<String, f64>,
    ranges: HashMap<String, Option<ColumnRange>>,
    /// Files written are not recorded as checked for the host: they are
    /// linked elsewhere before anyone reads them, which changes the file
    /// version such a record names (see `assemble::prepare`).
    pub(super) unrecorded: bool,
}

impl Known {
    /// What the manifest of snapshot `parent` in `dir` records (nothing if
    /// it cannot be read: every file is then checked from disk).
    pub(super) fn of_parent(dir: &Path, parent: Option<u64>) -> Known {
        let mut known = Known::default();
        if let Some(manifest) = parent.and_then(|p| read_manifest(dir, p).ok()) {
            known.add(&manifest.partitions);
        }
        known
    }

    /// The checksums of the column files known, by content hash.
    pub(super) fn checksums(&self) -> &HashMap<String, StoredChecksums> {
        &self.checksums
    }

    /// Learn what `partitions` (as a manifest names them) record.
    pub(super) fn add(&mut self, partitions: &[PartitionEntry]) {
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
pub(super) fn store_partition(
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

/// Write the manifest of a population of `partitions` (their column files
/// stored) as the first free snapshot number at or above `number` (see
/// [`publish`]).
pub(super) fn write_manifest(
    dir: &Path,
    partitions: &[PartitionEntry],
    number: u64,
    note: &str,
    parent: Option<u64>,
    mixture: Option<&Mixture>,
) -> Result<u64> {
    let rows: usize = partitions.iter().map(|p| p.rows).sum();
    let names: Vec<String> = partitions
        .first()
        .map(|p| p.columns.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default();
    let hashes: Vec<Vec<String>> = partitions
        .iter()
        .map(|p| p.columns.iter().map(|c| c.hash.clone()).collect())
        .collect();
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let version = match mixture {
        Some(_) => VERSION,
        None => VERSION_PLAIN,
    };
    let mut body = format!("{HEADER} {version}\nrows={rows}\ncreated_unix_ms={created}\n");
    match parent {
        Some(p) => {
            let _ = writeln!(body, "parent={p}");
        }
        None => body.push_str("parent=none\n"),
    }
    let _ = writeln!(body, "note={}", escape(note));
    let parts: Vec<(usize, &[String])> = partitions
        .iter()
        .zip(&hashes)
        .map(|(p, h)| (p.rows, h.as_slice()))
        .collect();
    let mut print = fingerprint(rows, &names, &parts);
    if let Some(m) = mixture {
        print = m.fingerprint(&print);
    }
    let _ = writeln!(body, "fingerprint={print}");
    if let Some(m) = mixture {
        m.write_lines(&mut body);
    }
    for part in partitions {
        write_partition(&mut body, part);
    }
    let text = seal_text(&body);

    let tmp = fs::temp_sibling(&dir.join(Snapshot::file_name(number)));
    fs::write_synced(&tmp, text.as_bytes())?;
    let mut n = number;
    loop {
        let path = dir.join(Snapshot::file_name(n));
        match std::fs::hard_link(&tmp, &path) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => n += 1,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(Error::io(&path)(e));
            }
        }
    }
    let _ = std::fs::remove_file(&tmp);
    fs::sync_dir(dir)?;
    Ok(n)
}

/// The manifest version of the partition lines [`write_partition`] writes
/// (what records of groups and workers' descriptions of what they stored
/// are read as).
pub(super) const PARTITION_LINES: u32 = 4;

/// A partition's lines in a manifest: `partition=<rows> <mass>`, then per
/// column `column=<hash> <crc> <len> <name>` and its `range=` line if any.
pub(super) fn write_partition(body: &mut String, part: &PartitionEntry) {
    let mass = part.mass.unwrap_or(part.rows as f64);
    let _ = writeln!(body, "partition={} {mass:?}", part.rows);
    for c in &part.columns {
        let _ = writeln!(
            body,
            "column={} {:08x} {} {}",
            c.hash,
            c.crc.unwrap_or(0),
            c.len.unwrap_or(0),
            escape(&c.name)
        );
        if let Some(range) = c.range {
            let _ = writeln!(body, "range={}", range.text());
        }
    }
}

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
fn verify_alias_tables(dir: &Path, manifest: &Manifest) -> Vec<Error> {
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

/// The names (before the first `.`) of every file of `columns/` snapshot
/// `number` uses: its column files, their chunk tables, and the alias
/// tables of its weight columns (named by the weight column's hash).
pub fn used_names(dir: &Path, number: u64) -> Result<Vec<String>> {
    let manifest = read_manifest(dir, number)?;
    Ok(manifest.columns().map(|c| c.hash.clone()).collect())
}

/// The column hashes a snapshot manifest names (checksum verified), each
/// once (partitions may share a file).
pub fn manifest_columns(dir: &Path, number: u64) -> Result<Vec<String>> {
    let mut seen = HashSet::new();
    Ok(read_manifest(dir, number)?
        .columns()
        .filter(|c| seen.insert(c.hash.as_str()))
        .map(|c| c.hash.clone())
        .collect())
}

/// Read and check the manifest of snapshot `number` in `dir`.
pub fn read_manifest(dir: &Path, number: u64) -> Result<Manifest> {
    let path = dir.join(Snapshot::file_name(number));
    let raw = std::fs::read(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound {
            what: "metadata snapshot",
            path: path.clone(),
        },
        _ => Error::io(&path)(e),
    })?;
    let bad = |detail: String| Error::corrupt(&path, detail);
    let (version, body) = open_sealed_text(&path, &raw, HEADER, 1..=VERSION, "snapshot manifest")?;
    let mut manifest = Manifest {
        rows: 0,
        created_unix_ms: 0,
        parent: None,
        note: String::new(),
        fingerprint: String::new(),
        // before version 3, every column line belongs to the one partition
        partitions: match version {
            1 | 2 => vec![PartitionEntry {
                rows: 0,
                mass: None,
                columns: Vec::new(),
            }],
            _ => Vec::new(),
        },
        version,
        mixture: None,
    };
    let mut rows = None;
    let mut mixture = MixtureLines::default();
    for line in body.lines().skip(1) {
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| bad(format!("bad line {line:?}")))?;
        let bad_line = || bad(format!("bad {key} line {line:?}"));
        match key {
            "rows" => rows = value.parse::<usize>().ok(),
            "created_unix_ms" => manifest.created_unix_ms = value.parse().unwrap_or(0),
            "parent" if value == "none" => manifest.parent = None,
            "parent" => manifest.parent = Some(value.parse().map_err(|_| bad_line())?),
            "note" if version == 1 => manifest.note = value.to_string(),
            "note" => manifest.note = unescape(value).ok_or_else(bad_line)?,
            "fingerprint" => manifest.fingerprint = value.to_string(),
            "column" if version == 1 => {
                let (hash, name) = value.split_once(' ').ok_or_else(bad_line)?;
                let last = manifest.partitions.last_mut().ok_or_else(|| {
                    bad(format!("column line {line:?} before any partition line"))
                })?;
                last.columns.push(ColumnEntry {
                    hash: hash.to_string(),
                    name: name.to_string(),
                    crc: None,
                    len: None,
                    range: None,
                });
            }
            "partition" | "column" | "range" => {
                partition_line(key, value, version, &mut manifest.partitions).map_err(bad)?
            }
            "mixture" | "group" if version >= 5 => mixture.line(key, value).map_err(bad)?,
            _ => {}
        }
    }
    manifest.mixture = mixture.finish().map_err(bad)?;
    if let Some(entry) = manifest
        .columns()
        .find(|c| c.hash.len() != 32 || !c.hash.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err(bad(format!(
            "column hash {:?} is not 32 hex digits",
            entry.hash
        )));
    }
    manifest.rows = rows.ok_or_else(|| bad("no rows line".into()))?;
    if version < 3 {
        manifest.partitions[0].rows = manifest.rows;
        return Ok(manifest);
    }
    let Some(first) = manifest.partitions.first() else {
        return Err(bad("no partition line".into()));
    };
    let names = |p: &PartitionEntry| p.columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
    let first_names = names(first);
    for (i, part) in manifest.partitions.iter().enumerate() {
        if part.rows == 0 {
            return Err(bad(format!("partition {i} has no rows")));
        }
        if part.rows > MAX_PARTITION_ROWS {
            return Err(bad(format!(
                "partition {i} has {} rows; a partition holds at most 2^32 - 1",
                part.rows
            )));
        }
        if names(part) != first_names {
            return Err(bad(format!(
                "partition {i} names columns {:?}, partition 0 {first_names:?}",
                names(part)
            )));
        }
    }
    let sum = manifest
        .partitions
        .iter()
        .try_fold(0usize, |sum, p| sum.checked_add(p.rows));
    if sum != Some(manifest.rows) {
        return Err(bad(format!(
            "the partitions' rows do not add up to the rows line's {}",
            manifest.rows
        )));
    }
    Ok(manifest)
}

/// Apply one `partition`, `column` or `range` line (of a manifest of
/// `version` 2 or later, or a group record) to `partitions`; the error is
/// what is wrong with the line.
pub(super) fn partition_line(
    key: &str,
    value: &str,
    version: u32,
    partitions: &mut Vec<PartitionEntry>,
) -> std::result::Result<(), String> {
    let line = format!("{key}={value}");
    let bad_line = || format!("bad {key} line {line:?}");
    match key {
        "partition" if version >= 3 => {
            let (rows, mass) = match value.split_once(' ') {
                Some((rows, mass)) if version >= 4 => (rows, Some(mass)),
                None if version == 3 => (value, None),
                _ => return Err(bad_line()),
            };
            let mass = match mass {
                Some(m) => Some(
                    m.parse::<f64>()
                        .ok()
                        .filter(|m| m.is_finite() && *m >= 0.0)
                        .ok_or_else(bad_line)?,
                ),
                None => None,
            };
            partitions.push(PartitionEntry {
                rows: rows.parse().map_err(|_| bad_line())?,
                mass,
                columns: Vec::new(),
            });
        }
        "column" => {
            let last = partitions
                .last_mut()
                .ok_or_else(|| format!("column line {line:?} before any partition line"))?;
            let mut parts = value.splitn(4, ' ');
            let mut next = || parts.next().ok_or_else(bad_line);
            let (hash, crc, len, name) = (next()?, next()?, next()?, next()?);
            last.columns.push(ColumnEntry {
                hash: hash.to_string(),
                crc: Some(u32::from_str_radix(crc, 16).map_err(|_| bad_line())?),
                len: Some(len.parse().map_err(|_| bad_line())?),
                name: unescape(name).ok_or_else(bad_line)?,
                range: None,
            });
        }
        // the column line before it names the column (builds that do not
        // know ranges skip these lines, as every reader skips unknown keys)
        "range" => {
            let column = partitions
                .last_mut()
                .and_then(|p| p.columns.last_mut())
                .ok_or_else(|| format!("range line {line:?} before any column line"))?;
            column.range = Some(ColumnRange::parse(value).ok_or_else(bad_line)?);
        }
        _ => {}
    }
    Ok(())
}

impl Snapshot {
    pub fn file_name(number: u64) -> String {
        format!("{number:08}.snapshot")
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
        let lease = super::lease::Lease::take(dir, number);
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
    fn hashes_by_address(&self) -> KnownHashes<'_> {
        let mut known = HashMap::new();
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
        known
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
    fn column<'a>(&self, part: &'a Partition, k: usize) -> Result<&'a Column> {
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
    fn positions(&self) -> Positions {
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

    /// Draws per epoch of `sampling` over this population: `epoch_len` when
    /// given, else the mode's default (the population's size, or for
    /// `balanced` the classes times the largest class).
    pub fn epoch_len(&self, sampling: Sampling, epoch_len: Option<u64>) -> Result<u64> {
        match (epoch_len, &self.mixture) {
            (Some(len), _) => Ok(len),
            (None, Some(m)) => super::mixture::default_epoch_len(self, m),
            (None, None) => sampling.default_epoch_len(self.rows, &|| self.weights()),
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
        let mut kept = self.samplers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, sampler)) = kept.iter().find(|(k, _)| *k == key) {
            return Ok(sampler.clone());
        }
        let sampler = match mixture {
            Some(m) => super::mixture::sampler(self, m, sampling, seed, epoch)?,
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

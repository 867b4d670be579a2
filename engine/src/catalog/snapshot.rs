//! Numbered, immutable metadata snapshots.
//!
//! A snapshot is a small text manifest (`NNNNNNNN.snapshot`) naming one
//! column file per column. Column files (`columns/<xxh3-128>.arrow`) are
//! uncompressed Arrow IPC files named by the hash of their content, so
//! snapshots share every column they do not change: a reweight writes only
//! the new `weight` column. Every file is mapped read-only and shared by every
//! process that opens it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use arrow::array::{Array, ArrayData, ArrayRef, AsArray, Float64Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema, SchemaRef};
use xxhash_rust::xxh3::Xxh3;

use crate::sample::AliasTable;
use crate::store::checksum::crc32c;
use crate::store::{fs, ipc, Cache};
use crate::{Error, Result};

const HEADER: &str = "datasetrt-snapshot";
const VERSION: u32 = 1;
pub const COLUMNS_DIR: &str = "columns";

/// One immutable population: `cache_id`, `sample_id`, user columns, `weight`.
#[derive(Debug)]
pub struct Snapshot {
    number: u64,
    path: PathBuf,
    batch: RecordBatch,
    fingerprint: String,
    note: String,
    created_unix_ms: u64,
    rows_by_sample: OnceLock<Vec<Vec<u32>>>,
    alias: OnceLock<AliasTable>,
    /// Content hash of the weight column (names the shared alias table file).
    weight_hash: String,
}

pub const NO_ROW: u32 = u32::MAX;

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

fn column_hash(field: &Field, array: &ArrayRef) -> String {
    let mut h = Xxh3::new();
    h.update(if field.is_nullable() {
        b"nullable"
    } else {
        b"required"
    });
    hash_array(&array.to_data(), &mut h);
    format!("{:032x}", h.digest128())
}

fn column_field(field: &Field) -> Field {
    Field::new("values", field.data_type().clone(), field.is_nullable())
}

/// Make sure every column of `batch` is stored under `dir/columns`; return the
/// column hashes in order. Columns already stored are not written again.
fn store_columns(dir: &Path, batch: &RecordBatch) -> Result<Vec<String>> {
    let columns_dir = dir.join(COLUMNS_DIR);
    std::fs::create_dir_all(&columns_dir).map_err(Error::io(&columns_dir))?;
    let mut hashes = Vec::with_capacity(batch.num_columns());
    for (field, array) in batch.schema().fields().iter().zip(batch.columns()) {
        let hash = column_hash(field, array);
        let path = columns_dir.join(format!("{hash}.arrow"));
        if !path.exists() {
            let schema = Arc::new(Schema::new(vec![column_field(field)]));
            let one = RecordBatch::try_new(schema.clone(), vec![array.clone()])?;
            let tmp = ipc::write_temp(&path, &schema, &[one])?;
            fs::publish_no_replace(&tmp, &path)?;
        }
        hashes.push(hash);
    }
    Ok(hashes)
}

fn fingerprint(rows: usize, names: &[String], hashes: &[String]) -> String {
    let mut h = Xxh3::new();
    h.update(&(rows as u64).to_le_bytes());
    for (name, hash) in names.iter().zip(hashes) {
        h.update(name.as_bytes());
        h.update(b"\0");
        h.update(hash.as_bytes());
    }
    format!("{:032x}", h.digest128())
}

/// Write `batch` as snapshot `number` (or the next free number when another
/// process took it first, if `next_free`). Returns the number used.
pub fn publish(
    dir: &Path,
    batch: &RecordBatch,
    number: u64,
    note: &str,
    next_free: bool,
) -> Result<u64> {
    let hashes = store_columns(dir, batch)?;
    let names: Vec<String> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let mut body = format!(
        "{HEADER} {VERSION}\nrows={}\ncreated_unix_ms={created}\n",
        batch.num_rows()
    );
    let note: String = note
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let _ = writeln!(body, "note={note}");
    let _ = writeln!(
        body,
        "fingerprint={}",
        fingerprint(batch.num_rows(), &names, &hashes)
    );
    for (name, hash) in names.iter().zip(&hashes) {
        let _ = writeln!(body, "column={hash} {name}");
    }
    let crc = crc32c(body.as_bytes());
    let text = format!("{body}checksum={crc:08x}\n");

    let tmp = fs::temp_sibling(&dir.join(Snapshot::file_name(number)));
    fs::write_atomic(&tmp, text.as_bytes())?;
    let mut n = number;
    loop {
        let path = dir.join(Snapshot::file_name(n));
        match std::fs::hard_link(&tmp, &path) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && next_free => n += 1,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => break,
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

/// The column hashes a snapshot manifest names (checksum verified).
pub fn manifest_columns(dir: &Path, number: u64) -> Result<Vec<String>> {
    Ok(read_manifest(&dir.join(Snapshot::file_name(number)))?
        .lines()
        .filter_map(|l| l.strip_prefix("column="))
        .filter_map(|v| v.split_once(' ').map(|(hash, _)| hash.to_string()))
        .collect())
}

/// The body of a snapshot manifest (every line before `checksum=`), after
/// checking its version line and checksum.
fn read_manifest(path: &Path) -> Result<String> {
    let raw = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound {
            what: "metadata snapshot",
            path: path.to_path_buf(),
        },
        _ => Error::io(path)(e),
    })?;
    let bad = |detail: String| Error::corrupt(path, detail);
    let text = String::from_utf8(raw).map_err(|_| bad("snapshot manifest is not UTF-8".into()))?;
    let first = text.lines().next().unwrap_or_default();
    let version: u32 = first
        .strip_prefix(HEADER)
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| bad(format!("first line {first:?} is not '{HEADER} <version>'")))?;
    if version != VERSION {
        return Err(Error::UnsupportedVersion {
            path: path.to_path_buf(),
            found: version,
            supported: VERSION,
        });
    }
    let split = text
        .rfind("checksum=")
        .ok_or_else(|| bad("no checksum line".into()))?;
    let stored = u32::from_str_radix(text[split + 9..].trim(), 16)
        .map_err(|_| bad("unreadable checksum".into()))?;
    if crc32c(&text.as_bytes()[..split]) != stored {
        return Err(bad("snapshot manifest checksum mismatch".into()));
    }
    let mut body = text;
    body.truncate(split);
    Ok(body)
}

impl Snapshot {
    pub fn file_name(number: u64) -> String {
        format!("{number:08}.snapshot")
    }

    pub fn parse_file_name(name: &str) -> Option<u64> {
        let stem = name.strip_suffix(".snapshot")?;
        (stem.len() == 8 && stem.bytes().all(|b| b.is_ascii_digit())).then(|| stem.parse().ok())?
    }

    /// Read snapshot `number` from `dir`: check its manifest, map its columns.
    pub fn open(dir: &Path, number: u64) -> Result<Snapshot> {
        let path = dir.join(Self::file_name(number));
        let body = read_manifest(&path)?;
        let bad = |detail: String| Error::corrupt(&path, detail);
        let mut rows = None;
        let mut created_unix_ms = 0;
        let mut note = String::new();
        let mut fingerprint_line = String::new();
        let mut fields = Vec::new();
        let mut columns = Vec::new();
        let mut weight_hash = String::new();
        for line in body.lines().skip(1) {
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| bad(format!("bad line {line:?}")))?;
            match key {
                "rows" => rows = value.parse::<usize>().ok(),
                "created_unix_ms" => created_unix_ms = value.parse().unwrap_or(0),
                "note" => note = value.to_string(),
                "fingerprint" => fingerprint_line = value.to_string(),
                "column" => {
                    let (hash, name) = value
                        .split_once(' ')
                        .ok_or_else(|| bad(format!("bad column line {line:?}")))?;
                    let file = dir.join(COLUMNS_DIR).join(format!("{hash}.arrow"));
                    let (schema, batches) = ipc::read_mapped(&file, "snapshot column")?;
                    let array = match batches.as_slice() {
                        [one] if one.num_columns() == 1 => one.column(0).clone(),
                        _ => {
                            return Err(Error::corrupt(&file, "expected one batch with one column"))
                        }
                    };
                    let field = schema.field(0);
                    if name == "weight" {
                        weight_hash = hash.to_string();
                    }
                    fields.push(Field::new(
                        name,
                        field.data_type().clone(),
                        field.is_nullable(),
                    ));
                    columns.push(array);
                }
                _ => {}
            }
        }
        let rows = rows.ok_or_else(|| bad("no rows line".into()))?;
        if columns.iter().any(|c| c.len() != rows) {
            return Err(bad(format!("a column's length differs from rows={rows}")));
        }
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
            .map_err(|e| bad(e.to_string()))?;
        for (name, ty) in [
            ("cache_id", DataType::Int64),
            ("sample_id", DataType::Int64),
            ("weight", DataType::Float64),
        ] {
            match batch.column_by_name(name) {
                Some(col) if *col.data_type() == ty && col.null_count() == 0 => {}
                _ => {
                    return Err(bad(format!(
                        "snapshot lacks a non-null {ty} column {name:?}"
                    )))
                }
            }
        }
        if batch.num_rows() > u32::MAX as usize - 1 {
            return Err(bad("more rows than a snapshot can hold".into()));
        }
        Ok(Snapshot {
            number,
            path,
            batch,
            fingerprint: fingerprint_line,
            note,
            created_unix_ms,
            rows_by_sample: OnceLock::new(),
            alias: OnceLock::new(),
            weight_hash,
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

    pub fn number(&self) -> u64 {
        self.number
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn schema(&self) -> SchemaRef {
        self.batch.schema()
    }

    /// The whole population as one record batch over the mapped file.
    pub fn batch(&self) -> &RecordBatch {
        &self.batch
    }

    pub fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }

    fn int64(&self, name: &str) -> &Int64Array {
        self.batch
            .column_by_name(name)
            .expect("identity column checked on open")
            .as_primitive::<Int64Type>()
    }

    pub fn cache_ids(&self) -> &Int64Array {
        self.int64("cache_id")
    }

    pub fn sample_ids(&self) -> &Int64Array {
        self.int64("sample_id")
    }

    pub fn weights(&self) -> &Float64Array {
        self.batch
            .column_by_name("weight")
            .expect("weight column checked on open")
            .as_primitive::<Float64Type>()
    }

    /// Alias table over the weights: built once per weight column, stored next
    /// to the column files and mapped (shared by every process).
    pub fn alias_table(&self) -> Result<&AliasTable> {
        if let Some(table) = self.alias.get() {
            return Ok(table);
        }
        let dir = self
            .path
            .parent()
            .unwrap_or(Path::new("."))
            .join(COLUMNS_DIR);
        let path = dir.join(format!("{}.alias", self.weight_hash));
        let table = AliasTable::load_or_build(&path, self.weights().values())?;
        Ok(self.alias.get_or_init(|| table))
    }

    /// The first row of `(cache position, sample_id)` in this population, if any.
    /// `caches` must be the dataset's caches, sorted by id.
    pub fn row_of(&self, caches: &[Arc<Cache>], cache_pos: usize, sample_id: u64) -> Option<usize> {
        let table = self.rows_by_sample.get_or_init(|| {
            let mut table: Vec<Vec<u32>> = caches
                .iter()
                .map(|c| vec![NO_ROW; c.records() as usize])
                .collect();
            let ids = self.cache_ids().values();
            let samples = self.sample_ids().values();
            let mut pos = 0usize;
            for row in (0..ids.len()).rev() {
                if caches[pos].id() != ids[row] {
                    pos = caches
                        .binary_search_by_key(&ids[row], |c| c.id())
                        .expect("validated on update");
                }
                table[pos][samples[row] as usize] = row as u32;
            }
            table
        });
        match table.get(cache_pos)?.get(sample_id as usize) {
            Some(&row) if row != NO_ROW => Some(row as usize),
            _ => None,
        }
    }
}

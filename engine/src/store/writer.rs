//! Writing one cache: compression and checksums on native threads, records
//! appended to shards in input order, then an atomic publish.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, RecordBatchOptions};
use arrow::datatypes::{DataType, Field, Schema};

use super::checksum::crc32c;
use super::chunks::{self, ChunkTable};
use super::codec::{Codec, Compressor};
use super::format::{
    encode_index_header, encode_shard_header, shard_file_name, IndexEntry, ATTRIBUTES_FILE,
    INDEX_FILE, MANIFEST_FILE, SHARD_HEADER_LEN,
};
use super::fs::{remove_stale_temps, sync_dir, temp_sibling, write_atomic};
use super::host::records;
use super::manifest::Manifest;
use super::{ipc, validate_source_name};
use crate::Unpoison;
use crate::{Error, Result};

/// How a cache is written.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    pub codec: Codec,
    /// zstd level (ignored by other codecs).
    pub level: i32,
    /// A new shard starts once the current one reaches this many bytes.
    pub shard_target_bytes: u64,
    /// Native threads that compress and checksum.
    pub threads: usize,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            codec: Codec::Zstd,
            level: 3,
            shard_target_bytes: 256 << 20,
            threads: crate::threads().min(4),
        }
    }
}

impl WriterOptions {
    /// Check the options as a whole (what [`CacheWriter::create`] does first):
    /// a positive shard size and thread count, and a zstd level zstd knows.
    pub fn check(&self) -> Result<()> {
        if self.shard_target_bytes == 0 {
            return Err(Error::invalid("shard_bytes must be positive"));
        }
        if self.threads == 0 {
            return Err(Error::invalid("threads must be positive"));
        }
        let levels = zstd::compression_level_range();
        if self.codec == Codec::Zstd && !levels.contains(&self.level) {
            return Err(Error::invalid(format!(
                "zstd level {} is outside [{}, {}]",
                self.level,
                levels.start(),
                levels.end()
            )));
        }
        Ok(())
    }
}

/// Records and bytes of one chunk [`CacheWriter::add_binary`] queues (as
/// `datasetrt.build` cuts a source's records).
const BINARY_CHUNK_RECORDS: usize = 4096;
const BINARY_CHUNK_BYTES: usize = 16 << 20;

/// Value `i` of a column of bytes; other types are invalid input.
fn binary_values<'a>(column: &'a dyn Array) -> Result<Box<dyn Fn(usize) -> &'a [u8] + 'a>> {
    Ok(match column.data_type() {
        DataType::Binary => {
            let a = column.as_binary::<i32>();
            Box::new(move |i| a.value(i))
        }
        DataType::LargeBinary => {
            let a = column.as_binary::<i64>();
            Box::new(move |i| a.value(i))
        }
        DataType::BinaryView => {
            let a = column.as_binary_view();
            Box::new(move |i| a.value(i))
        }
        DataType::FixedSizeBinary(_) => {
            let a = column.as_fixed_size_binary();
            Box::new(move |i| a.value(i))
        }
        other => {
            return Err(Error::invalid(format!(
                "a data column must hold bytes (binary, large binary, binary view or \
                 fixed-size binary), not {other}: serialize the samples first"
            )))
        }
    })
}

struct Chunk {
    id: u64,
    data: Vec<u8>,
    ends: Vec<usize>,
}

struct Encoded {
    id: u64,
    bytes: Vec<u8>,
    /// (stored_len, raw_len, crc32c, codec) per record
    records: Vec<(u32, u32, u32, Codec)>,
}

struct SinkOutput {
    entries: Vec<IndexEntry>,
    shard_bytes: Vec<u64>,
}

/// Writes one source's records into a staging directory and publishes it.
///
/// Dropping a writer without [`CacheWriter::finish`] removes the staging
/// directory: nothing becomes visible.
pub struct CacheWriter {
    root: PathBuf,
    name: String,
    staging: PathBuf,
    codec: Codec,
    jobs: Option<SyncSender<Chunk>>,
    compressors: Vec<JoinHandle<()>>,
    sink: Option<JoinHandle<Result<SinkOutput>>>,
    next_chunk: u64,
    records: u64,
}

impl CacheWriter {
    /// Start writing source `name` under `root`. Fails if a cache of that name
    /// is already published there.
    pub fn create(root: &Path, name: &str, options: WriterOptions) -> Result<Self> {
        validate_source_name(name)?;
        options.check()?;
        let final_dir = root.join(name);
        if final_dir.exists() {
            return Err(Error::invalid(format!(
                "a cache named {name:?} already exists at {}",
                final_dir.display()
            )));
        }
        fs::create_dir_all(root).map_err(Error::io(root))?;
        remove_stale_temps(root);
        let staging = temp_sibling(&root.join(format!("staging-{name}")));
        fs::create_dir(&staging).map_err(Error::io(&staging))?;

        let threads = options.threads.max(1);
        let (job_tx, job_rx) = mpsc::sync_channel::<Chunk>(threads * 2);
        let (out_tx, out_rx) = mpsc::sync_channel::<Encoded>(threads * 2);
        let job_rx = Arc::new(Mutex::new(job_rx));
        let mut compressors = Vec::with_capacity(threads);
        for _ in 0..threads {
            let mut compressor = Compressor::new(options.codec, options.level)?;
            let rx = job_rx.clone();
            let tx = out_tx.clone();
            compressors.push(std::thread::spawn(move || loop {
                let job = match rx.lock().unpoisoned().recv() {
                    Ok(job) => job,
                    Err(_) => return,
                };
                if tx.send(encode_chunk(&mut compressor, job)).is_err() {
                    return;
                }
            }));
        }
        drop(out_tx);
        let sink_dir = staging.clone();
        let target = options.shard_target_bytes;
        let sink = std::thread::spawn(move || run_sink(&sink_dir, target, out_rx));
        Ok(CacheWriter {
            root: root.to_path_buf(),
            name: name.to_string(),
            staging,
            codec: options.codec,
            jobs: Some(job_tx),
            compressors,
            sink: Some(sink),
            next_chunk: 0,
            records: 0,
        })
    }

    /// Queue every value of an Arrow column of bytes (binary, large binary,
    /// binary view or fixed-size binary) as one record, in order, cut into
    /// chunks for the compressors as [`CacheWriter::add_chunk`] takes them.
    /// A null value is invalid input naming its record; nothing of the
    /// column is queued then. Returns the number of records queued.
    pub fn add_binary(&mut self, column: &dyn Array) -> Result<u64> {
        let value = binary_values(column)?;
        if let Some(i) = (0..column.len()).find(|&i| column.is_null(i)) {
            let record = self.records as usize + i; // the row of the source
            return Err(Error::invalid(format!(
                "record {record} of source {:?} is null: its data column must hold bytes in \
                 every row",
                self.name
            ))
            .at_row(record));
        }
        let mut next = 0;
        while next < column.len() {
            // the chunk's records first, then one allocation of their size:
            // no copy as a vector grows, no page faulted twice
            let (first, mut bytes) = (next, 0);
            while next < column.len()
                && next - first < BINARY_CHUNK_RECORDS
                && bytes < BINARY_CHUNK_BYTES
            {
                bytes += value(next).len();
                next += 1;
            }
            let mut data = Vec::with_capacity(bytes);
            let mut ends = Vec::with_capacity(next - first);
            for i in first..next {
                data.extend_from_slice(value(i));
                ends.push(data.len());
            }
            self.add_chunk(data, ends)?;
        }
        Ok(column.len() as u64)
    }

    /// Number of records accepted so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Queue records, given as one contiguous buffer and the end offset of
    /// each record. Blocks while the pipeline is full (bounded memory).
    pub fn add_chunk(&mut self, data: Vec<u8>, ends: Vec<usize>) -> Result<()> {
        let mut start = 0;
        for (i, &end) in ends.iter().enumerate() {
            if end < start || end > data.len() {
                return Err(Error::invalid(format!(
                    "record end offset {end} out of order"
                )));
            }
            if end - start > u32::MAX as usize {
                return Err(Error::invalid(format!(
                    "record {} of source {:?} is {} bytes; records are limited to 4 GiB",
                    self.records + i as u64,
                    self.name,
                    end - start
                )));
            }
            start = end;
        }
        let n = ends.len() as u64;
        let chunk = Chunk {
            id: self.next_chunk,
            data,
            ends,
        };
        let sent = self
            .jobs
            .as_ref()
            .map(|tx| tx.send(chunk).is_ok())
            .unwrap_or(false);
        if !sent {
            return Err(self.pipeline_error());
        }
        self.next_chunk += 1;
        self.records += n;
        Ok(())
    }

    /// The error that stopped the pipeline, once it has stopped.
    fn pipeline_error(&mut self) -> Error {
        match self.drain() {
            Err(e) => e,
            Ok(_) => Error::invalid("cache writer is closed"),
        }
    }

    fn drain(&mut self) -> Result<SinkOutput> {
        self.jobs = None;
        for handle in self.compressors.drain(..) {
            let _ = handle.join();
        }
        match self.sink.take() {
            Some(handle) => handle
                .join()
                .unwrap_or_else(|_| Err(Error::internal("a cache writer thread panicked"))),
            None => Err(Error::invalid("cache writer is closed")),
        }
    }

    /// Write index, attributes and manifest, then publish atomically.
    /// `attributes` holds one row per record, in input order, without the
    /// reserved columns. Returns the published manifest and directory.
    pub fn finish(mut self, attributes: RecordBatch) -> Result<(Manifest, PathBuf)> {
        let name = self.name.clone();
        check_attributes(&name, self.records, &attributes)?;
        let out = self.drain()?;
        let staging = self.staging.clone();

        // index
        let index_crc32c = write_index(&staging, &out.entries)?;

        // attributes, with sample_id first
        let attributes = write_attributes(&staging, self.records, &attributes)?;

        let manifest = new_manifest(
            &name,
            self.records,
            self.codec,
            out.shard_bytes,
            index_crc32c,
            &attributes,
        );
        publish(&self.root, &staging, manifest)
    }
}

/// The manifest of a new cache `name` whose index and attributes are
/// written: a new cache id, created now.
fn new_manifest(
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
fn publish(root: &Path, staging: &Path, manifest: Manifest) -> Result<(Manifest, PathBuf)> {
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

/// Publish the caches `parts` (published cache directories written with
/// one codec: one source cut into parts, each written by its own process)
/// as the one cache `name` under `root`, their records in order, part after
/// part: the cache one writer would have written from the whole source.
/// Shards are moved, not copied (renamed into the new cache, their header
/// renumbered); the index and attributes are written anew. A metadata
/// column that is all null in some parts takes its type from the others;
/// parts whose columns differ otherwise are invalid input. The parts'
/// directories are gone afterwards, whether the merge succeeded or not.
pub fn merge_parts(root: &Path, name: &str, parts: &[PathBuf]) -> Result<(Manifest, PathBuf)> {
    let merged = merge_into_staging(root, name, parts);
    for part in parts {
        let _ = fs::remove_dir_all(part);
    }
    let (staging, manifest) = merged?;
    publish(root, &staging, manifest).inspect_err(|_| {
        let _ = fs::remove_dir_all(&staging);
    })
}

/// The parts of [`merge_parts`] as one cache in a staging directory of
/// `root`, and its manifest.
fn merge_into_staging(root: &Path, name: &str, parts: &[PathBuf]) -> Result<(PathBuf, Manifest)> {
    validate_source_name(name)?;
    if root.join(name).exists() {
        return Err(Error::invalid(format!(
            "a cache named {name:?} already exists at {}",
            root.join(name).display()
        )));
    }
    let (mut entries, mut attributes, mut shards) = (Vec::new(), Vec::new(), Vec::new());
    let mut codec = None;
    for part in parts {
        let cache = super::Cache::open(part)?;
        let manifest = cache.manifest();
        if *codec.get_or_insert(manifest.codec) != manifest.codec {
            return Err(Error::invalid(format!(
                "the parts of {name:?} were written with two codecs"
            )));
        }
        let base = u32::try_from(shards.len())
            .map_err(|_| Error::invalid(format!("the parts of {name:?} hold too many shards")))?;
        for s in 0..cache.records() {
            let mut entry = cache.entry(s)?;
            entry.shard += base;
            entries.push(entry);
        }
        let stored = cache.attributes()?;
        attributes.push(stored.project(&(1..stored.num_columns()).collect::<Vec<_>>())?);
        for (s, &bytes) in manifest.shard_bytes.iter().enumerate() {
            shards.push((part.join(shard_file_name(s as u32)), bytes));
        }
    }
    let attributes = concat_parts(name, &attributes)?;
    let staging = temp_sibling(&root.join(format!("staging-{name}")));
    fs::create_dir(&staging).map_err(Error::io(&staging))?;
    let written = (|| {
        for (n, (file, _)) in shards.iter().enumerate() {
            let to = staging.join(shard_file_name(n as u32));
            fs::rename(file, &to).map_err(Error::io(&to))?;
            let shard = fs::OpenOptions::new()
                .write(true)
                .open(&to)
                .map_err(Error::io(&to))?;
            std::os::unix::fs::FileExt::write_all_at(&shard, &encode_shard_header(n as u32), 0)
                .and_then(|()| shard.sync_all())
                .map_err(Error::io(&to))?;
        }
        let index_crc32c = write_index(&staging, &entries)?;
        let written = write_attributes(&staging, entries.len() as u64, &attributes)?;
        Ok::<_, Error>((index_crc32c, written))
    })();
    let (index_crc32c, written) = written.inspect_err(|_| {
        let _ = fs::remove_dir_all(&staging);
    })?;
    let manifest = new_manifest(
        name,
        entries.len() as u64,
        codec.unwrap_or(Codec::None),
        shards.iter().map(|&(_, bytes)| bytes).collect(),
        index_crc32c,
        &written,
    );
    Ok((staging, manifest))
}

/// The parts' attributes (without `sample_id`) as one batch: a column that
/// is all null (type Null) in a part takes the type the other parts give it.
fn concat_parts(name: &str, parts: &[RecordBatch]) -> Result<RecordBatch> {
    let Some(first) = parts.first() else {
        return Ok(RecordBatch::new_empty(Arc::new(Schema::empty())));
    };
    let names: Vec<&String> = first
        .schema_ref()
        .fields()
        .iter()
        .map(|f| f.name())
        .collect();
    if parts.iter().any(|p| p.num_columns() != names.len()) {
        return Err(Error::invalid(format!(
            "the parts of {name:?} have other metadata columns"
        )));
    }
    let mut fields = Vec::with_capacity(names.len());
    for (i, column) in names.iter().enumerate() {
        let mut kind = DataType::Null;
        for part in parts {
            let field = part
                .schema_ref()
                .fields()
                .get(i)
                .filter(|f| f.name() == *column);
            let Some(field) = field else {
                return Err(Error::invalid(format!(
                    "the parts of {name:?} have other metadata columns"
                )));
            };
            match (&kind, field.data_type()) {
                (_, DataType::Null) => {}
                (DataType::Null, other) => kind = other.clone(),
                (a, b) if a == b => {}
                (a, b) => {
                    return Err(Error::invalid(format!(
                        "metadata column {column:?} of {name:?} is {a} in one part and {b} in \
                         another"
                    )))
                }
            }
        }
        fields.push(Field::new(column.as_str(), kind, true));
    }
    let schema = Arc::new(Schema::new(fields));
    let mut batches = Vec::with_capacity(parts.len());
    for part in parts {
        let columns = part
            .columns()
            .iter()
            .zip(schema.fields())
            .map(|(c, f)| match c.data_type() {
                DataType::Null => arrow::array::new_null_array(f.data_type(), c.len()),
                _ => c.clone(),
            })
            .collect();
        batches.push(RecordBatch::try_new_with_options(
            schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(part.num_rows())),
        )?);
    }
    Ok(arrow::compute::concat_batches(&schema, &batches)?)
}

/// The `attributes` of source `name`'s `records` records: one row per record
/// (or no columns), under names that are valid and not reserved.
fn check_attributes(name: &str, records: u64, attributes: &RecordBatch) -> Result<()> {
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
        super::check_column_name(field.name())
            .map_err(|e| Error::invalid(format!("source {name:?}: metadata key: {e}")))?;
        if super::RESERVED_COLUMNS.contains(&field.name().as_str()) {
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
fn write_index(staging: &Path, index_entries: &[IndexEntry]) -> Result<u32> {
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
fn write_attributes(
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

impl Drop for CacheWriter {
    fn drop(&mut self) {
        if self.jobs.is_some() || self.sink.is_some() {
            let _ = self.drain();
        }
        // After a successful finish the staging directory has been renamed away.
        let _ = fs::remove_dir_all(&self.staging);
    }
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

fn encode_chunk(compressor: &mut Compressor, chunk: Chunk) -> Encoded {
    if compressor.codec() == Codec::None {
        // stored as given: the chunk's bytes are the shard's, not copied
        let mut records = Vec::with_capacity(chunk.ends.len());
        let mut start = 0;
        for &end in &chunk.ends {
            let raw = &chunk.data[start..end];
            records.push((raw.len() as u32, raw.len() as u32, crc32c(raw), Codec::None));
            start = end;
        }
        return Encoded {
            id: chunk.id,
            bytes: chunk.data,
            records,
        };
    }
    let mut bytes = Vec::with_capacity(chunk.data.len() / 2);
    let mut records = Vec::with_capacity(chunk.ends.len());
    let mut start = 0;
    for &end in &chunk.ends {
        let raw = &chunk.data[start..end];
        let before = bytes.len();
        let codec = compressor.compress_into(raw, &mut bytes);
        let stored = &bytes[before..];
        records.push((stored.len() as u32, raw.len() as u32, crc32c(stored), codec));
        start = end;
    }
    Encoded {
        id: chunk.id,
        bytes,
        records,
    }
}

struct ShardSink {
    dir: PathBuf,
    target: u64,
    current: Option<(u32, BufWriter<File>, PathBuf)>,
    current_len: u64,
    shard_bytes: Vec<u64>,
}

impl ShardSink {
    fn close_current(&mut self) -> Result<()> {
        if let Some((_, writer, path)) = self.current.take() {
            let file = writer
                .into_inner()
                .map_err(|e| Error::io(&path)(e.into_error()))?;
            file.sync_all().map_err(Error::io(&path))?;
            self.shard_bytes.push(self.current_len);
        }
        Ok(())
    }

    fn append(&mut self, bytes: &[u8]) -> Result<(u32, u64)> {
        let len = bytes.len() as u64;
        let full = self.current.is_some()
            && self.current_len > SHARD_HEADER_LEN as u64
            && self.current_len + len > self.target;
        if full {
            self.close_current()?;
        }
        if self.current.is_none() {
            let shard = self.shard_bytes.len() as u32;
            let path = self.dir.join(shard_file_name(shard));
            let file = File::create(&path).map_err(Error::io(&path))?;
            let mut w = BufWriter::with_capacity(1 << 20, file);
            w.write_all(&encode_shard_header(shard))
                .map_err(Error::io(&path))?;
            self.current = Some((shard, w, path));
            self.current_len = SHARD_HEADER_LEN as u64;
        }
        let (shard, w, path) = self.current.as_mut().expect("shard open");
        let offset = self.current_len;
        w.write_all(bytes).map_err(Error::io(&*path))?;
        self.current_len += len;
        Ok((*shard, offset))
    }
}

fn run_sink(dir: &Path, target: u64, results: Receiver<Encoded>) -> Result<SinkOutput> {
    let mut sink = ShardSink {
        dir: dir.to_path_buf(),
        target,
        current: None,
        current_len: 0,
        shard_bytes: Vec::new(),
    };
    let mut entries = Vec::new();
    let mut pending: BTreeMap<u64, Encoded> = BTreeMap::new();
    let mut next = 0u64;
    for encoded in results {
        pending.insert(encoded.id, encoded);
        while let Some(chunk) = pending.remove(&next) {
            let mut start = 0usize;
            for &(stored_len, raw_len, checksum, codec) in &chunk.records {
                let end = start + stored_len as usize;
                let (shard, offset) = sink.append(&chunk.bytes[start..end])?;
                entries.push(IndexEntry {
                    offset,
                    shard,
                    stored_len,
                    raw_len,
                    checksum,
                    codec,
                });
                start = end;
            }
            next += 1;
        }
    }
    sink.close_current()?;
    Ok(SinkOutput {
        entries,
        shard_bytes: sink.shard_bytes,
    })
}

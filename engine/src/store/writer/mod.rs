//! Writing one cache: compression and checksums on native threads, records
//! appended to shards in input order, then an atomic publish.
//!
//! * [`CacheWriter`] (here): a source's records in, one published cache out;
//! * `options.rs`: [`WriterOptions`];
//! * `pipeline.rs`: the compressor threads and the shard sink;
//! * `publish.rs`: the index, attributes and manifest, and the publish;
//! * `merge.rs`: [`merge_parts`], one source written in parts joined.

mod merge;
mod options;
mod pipeline;
mod publish;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::DataType;

pub use merge::merge_parts;
pub use options::WriterOptions;
use pipeline::{encode_chunk, run_sink, Chunk, Encoded, SinkOutput};
use publish::{check_attributes, new_manifest, publish, write_attributes, write_index};

use crate::store::codec::{Codec, Compressor};
use crate::store::fs::{remove_stale_temps, temp_sibling};
use crate::store::manifest::Manifest;
use crate::store::validate_source_name;
use crate::Unpoison;
use crate::{Error, Result};

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

impl Drop for CacheWriter {
    fn drop(&mut self) {
        if self.jobs.is_some() || self.sink.is_some() {
            let _ = self.drain();
        }
        // After a successful finish the staging directory has been renamed away.
        let _ = fs::remove_dir_all(&self.staging);
    }
}

//! An opened, published cache: manifest checked, index and shards mapped.
//!
//! Opening costs O(shards), not O(records): the index's entries are checked
//! a chunk at a time when a read first lands in them, and the attributes
//! (read only to make a dataset's first population) when first used, each
//! chunk once per host (`index.drti.chunks`, `attributes.arrow.chunks`: the
//! chunk tables a writer leaves beside the files, see [`super::chunks`]). A
//! cache without them, or whose tables do not match its manifest, is
//! checked whole as before.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::compute::concat_batches;

use super::checksum::crc32c;
use super::chunks::{self, ChunkCheck, ChunkTable};
use super::codec::decode_into;
use super::format::{
    check_index_header, check_shard_header, shard_file_name, IndexEntry, ATTRIBUTES_FILE,
    INDEX_ENTRY_LEN, INDEX_FILE, INDEX_HEADER_LEN, MANIFEST_FILE, SHARD_HEADER_LEN,
};
use super::fs::map_buffer;
use super::host::records;
use super::ipc;
use super::manifest::Manifest;
use super::remote::{block_on, Remote, Replica};
use crate::{Error, Result};

/// A cache's index: its entries mapped in place, checked a chunk at a
/// time as they are read (each chunk once per host). Shared by the cache
/// and, for a cache in a bucket, its replica.
#[derive(Debug)]
pub struct Index {
    path: PathBuf,
    /// The entries (the mapped file past its header).
    entries: Buffer,
    /// The check of the entries by chunk; `None`: checked whole when
    /// opened (no chunk table).
    chunks: Option<ChunkCheck>,
}

/// Where one record's stored bytes are: shard, byte range, CRC-32C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub shard: u32,
    pub start: u64,
    pub end: u64,
    pub crc: u32,
}

impl Index {
    /// Map the index of the cache in `dir` and check its header against
    /// `manifest`; its entries are checked by chunk when read (or whole
    /// here, without a chunk table).
    fn open(dir: &Path, manifest: &Manifest) -> Result<Index> {
        let index_path = dir.join(INDEX_FILE);
        let index = map_buffer(&index_path, "cache index")?;
        let (count, entries_crc) = check_index_header(&index_path, &index)?;
        if count != manifest.records {
            return Err(Error::corrupt(
                &index_path,
                format!(
                    "index has {count} records, manifest says {}",
                    manifest.records
                ),
            ));
        }
        if entries_crc != manifest.index_crc32c {
            return Err(Error::corrupt(
                &index_path,
                "index checksum differs from the manifest's",
            ));
        }
        let entries = index.slice(INDEX_HEADER_LEN);
        let index_chunks =
            match ChunkTable::read_sidecar(&index_path, entries.len() as u64, entries_crc) {
                Some(table) => Some(ChunkCheck::new(
                    &index_path,
                    entries.clone(),
                    INDEX_HEADER_LEN as u64,
                    table.crcs,
                    records::host_key(&index_path),
                )?),
                None => {
                    check_entries(&index_path, &entries, entries_crc)?;
                    None
                }
            };
        Ok(Index {
            path: index_path,
            entries,
            chunks: index_chunks,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn records(&self) -> u64 {
        (self.entries.len() / INDEX_ENTRY_LEN) as u64
    }

    /// The entry of record `s` (< [`Index::records`]), checked.
    fn entry(&self, s: u64) -> Result<IndexEntry> {
        let at = s as usize * INDEX_ENTRY_LEN;
        if let Some(chunks) = &self.chunks {
            chunks.check(at..at + INDEX_ENTRY_LEN)?;
        }
        IndexEntry::decode(&self.entries[at..at + INDEX_ENTRY_LEN]).map_err(|detail| {
            Error::corrupt(
                &self.path,
                format!(
                    "entry of sample {s} at offset {}: {detail}",
                    INDEX_HEADER_LEN + at
                ),
            )
        })
    }

    /// Check every entry (each chunk once per host: the host's later
    /// processes test a bitmap), so that [`Index::span`] may read any.
    pub fn check_all(&self) -> Result<()> {
        match &self.chunks {
            Some(chunks) => chunks.check_all(chunks::check_threads()),
            None => Ok(()), // checked whole at open
        }
    }

    /// Where record `s` (< [`Index::records`]) is stored, read in place
    /// without a check: only after [`Index::check_all`]. A replica's
    /// bookkeeping reads spans of any record (neighbours, what is on disk);
    /// every byte it fetches or reads is verified against the span's CRC.
    pub fn span(&self, s: u64) -> Span {
        let at = s as usize * INDEX_ENTRY_LEN;
        let b = &self.entries[at..at + INDEX_ENTRY_LEN];
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let start = u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
        Span {
            shard: u32_at(8),
            start,
            end: start.saturating_add(u64::from(u32_at(12))),
            crc: u32_at(20),
        }
    }
}

/// A published cache, opened read-only. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Cache {
    dir: PathBuf,
    manifest: Manifest,
    index: Arc<Index>,
    shards: Vec<(PathBuf, Buffer)>,
    /// Decoded and checked on first use.
    attributes: OnceLock<RecordBatch>,
    /// The attributes file's chunk checksums, read at open; `None`: the
    /// file was checked whole there.
    attributes_chunks: Option<Vec<u32>>,
    /// Set for a cache in an object store: `dir` is its local replica, whose
    /// shards are sparse, and records are read through the replica.
    replica: Option<Arc<Replica>>,
}

impl Cache {
    /// Is `dir` a published cache (has a manifest)?
    pub fn is_cache_dir(dir: &Path) -> bool {
        dir.join(MANIFEST_FILE).is_file()
    }

    /// Whether `dir` holds a cache's index or attributes without being a
    /// published cache (its MANIFEST lost): an error to report, not a
    /// directory to skip.
    pub fn looks_like_cache(dir: &Path) -> bool {
        !Self::is_cache_dir(dir)
            && (dir.join(super::format::INDEX_FILE).is_file()
                || dir.join(super::format::ATTRIBUTES_FILE).is_file())
    }

    /// Open and check a published cache: manifest checksum and version, index
    /// header and length, every shard's length and header. The index's
    /// entries and the attributes are checked when first read (whole, here,
    /// for a cache without chunk tables); record bytes on each read.
    pub fn open(dir: &Path) -> Result<Cache> {
        Self::open_checked(dir)
    }

    /// Open cache `name` of the object store at `remote`: replicate its
    /// metadata into the local cache directory and open the replica.
    /// `whole`: the budget holds the whole dataset, so the replica is never
    /// evicted and is read in place (see `Replica`).
    pub fn open_remote(remote: &Arc<Remote>, name: &str, whole: bool) -> Result<Cache> {
        let dir = block_on({
            let remote = remote.clone();
            let name = name.to_string();
            async move { remote.replicate(&name, whole).await }
        })??;
        let mut cache = Self::open_checked(&dir)?;
        let stored = cache.manifest.shard_bytes.iter().sum::<u64>()
            - cache.shards.len() as u64 * SHARD_HEADER_LEN as u64;
        cache.replica = Some(Arc::new(Replica::open(
            remote.clone(),
            name,
            &dir,
            cache.shards.len(),
            cache.index.clone(),
            stored,
            whole,
        )?));
        Ok(cache)
    }

    /// The replica, for a cache in an object store.
    pub fn replica(&self) -> Option<&Arc<Replica>> {
        self.replica.as_ref()
    }

    fn open_checked(dir: &Path) -> Result<Cache> {
        let manifest = Self::read_manifest(dir)?;
        let index = Index::open(dir, &manifest)?;
        let shards = Self::map_shards(dir, &manifest)?;

        let attributes_chunks = ChunkTable::read_sidecar(
            &dir.join(ATTRIBUTES_FILE),
            manifest.attributes_bytes,
            manifest.attributes_crc32c,
        )
        .map(|table| table.crcs);
        let cache = Cache {
            dir: dir.to_path_buf(),
            manifest,
            index: Arc::new(index),
            shards,
            attributes: OnceLock::new(),
            attributes_chunks,
            replica: None,
        };
        if cache.attributes_chunks.is_none() {
            cache.attributes()?; // checked whole now, as before chunk tables
        }
        Ok(cache)
    }

    /// The manifest of the cache in `dir`, checked.
    fn read_manifest(dir: &Path) -> Result<Manifest> {
        if !dir.is_dir() {
            return Err(Error::NotFound {
                what: "cache directory",
                path: dir.to_path_buf(),
            });
        }
        let manifest_path = dir.join(MANIFEST_FILE);
        let text = std::fs::read(&manifest_path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotFound {
                what: "cache manifest",
                path: manifest_path.clone(),
            },
            _ => Error::io(&manifest_path)(e),
        })?;
        Manifest::decode(&manifest_path, &text)
    }

    /// The shards of the cache in `dir`, mapped, each of the length
    /// `manifest` gives and with its header checked.
    fn map_shards(dir: &Path, manifest: &Manifest) -> Result<Vec<(PathBuf, Buffer)>> {
        let mut shards = Vec::with_capacity(manifest.shard_bytes.len());
        for (i, &expected) in manifest.shard_bytes.iter().enumerate() {
            let path = dir.join(shard_file_name(i as u32));
            let map = map_buffer(&path, "payload shard")?;
            if map.len() as u64 != expected {
                return Err(Error::corrupt(
                    &path,
                    format!(
                        "shard {i} is {} bytes, manifest says {expected} (truncated or overwritten)",
                        map.len()
                    ),
                ));
            }
            check_shard_header(&path, &map, i as u32)?;
            shards.push((path, map));
        }
        Ok(shards)
    }

    /// Check the attributes file (by chunk, each once per host, when it has
    /// a chunk table; else whole) and decode it.
    fn load_attributes(&self) -> Result<RecordBatch> {
        let path = self.dir.join(ATTRIBUTES_FILE);
        let (len, crc) = (
            self.manifest.attributes_bytes,
            self.manifest.attributes_crc32c,
        );
        let raw = map_buffer(&path, "cache attributes")?;
        if raw.len() as u64 != len {
            return Err(Error::corrupt(
                &path,
                format!("{} bytes, manifest says {len}", raw.len()),
            ));
        }
        match &self.attributes_chunks {
            Some(crcs) => {
                let check = ChunkCheck::new(
                    &path,
                    raw.clone(),
                    0,
                    crcs.clone(),
                    records::host_key(&path),
                )?;
                check.check_all(chunks::check_threads())?;
            }
            None if crc32c(&raw) != crc => {
                return Err(Error::corrupt(&path, "attributes checksum mismatch"));
            }
            None => {}
        }
        let (schema, batches) = ipc::decode_verified(&path, raw)?;
        let attributes = if batches.len() == 1 {
            batches.into_iter().next().expect("one batch")
        } else {
            concat_batches(&schema, &batches)?
        };
        if attributes.num_rows() as u64 != self.manifest.records
            || schema.fields().first().map(|f| f.name().as_str()) != Some("sample_id")
        {
            return Err(Error::corrupt(
                &path,
                format!(
                    "expected {} rows led by a sample_id column, found {} rows",
                    self.manifest.records,
                    attributes.num_rows()
                ),
            ));
        }
        Ok(attributes)
    }

    /// Check the index and attributes whole, from the files, whatever this
    /// process or the host checked before (what `verify` does).
    pub fn check_files(&self) -> Result<()> {
        check_entries(
            &self.index.path,
            &self.index.entries,
            self.manifest.index_crc32c,
        )?;
        let path = self.dir.join(ATTRIBUTES_FILE);
        let (found, read) = super::checksum::crc32c_file(&path).map_err(Error::io(&path))?;
        if found != self.manifest.attributes_crc32c || read != self.manifest.attributes_bytes {
            return Err(Error::corrupt(&path, "attributes checksum mismatch"));
        }
        self.attributes().map(|_| ())
    }

    pub fn id(&self) -> i64 {
        self.manifest.cache_id
    }

    pub fn name(&self) -> &str {
        &self.manifest.name
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn records(&self) -> u64 {
        self.manifest.records
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Stored attributes: `sample_id` then the source's metadata columns
    /// (checked and decoded on first use).
    pub fn attributes(&self) -> Result<&RecordBatch> {
        if let Some(a) = self.attributes.get() {
            return Ok(a);
        }
        let loaded = self.load_attributes()?;
        Ok(self.attributes.get_or_init(|| loaded))
    }

    /// The index entry of one record, read in place from the mapped index.
    pub fn entry(&self, sample_id: u64) -> Result<IndexEntry> {
        if sample_id >= self.manifest.records {
            return Err(Error::invalid(format!(
                "sample_id {sample_id} is out of range for cache {:?} (cache_id {}, {} samples)",
                self.manifest.name, self.manifest.cache_id, self.manifest.records
            ))
            .at_column("sample_id", Some(sample_id.to_string())));
        }
        self.index.entry(sample_id)
    }

    /// The file that `buffer` maps, and its length as this cache mapped it,
    /// when `buffer` is this cache's mapping of shard `shard` and the shard
    /// is read in place (a local cache or a whole replica); `None` otherwise
    /// (a decode buffer, a record copied out of an evicting replica). A view
    /// of [`crate::store::CacheSet::take`] into such a buffer names the same
    /// bytes at the same offset of the file, verified by the take; a reader
    /// that maps the file itself must check it still has that length.
    pub fn shard_file(&self, shard: u32, buffer: &Buffer) -> Option<(&Path, u64)> {
        let in_place = self.replica.as_ref().is_none_or(|r| r.whole());
        let (path, mapped) = self.shards.get(shard as usize)?;
        let same = mapped.as_ptr() == buffer.as_ptr() && mapped.len() == buffer.len();
        (in_place && same).then_some((path.as_path(), mapped.len() as u64))
    }

    /// Ask the kernel to start reading record `sample_id`'s stored bytes
    /// into the page cache (`madvise(MADV_WILLNEED)` on its mapped range),
    /// without waiting for them; returns the bytes advised. Advice only: a
    /// replica, a bad id or a refused call advise nothing.
    pub fn advise_willneed(&self, sample_id: u64) -> u64 {
        if self.replica.is_some() {
            return 0;
        }
        let Ok(e) = self.entry(sample_id) else {
            return 0;
        };
        let Some((_, shard)) = self.shards.get(e.shard as usize) else {
            return 0;
        };
        let start = e.offset as usize;
        let end = start.saturating_add(e.stored_len as usize).min(shard.len());
        if start < end && super::fs::advise(&shard[start..end], super::fs::Access::Soon) {
            (end - start) as u64
        } else {
            0
        }
    }

    /// Check every record's stored bytes against the checksum its index
    /// holds (what a full local build passes and a sparse replica fails);
    /// the first record that fails is the error.
    pub fn check_records(&self) -> Result<()> {
        for sample in 0..self.records() {
            let entry = self.entry(sample)?;
            self.stored(sample, &entry, true)?;
        }
        Ok(())
    }

    /// Append the decoded bytes of record `sample_id` to `out`, verifying its
    /// checksum first when `verify` is set.
    pub fn read_into(&self, sample_id: u64, out: &mut Vec<u8>, verify: bool) -> Result<()> {
        let entry = self.entry(sample_id)?;
        let start = out.len();
        out.resize(start + entry.raw_len as usize, 0);
        let result = self.read_entry(sample_id, &entry, &mut out[start..], verify);
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    /// The stored bytes of record `entry` (of `sample_id`): the shard's buffer
    /// and the record's range in it, bounds checked and, when `verify`,
    /// checksum verified.
    pub fn stored(
        &self,
        sample_id: u64,
        e: &IndexEntry,
        verify: bool,
    ) -> Result<(&Buffer, usize, usize)> {
        if self.replica.as_ref().is_some_and(|r| !r.whole()) {
            return Err(Error::internal(
                "records of an evicting replica are read through read_entry",
            ));
        }
        let (path, shard) = self.shards.get(e.shard as usize).ok_or_else(|| {
            Error::corrupt(
                &self.index.path,
                format!(
                    "sample {sample_id} points at shard {} of {}",
                    e.shard,
                    self.shards.len()
                ),
            )
        })?;
        let start = e.offset as usize;
        let end = start.saturating_add(e.stored_len as usize);
        if start < super::format::SHARD_HEADER_LEN || end > shard.len() {
            return Err(Error::corrupt_record(
                path,
                sample_id,
                Some(e.shard),
                Some(start as u64),
                format!(
                    "sample {sample_id} at shard {} offset {start}: {} bytes run past the end ({} bytes)",
                    e.shard,
                    e.stored_len,
                    shard.len()
                ),
            ));
        }
        if let Some(replica) = &self.replica {
            // fetched if the replica does not hold it yet; verified in place
            replica.ensure(sample_id, e.checksum, &shard[start..end])?;
        } else if verify {
            let actual = crc32c(&shard[start..end]);
            if actual != e.checksum {
                return Err(Error::corrupt_record(
                    path,
                    sample_id,
                    Some(e.shard),
                    Some(start as u64),
                    format!(
                        "sample {sample_id} at shard {} offset {start}: checksum mismatch \
                         (stored crc32c {:08x}, computed {actual:08x})",
                        e.shard, e.checksum
                    ),
                ));
            }
        }
        Ok((shard, start, end))
    }

    /// Decode the record `entry` (of `sample_id`) into `out`, which must be
    /// `entry.raw_len` bytes long, verifying its checksum first when `verify`.
    pub fn read_entry(
        &self,
        sample_id: u64,
        e: &IndexEntry,
        out: &mut [u8],
        verify: bool,
    ) -> Result<()> {
        if let Some(replica) = self.replica.as_ref().filter(|r| !r.whole()) {
            // verified on the copy, whatever `verify` says: the replica may not hold it
            if e.codec == super::Codec::None && e.stored_len == e.raw_len {
                return replica.read(sample_id, e.checksum, out);
            }
            let mut stored = vec![0u8; e.stored_len as usize];
            replica.read(sample_id, e.checksum, &mut stored)?;
            return decode_into(e.codec, &stored, out).map_err(|detail| {
                Error::corrupt_record(
                    &self.shards[e.shard as usize].0,
                    sample_id,
                    Some(e.shard),
                    Some(e.offset),
                    format!("sample {sample_id}: {detail}"),
                )
            });
        }
        let (shard, start, end) = self.stored(sample_id, e, verify)?;
        decode_into(e.codec, &shard[start..end], out).map_err(|detail| {
            let path = &self.shards[e.shard as usize].0;
            Error::corrupt_record(
                path,
                sample_id,
                Some(e.shard),
                Some(start as u64),
                format!(
                    "sample {sample_id} at shard {} offset {start}: {detail}",
                    e.shard
                ),
            )
        })
    }
}

/// Check an index's `entries` whole against `crc`.
fn check_entries(path: &Path, entries: &[u8], crc: u32) -> Result<()> {
    if crc32c(entries) != crc {
        return Err(Error::corrupt(path, "index entries checksum mismatch"));
    }
    Ok(())
}

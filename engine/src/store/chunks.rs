//! Chunked checksums: a CRC-32C per 64 KiB of a file, so that a reader
//! checks the parts of a large file it reads when it first reads them, not
//! the whole file when it opens it, and a record the processes of a host
//! share makes each check once per host ([`super::host::records`]).
//!
//! A table of chunk checksums is kept either beside its file, as a sidecar
//! `<file>.chunks` (snapshot column files, whose Arrow IPC bytes cannot
//! carry it), or inside the file (alias tables). A sidecar names the length
//! and whole-file CRC-32C of the file it describes and is sealed by its own
//! checksum: it is trusted only when both match what the manifest that names
//! the file says, so a damaged, stale or missing sidecar costs a whole-file
//! check, never a wrong byte.
//!
//! Sidecar layout (little-endian): magic `DRTCHUNK`, u32 version, u32 chunk
//! size, u64 file length, u32 file CRC-32C, u32 chunk count, the chunk
//! CRC-32Cs, then the CRC-32C of every byte before it.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use arrow::buffer::Buffer;

use super::checksum::{crc32c, seal_bytes, unseal_bytes};
use super::host::records::HostBits;
use crate::{Error, Result};

pub use super::checksum::CHUNK;

const MAGIC: [u8; 8] = *b"DRTCHUNK";
const VERSION: u32 = 1;
const SIDECAR_HEADER: usize = 32;

/// Threads that check a file's chunks when it is read whole.
pub fn check_threads() -> usize {
    crate::threads().min(4)
}

/// Chunks of a file of `len` bytes.
pub fn chunk_count(len: u64) -> usize {
    len.div_ceil(CHUNK as u64) as usize
}

/// CRC-32C of every [`CHUNK`] of `bytes` (the last one may be shorter).
pub fn chunk_crcs(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks(CHUNK).map(crc32c).collect()
}

/// The chunk checksums of one file, with the file's length and whole CRC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkTable {
    pub file_len: u64,
    pub file_crc: u32,
    pub crcs: Vec<u32>,
}

impl ChunkTable {
    /// The table of the file at `path`, read in pieces (not mapped).
    pub fn of_file(path: &Path) -> std::io::Result<ChunkTable> {
        use std::io::Read;
        let mut file = std::fs::File::open(path)?;
        let mut whole = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
        let mut crcs = Vec::new();
        let mut buf = vec![0u8; CHUNK];
        let mut len = 0u64;
        loop {
            let mut filled = 0;
            while filled < CHUNK {
                match file.read(&mut buf[filled..]) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if filled == 0 {
                break;
            }
            whole.update(&buf[..filled]);
            crcs.push(crc32c(&buf[..filled]));
            len += filled as u64;
            if filled < CHUNK {
                break;
            }
        }
        Ok(ChunkTable {
            file_len: len,
            file_crc: whole.finalize() as u32,
            crcs,
        })
    }

    /// The sidecar bytes of this table.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(SIDECAR_HEADER + 4 * self.crcs.len() + 4);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(CHUNK as u32).to_le_bytes());
        out.extend_from_slice(&self.file_len.to_le_bytes());
        out.extend_from_slice(&self.file_crc.to_le_bytes());
        out.extend_from_slice(&(self.crcs.len() as u32).to_le_bytes());
        for crc in &self.crcs {
            out.extend_from_slice(&crc.to_le_bytes());
        }
        seal_bytes(&mut out);
        out
    }

    /// The table in `bytes`, if they are a whole, undamaged sidecar of this
    /// format describing a file of `len` bytes with CRC-32C `crc`.
    pub fn decode(bytes: &[u8], len: u64, crc: u32) -> Option<ChunkTable> {
        let bytes = unseal_bytes(bytes).ok()?;
        let body = bytes.len();
        let u32_at = |at: usize| Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
        if bytes.get(..8)? != MAGIC || u32_at(8)? != VERSION || u32_at(12)? as usize != CHUNK {
            return None;
        }
        let file_len = u64::from_le_bytes(bytes.get(16..24)?.try_into().ok()?);
        let file_crc = u32_at(24)?;
        let count = u32_at(28)? as usize;
        if file_len != len
            || file_crc != crc
            || count != chunk_count(len)
            || body != SIDECAR_HEADER + 4 * count
        {
            return None;
        }
        let crcs = bytes[SIDECAR_HEADER..body]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        Some(ChunkTable {
            file_len,
            file_crc,
            crcs,
        })
    }

    /// The sidecar path of `file`.
    pub fn sidecar(file: &Path) -> PathBuf {
        let mut name = file.file_name().unwrap_or_default().to_os_string();
        name.push(".chunks");
        file.with_file_name(name)
    }

    /// The sidecar of `file` if it is present and describes a file of `len`
    /// bytes with CRC-32C `crc` (what the manifest naming `file` says).
    pub fn read_sidecar(file: &Path, len: u64, crc: u32) -> Option<ChunkTable> {
        Self::decode(&std::fs::read(Self::sidecar(file)).ok()?, len, crc)
    }

    /// Store this table as `file`'s sidecar (temporary file, fsync, rename).
    pub fn write_sidecar(&self, file: &Path) -> Result<()> {
        super::fs::write_atomic(&Self::sidecar(file), &self.encode())
    }
}

/// Checks the bytes of a mapped file chunk by chunk, each once per process
/// and, where the host keeps records, once per host.
pub struct ChunkCheck {
    path: PathBuf,
    /// The checked bytes (a mapping, or a part of one), kept alive here.
    bytes: Buffer,
    /// Where `bytes` start in the file (for reads from the file).
    at: u64,
    crcs: Vec<u32>,
    /// Chunks this process knows to be good, and how many.
    mine: Vec<AtomicU64>,
    known: AtomicUsize,
    /// Every chunk known good: a read then checks nothing.
    all: AtomicBool,
    host: Option<HostBits>,
}

impl std::fmt::Debug for ChunkCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkCheck")
            .field("path", &self.path)
            .field("chunks", &self.crcs.len())
            .finish()
    }
}

impl ChunkCheck {
    /// A check of `bytes`, which are the bytes of `path` from offset `at`
    /// on, against `crcs` (one per [`CHUNK`] of `bytes`). `host` is where the
    /// host records checked chunks of this version of the file
    /// ([`host_key`](super::host::records::host_key)), if it does.
    pub fn new(
        path: &Path,
        bytes: Buffer,
        at: u64,
        crcs: Vec<u32>,
        host: Option<PathBuf>,
    ) -> Result<ChunkCheck> {
        let len = bytes.len();
        if crcs.len() != chunk_count(len as u64) {
            return Err(Error::corrupt(
                path,
                format!(
                    "{} chunk checksums for a file of {len} bytes ({} chunks)",
                    crcs.len(),
                    chunk_count(len as u64)
                ),
            ));
        }
        let words = crcs.len().div_ceil(64);
        let mut host_path = host;
        if let Some(p) = &mut host_path {
            p.as_mut_os_string().push(".bits");
        }
        Ok(ChunkCheck {
            path: path.to_path_buf(),
            bytes,
            at,
            all: AtomicBool::new(crcs.is_empty()),
            known: AtomicUsize::new(0),
            mine: (0..words).map(|_| AtomicU64::new(0)).collect(),
            host: host_path.and_then(|p| HostBits::open(&p, crcs.len())),
            crcs,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn len(&self) -> usize {
        self.bytes.len()
    }

    fn chunk(&self, chunk: usize) -> &[u8] {
        let start = chunk * CHUNK;
        &self.bytes[start..(start + CHUNK).min(self.len())]
    }

    /// Whether every chunk is known good (a read then needs no check).
    #[inline]
    pub fn is_all(&self) -> bool {
        self.all.load(Ordering::Relaxed)
    }

    #[inline]
    fn known(&self, chunk: usize) -> bool {
        let bit = 1u64 << (chunk % 64);
        if self.mine[chunk / 64].load(Ordering::Relaxed) & bit != 0 {
            return true;
        }
        if let Some(host) = &self.host {
            if host.word(chunk / 64).load(Ordering::Acquire) & bit != 0 {
                self.learn(chunk);
                return true;
            }
        }
        false
    }

    /// Note in this process that `chunk` is good; the last one noted makes
    /// every later read skip the checks.
    fn learn(&self, chunk: usize) {
        let bit = 1u64 << (chunk % 64);
        if self.mine[chunk / 64].fetch_or(bit, Ordering::Relaxed) & bit == 0
            && self.known.fetch_add(1, Ordering::Relaxed) + 1 == self.crcs.len()
        {
            self.all.store(true, Ordering::Release);
        }
    }

    fn mark(&self, chunk: usize) {
        self.learn(chunk);
        if let Some(host) = &self.host {
            host.word(chunk / 64)
                .fetch_or(1u64 << (chunk % 64), Ordering::Release);
        }
    }

    fn mismatch(&self, chunk: usize, found: u32) -> Error {
        let start = chunk * CHUNK;
        let end = (start + CHUNK).min(self.len());
        let (start, end) = (self.at + start as u64, self.at + end as u64);
        Error::corrupt(
            &self.path,
            format!(
                "chunk {chunk} (bytes {start}..{end}) does not match its checksum (crc32c {found:08x}, expected {:08x})",
                self.crcs[chunk]
            ),
        )
    }

    /// Check the chunks holding `bytes` (a range of the file) that neither
    /// this process nor the host has checked, by reading them through the
    /// mapping (a reader of those bytes touches their pages anyway).
    #[inline]
    pub fn check(&self, bytes: Range<usize>) -> Result<()> {
        if bytes.end <= self.len() && bytes.start < bytes.end {
            // the common case of a small read: its chunk known already
            if self.all.load(Ordering::Relaxed) {
                return Ok(());
            }
            let chunk = bytes.start / CHUNK;
            if chunk == (bytes.end - 1) / CHUNK && self.known(chunk) {
                return Ok(());
            }
        }
        self.check_slow(bytes)
    }

    /// Ask the kernel to start reading what a coming [`check`](Self::check)
    /// and read of `bytes` will touch, without waiting: their chunks whole
    /// while one is still to be checked (its check reads all of it), else
    /// their pages alone. Nothing once this process knows each of their
    /// chunks good (it checked it, or learnt it from the host's record and
    /// read there): the steady state of a loader costs no system call,
    /// and a later process is advised only its first page of each chunk.
    /// Advice only: it checks nothing.
    pub fn advise(&self, bytes: Range<usize>) {
        if self.is_all() || bytes.start >= bytes.end || bytes.end > self.len() {
            return;
        }
        let (first, last) = (bytes.start / CHUNK, (bytes.end - 1) / CHUNK);
        let mine = |c: usize| self.mine[c / 64].load(Ordering::Relaxed) & (1u64 << (c % 64)) != 0;
        if (first..=last).all(mine) {
            return;
        }
        let read = if (first..=last).all(|c| self.known(c)) {
            bytes
        } else {
            first * CHUNK..((last + 1) * CHUNK).min(self.len())
        };
        super::fs::advise(&self.bytes[read], super::fs::Access::Soon);
    }

    #[cold]
    fn check_slow(&self, bytes: Range<usize>) -> Result<()> {
        if bytes.end > self.len() || bytes.start > bytes.end {
            return Err(Error::corrupt(
                &self.path,
                format!(
                    "bytes {bytes:?} lie outside the file ({} bytes)",
                    self.len()
                ),
            ));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        let chunks = bytes.start / CHUNK..=(bytes.end - 1) / CHUNK;
        let unknown: Vec<usize> = chunks.filter(|&c| !self.known(c)).collect();
        // each read whole by its check: one read of the disk each, not a
        // fault per page (the mapping may be advised `Sparse`)
        for &chunk in &unknown {
            super::fs::advise(self.chunk(chunk), super::fs::Access::Soon);
        }
        for chunk in unknown {
            let found = crc32c(self.chunk(chunk));
            if found != self.crcs[chunk] {
                return Err(self.mismatch(chunk, found));
            }
            self.mark(chunk);
        }
        Ok(())
    }

    /// Check every chunk not yet checked, read from the file rather than
    /// the mapping (so a check does not fault every page into this process),
    /// on up to `threads` threads.
    pub fn check_all(&self, threads: usize) -> Result<()> {
        if self.all.load(Ordering::Acquire) {
            return Ok(());
        }
        let todo: Vec<usize> = (0..self.crcs.len()).filter(|&c| !self.known(c)).collect();
        if todo.is_empty() {
            return Ok(());
        }
        let file = std::fs::File::open(&self.path).map_err(Error::io(&self.path))?;
        let threads = threads.clamp(1, todo.len().div_ceil(64).max(1));
        let part = todo.len().div_ceil(threads);
        std::thread::scope(|s| {
            let workers: Vec<_> = todo
                .chunks(part)
                .map(|mine| s.spawn(|| self.check_from_file(&file, mine)))
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect::<Result<Vec<()>>>()
        })?;
        Ok(()) // every chunk is now known: `learn` set `all`
    }

    fn check_from_file(&self, file: &std::fs::File, chunks: &[usize]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; CHUNK];
        for &chunk in chunks {
            let start = chunk * CHUNK;
            let want = (start + CHUNK).min(self.len()) - start;
            file.read_exact_at(&mut buf[..want], self.at + start as u64)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => Error::corrupt(
                        &self.path,
                        format!("file is shorter than its {} mapped bytes", self.len()),
                    ),
                    _ => Error::io(&self.path)(e),
                })?;
            let found = crc32c(&buf[..want]);
            if found != self.crcs[chunk] {
                return Err(self.mismatch(chunk, found));
            }
            self.mark(chunk);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(path: &Path, bytes: &[u8]) -> Buffer {
        std::fs::write(path, bytes).unwrap();
        Buffer::from_vec(bytes.to_vec())
    }

    #[test]
    fn a_sidecar_is_trusted_only_for_the_file_it_describes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.arrow");
        let bytes: Vec<u8> = (0..3 * CHUNK + 17).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&file, &bytes).unwrap();
        let table = ChunkTable::of_file(&file).unwrap();
        assert_eq!(table.crcs, chunk_crcs(&bytes));
        assert_eq!(table.file_crc, crc32c(&bytes));
        table.write_sidecar(&file).unwrap();
        let (len, crc) = (bytes.len() as u64, crc32c(&bytes));
        assert_eq!(
            ChunkTable::read_sidecar(&file, len, crc),
            Some(table.clone())
        );
        // another file's length or checksum: not this file's table
        assert_eq!(ChunkTable::read_sidecar(&file, len + 1, crc), None);
        assert_eq!(ChunkTable::read_sidecar(&file, len, crc ^ 1), None);
        // any damaged byte of the sidecar: not trusted
        let good = table.encode();
        for at in 0..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            assert_eq!(ChunkTable::decode(&bad, len, crc), None, "byte {at}");
        }
        assert_eq!(ChunkTable::decode(&good[..good.len() - 1], len, crc), None);
    }

    #[test]
    fn a_damaged_chunk_is_found_where_it_is_read_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.arrow");
        let mut bytes: Vec<u8> = (0..4 * CHUNK + 8).map(|i| (i % 13) as u8).collect();
        let crcs = chunk_crcs(&bytes[8..]);
        bytes[8 + 2 * CHUNK + 5] ^= 1;
        let whole = stored(&file, &bytes);
        // the checked part starts 8 bytes into the file
        let check = ChunkCheck::new(&file, whole.slice(8), 8, crcs, None).unwrap();
        check.check(0..8).unwrap();
        check.check(CHUNK - 4..CHUNK + 4).unwrap();
        check.check(3 * CHUNK..4 * CHUNK).unwrap();
        let err = check.check(2 * CHUNK + 100..2 * CHUNK + 108).unwrap_err();
        let named = format!("chunk 2 (bytes {}..{})", 8 + 2 * CHUNK, 8 + 3 * CHUNK);
        assert!(
            matches!(&err, Error::Corrupt { path, detail, .. }
            if path == &file && detail.contains(&named)),
            "{err}"
        );
        let err = check.check_all(2).unwrap_err();
        assert!(err.to_string().contains(&named), "{err}");
        assert!(check.check(0..4 * CHUNK + 1).is_err(), "past the end");
    }
}

//! Chunked checksums: a CRC-32C per 64 KiB of a file, so that a reader
//! checks the parts of a large file it reads when it first reads them, not
//! the whole file when it opens it, and a record the processes of a host
//! share makes each check once per host.
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
//!
//! The host's record of checked chunks is a bitmap in shared memory
//! (`/dev/shm/datasetrt-<uid>/verified/<file name>.<device>.<inode>-<generation>.<length>.<mtime ns>.<ctime ns>.bits`),
//! never in the dataset (which may be read-only or shared). Any change of
//! the file (a write in place, a rename over it, its times put back) changes
//! its inode or change time and so names a new, empty bitmap.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use arrow::buffer::Buffer;
use memmap2::MmapMut;

use super::checksum::crc32c;
use crate::{Error, Result};

/// Bytes per checked chunk: a loader's draw reads 8 bytes of a column and
/// checks the 64 KiB around them once (16 pages), a batch of 256 draws a few
/// MiB; a sidecar is 1/16384 of its file.
pub const CHUNK: usize = 64 << 10;

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
        let seal = crc32c(&out);
        out.extend_from_slice(&seal.to_le_bytes());
        out
    }

    /// The table in `bytes`, if they are a whole, undamaged sidecar of this
    /// format describing a file of `len` bytes with CRC-32C `crc`.
    pub fn decode(bytes: &[u8], len: u64, crc: u32) -> Option<ChunkTable> {
        let body = bytes.len().checked_sub(4)?;
        let u32_at = |at: usize| Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
        if bytes.get(..8)? != MAGIC
            || u32_at(8)? != VERSION
            || u32_at(12)? as usize != CHUNK
            || u32_at(body)? != crc32c(&bytes[..body])
        {
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

/// This user's directory of what a host's processes share in shared
/// memory (`/dev/shm/datasetrt-<uid>`), if there is shared memory and the
/// directory is this user's.
pub fn host_dir() -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let shm = Path::new("/dev/shm");
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let mine = shm.join(format!("datasetrt-{uid}"));
    match std::fs::symlink_metadata(&mine) {
        // another user's directory under this name vouches for nothing
        Ok(meta) if !meta.is_dir() || meta.uid() != uid => None,
        Ok(_) => Some(mine),
        Err(_) => shm.is_dir().then_some(mine),
    }
}

/// This user's directory of host records in shared memory (in [`host_dir`]).
pub fn verified_dir() -> Option<PathBuf> {
    host_dir().map(|d| d.join("verified"))
}

/// The name of the host's records about the current version of `file`: its
/// name, device, inode (number and generation), length, and modification
/// and change times in nanoseconds, in [`verified_dir`]. The generation
/// tells a new file from an old one whose freed inode number it reuses
/// (file systems that keep none give 0): times alone would not, as they
/// move in clock ticks of a few milliseconds.
pub fn host_key(file: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let opened = std::fs::File::open(file).ok()?;
    let meta = opened.metadata().ok()?;
    let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
    let name = format!(
        "{}.{}.{}-{}.{}.{}.{}",
        file.file_name()?.to_str()?,
        meta.dev(),
        meta.ino(),
        generation(&opened),
        meta.len(),
        ns(meta.mtime(), meta.mtime_nsec()),
        ns(meta.ctime(), meta.ctime_nsec()),
    );
    Some(verified_dir()?.join(name))
}

/// The inode generation of `file` (`FS_IOC_GETVERSION`), 0 where the file
/// system keeps none.
fn generation(file: &std::fs::File) -> i64 {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let mut version: libc::c_long = 0;
        // SAFETY: a valid open descriptor and a c_long for the kernel to fill.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::FS_IOC_GETVERSION, &mut version) };
        if rc == 0 {
            return version;
        }
    }
    let _ = file;
    0
}

/// Record on the host that every one of the `chunks` chunks of the current
/// version of `file` is good: for a file this process has just written, its
/// checksums taken from the bytes it wrote (no second read to check them).
/// Best effort, like every host record.
pub fn record_checked(file: &Path, chunks: usize) {
    let Some(mut key) = host_key(file) else {
        return;
    };
    key.as_mut_os_string().push(".bits");
    if let Some(bits) = HostBits::open(&key, chunks) {
        for word in 0..chunks.div_ceil(64) {
            let mask = match chunks - word * 64 {
                n if n >= 64 => u64::MAX,
                n => (1u64 << n) - 1,
            };
            bits.word(word).fetch_or(mask, Ordering::Release);
        }
    }
}

/// Make the host's `record` (see [`host_key`]) that its whole file passed
/// its check: an empty file, for files without a chunk table. Best effort: a
/// directory this process cannot write keeps the check per process.
pub fn record_whole(record: &Path) {
    let Some(dir) = record.parent() else {
        return;
    };
    let _ = std::fs::create_dir_all(dir);
    if std::fs::File::create(record).is_ok() {
        swept_now_and_then(dir);
    }
}

/// Records the host keeps at most: past this the least recently used go.
/// A record is a page of shared memory at most (a bitmap of 32,768 chunks,
/// 2 GiB of file), so 128 MiB at most; a snapshot of 10^10 rows in the
/// default partitions has about 15,000 column files.
pub const HOST_RECORDS: usize = 32_768;
/// A record neither made, written nor mapped this long is removed.
pub const HOST_RECORD_AGE: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);
/// How often a process of the host that makes a record looks over them.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(600);
/// The file whose modification time says when the records were last swept.
const SWEPT: &str = ".swept";

/// After making a record in `dir` (the host's records): sweep them if no
/// process did in the last [`SWEEP_EVERY`]. Records are named by file
/// versions, and nothing says when a version is gone (a dataset deleted, a
/// column rewritten), so without this they would fill shared memory.
fn swept_now_and_then(dir: &Path) {
    let stamp = dir.join(SWEPT);
    let due = match std::fs::metadata(&stamp).and_then(|m| m.modified()) {
        Ok(at) => at.elapsed().map_or(true, |age| age >= SWEEP_EVERY),
        Err(_) => true,
    };
    let claimed = due
        && std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&stamp)
            .and_then(|f| f.set_modified(std::time::SystemTime::now()))
            .is_ok();
    if claimed {
        sweep(dir, HOST_RECORDS, HOST_RECORD_AGE);
    }
}

/// Remove the host's records in `dir` last used more than `age` ago (made,
/// written, or mapped: the later of modification and access time), then,
/// while more than `keep` remain, the least recently used down to three
/// quarters of `keep`. Losing a record only costs a check: a process that
/// maps it keeps its bits, the next process checks again. Returns how many
/// were removed.
pub fn sweep(dir: &Path, keep: usize, age: std::time::Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let now = std::time::SystemTime::now();
    let mut kept = Vec::new();
    let mut removed = 0;
    for entry in entries.flatten() {
        if entry.file_name() == SWEPT {
            continue;
        }
        let Ok(meta) = entry.metadata() else {
            continue; // removed meanwhile
        };
        let used = [meta.modified(), meta.accessed()]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(now);
        if now.duration_since(used).is_ok_and(|idle| idle > age) {
            removed += usize::from(std::fs::remove_file(entry.path()).is_ok());
        } else {
            kept.push((used, entry.path()));
        }
    }
    if kept.len() > keep {
        kept.sort_unstable();
        let excess = kept.len() - keep * 3 / 4;
        for (_, path) in &kept[..excess] {
            removed += usize::from(std::fs::remove_file(path).is_ok());
        }
    }
    removed
}

/// A bitmap of checked chunks in a shared mapping: the host's record.
struct HostBits {
    map: MmapMut,
}

impl HostBits {
    /// The bitmap at `path` for `chunks` chunks, created empty if absent.
    /// Creators agree: a new file is extended to its length, which leaves
    /// any bit another process set in place.
    fn open(path: &Path, chunks: usize) -> Option<HostBits> {
        let bytes = chunks.div_ceil(64) as u64 * 8;
        std::fs::create_dir_all(path.parent()?).ok()?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .ok()?;
        match file.metadata().ok()?.len() {
            0 => {
                file.set_len(bytes).ok()?;
                swept_now_and_then(path.parent()?);
            }
            len if len == bytes => {}
            _ => return None, // not a bitmap of this file: vouches for nothing
        }
        // SAFETY: a shared mapping of this user's file in shared memory, of
        // the length just checked; it is only read and written through
        // atomics (other processes write it concurrently).
        let map = unsafe { MmapMut::map_mut(&file) }.ok()?;
        Some(HostBits { map })
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!((i + 1) * 8 <= self.map.len());
        // SAFETY: the mapping is page-aligned and holds whole u64 words;
        // every access goes through this atomic view.
        unsafe { &*(self.map.as_ptr() as *const AtomicU64).add(i) }
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
    /// ([`host_key`]), if it does.
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

    #[test]
    fn the_host_record_is_shared_and_names_one_version_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.arrow");
        let bytes: Vec<u8> = (0..2 * CHUNK + 1).map(|i| (i % 7) as u8).collect();
        let crcs = chunk_crcs(&bytes);
        let buffer = stored(&file, &bytes);
        let record = dir.path().join("host").join("c.arrow.1");
        let first = ChunkCheck::new(&file, buffer.clone(), 0, crcs, Some(record.clone())).unwrap();
        first.check_all(2).unwrap();
        // a second process's check of the same version: every chunk known,
        // so even a wrong table (standing in for bytes it never reads) passes
        let second = ChunkCheck::new(&file, buffer.clone(), 0, vec![0; 3], Some(record)).unwrap();
        second.check(0..bytes.len()).unwrap();
        second.check_all(1).unwrap();
        // a bitmap of another length is not this file's: it vouches for nothing
        std::fs::write(dir.path().join("host").join("c.arrow.2.bits"), [0xffu8; 24]).unwrap();
        let other = dir.path().join("host").join("c.arrow.2");
        let third = ChunkCheck::new(&file, buffer, 0, vec![0; 3], Some(other)).unwrap();
        assert!(third.check(0..1).is_err());
        assert!(third.check_all(1).is_err());
    }

    #[test]
    fn a_file_just_written_is_recorded_checked_for_the_whole_host() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("w.arrow");
        let bytes = vec![7u8; 129 * CHUNK + 1]; // 130 chunks: two words and two bits
        std::fs::write(&file, &bytes).unwrap();
        let Some(key) = host_key(&file) else {
            return; // no shared memory here: nothing is recorded
        };
        record_checked(&file, 130);
        let mut bits = key.clone();
        bits.as_mut_os_string().push(".bits");
        let words = std::fs::read(&bits).unwrap();
        let _ = std::fs::remove_file(&bits);
        let set: u32 = words.iter().map(|b| b.count_ones()).sum();
        assert_eq!((words.len(), set), (24, 130), "exactly the file's chunks");
        // another process of the host: every chunk known, none read
        std::fs::write(&bits, &words).unwrap();
        let wrong = vec![0; 130];
        let check = ChunkCheck::new(&file, Buffer::from_vec(bytes), 0, wrong, Some(key)).unwrap();
        check.check_all(1).unwrap();
        let _ = std::fs::remove_file(&bits);
    }
    /// A record last used `days` ago (modified and accessed then).
    fn aged(path: &Path, days: u64) {
        let at = std::time::SystemTime::now() - std::time::Duration::from_secs(days * 24 * 3600);
        let times = std::fs::FileTimes::new().set_accessed(at).set_modified(at);
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_times(times).unwrap();
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn host_records_unused_for_a_week_or_past_the_cap_are_swept_least_recent_first() {
        let dir = tempfile::tempdir().unwrap();
        let week = std::time::Duration::from_secs(7 * 24 * 3600);
        for (i, days) in [0, 9, 1, 3, 8, 2, 10, 4, 5, 6].into_iter().enumerate() {
            let record = dir.path().join(format!("r{i}-{days}d"));
            std::fs::write(&record, []).unwrap();
            aged(&record, days);
        }
        std::fs::write(dir.path().join(SWEPT), []).unwrap();
        // 8, 9 and 10 days: past the age; then 7 left, over the cap of 4:
        // the least recently used go down to 3
        assert_eq!(sweep(dir.path(), 4, week), 7);
        assert_eq!(names(dir.path()), [".swept", "r0-0d", "r2-1d", "r5-2d"]);
        assert_eq!(sweep(dir.path(), 4, week), 0, "nothing more to remove");
    }

    #[test]
    fn making_a_record_sweeps_at_most_every_ten_minutes() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old.bits");
        std::fs::write(&old, [0u8; 8]).unwrap();
        aged(&old, 30);
        let stamp = dir.path().join(SWEPT);
        std::fs::write(&stamp, []).unwrap(); // swept just now
        assert!(HostBits::open(&dir.path().join("a.bits"), 3).is_some());
        assert!(old.exists(), "a sweep less than ten minutes after the last");
        let stamp_file = std::fs::File::options().write(true).open(&stamp).unwrap();
        let at = std::time::SystemTime::now() - SWEEP_EVERY;
        stamp_file.set_modified(at).unwrap();
        record_whole(&dir.path().join("b"));
        assert!(!old.exists(), "a month unused: swept");
        assert_eq!(names(dir.path()), [".swept", "a.bits", "b"]);
        let swept = std::fs::metadata(&stamp).unwrap().modified().unwrap();
        assert!(
            swept.elapsed().unwrap() < SWEEP_EVERY,
            "the sweep is stamped"
        );
    }
}

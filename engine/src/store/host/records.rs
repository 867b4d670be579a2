//! The host's records of checked files: each process that checks a file (or
//! writes one, and so knows its checksums) records it for the host, so each
//! check is made once per host, not once per process (`store::chunks`,
//! `catalog::snapshot`).
//!
//! The host's record of checked chunks is a bitmap in shared memory
//! (`/dev/shm/datasetrt-<uid>/verified/<file name>.<device>.<inode>-<generation>.<length>.<mtime ns>.<ctime ns>.bits`),
//! never in the dataset (which may be read-only or shared). Any change of
//! the file (a write in place, a rename over it, its times put back) changes
//! its inode or change time and so names a new, empty bitmap.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapMut;

use super::host_dir;

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
pub(crate) struct HostBits {
    map: MmapMut,
}

impl HostBits {
    /// The bitmap at `path` for `chunks` chunks, created empty if absent.
    /// Creators agree: a new file is extended to its length, which leaves
    /// any bit another process set in place.
    pub(crate) fn open(path: &Path, chunks: usize) -> Option<HostBits> {
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

    pub(crate) fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!((i + 1) * 8 <= self.map.len());
        // SAFETY: the mapping is page-aligned and holds whole u64 words;
        // every access goes through this atomic view.
        unsafe { &*(self.map.as_ptr() as *const AtomicU64).add(i) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::chunks::{chunk_crcs, ChunkCheck, CHUNK};
    use arrow::buffer::Buffer;

    fn stored(path: &Path, bytes: &[u8]) -> Buffer {
        std::fs::write(path, bytes).unwrap();
        Buffer::from_vec(bytes.to_vec())
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

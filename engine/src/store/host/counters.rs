//! Counters a process keeps where the other processes of its host can read
//! them: a small file per process in a shared directory, mapped shared and
//! incremented in place. The host's figures are the sum over the files; a
//! process that ends (even by `kill -9` or `os._exit`, as DataLoader workers
//! do) leaves its counts behind, nothing lost.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use memmap2::MmapMut;

use crate::Unpoison;

/// How many counters a file holds.
pub const COUNTERS: usize = 5;
const FILE_BYTES: usize = COUNTERS * 8;
const SUFFIX: &str = ".counts";

/// This process's counters in `dir`.
#[derive(Debug)]
pub struct Counters {
    dir: PathBuf,
    /// The mapping counted into now (its first `COUNTERS` words).
    now: AtomicPtr<AtomicU64>,
    /// The process whose file `now` is: a child made by `fork()` shares its
    /// parent's mapping and must count into a file of its own.
    pid: AtomicU32,
    /// Every mapping made (a forked child's parent's one too): kept until the
    /// counters go, so `now` never dangles.
    maps: Mutex<Vec<MmapMut>>,
}

impl Counters {
    pub fn new(dir: &Path) -> Counters {
        let counters = Counters {
            dir: dir.to_path_buf(),
            now: AtomicPtr::new(std::ptr::null_mut()),
            pid: AtomicU32::new(0),
            maps: Mutex::new(Vec::new()),
        };
        counters.own();
        counters
    }

    /// The words this process counts into: its own file's, made on first
    /// use in a process (a forked child's first count makes its own).
    fn own(&self) -> &[AtomicU64; COUNTERS] {
        let pid = std::process::id();
        if self.pid.load(Ordering::Acquire) != pid {
            let maps = self.maps.lock().unpoisoned();
            self.remap(pid, maps);
        }
        // SAFETY: `now` points at the start of a live mapping of at least
        // FILE_BYTES, page aligned (so aligned for u64), kept in `maps` for
        // as long as `self` lives; the words are only accessed atomically.
        unsafe { &*(self.now.load(Ordering::Acquire) as *const [AtomicU64; COUNTERS]) }
    }

    /// Map a file of this process's own (under the `maps` lock).
    fn remap(&self, pid: u32, mut maps: std::sync::MutexGuard<'_, Vec<MmapMut>>) {
        if self.pid.load(Ordering::Acquire) != pid {
            let mut map = self.file_map().unwrap_or_else(|| {
                // no shared file (a read-only directory): count in memory
                MmapMut::map_anon(FILE_BYTES).expect("an anonymous mapping of 40 bytes")
            });
            self.now.store(map.as_mut_ptr().cast(), Ordering::Release);
            maps.push(map);
            self.pid.store(pid, Ordering::Release);
        }
    }

    fn file_map(&self) -> Option<MmapMut> {
        fs::create_dir_all(&self.dir).ok()?;
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("{}-{n}{SUFFIX}", std::process::id()));
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(path)
            .ok()?;
        file.set_len(FILE_BYTES as u64).ok()?;
        // SAFETY: the file is this process's own (named by pid and a counter);
        // other processes only read it, and nobody truncates it.
        unsafe { MmapMut::map_mut(&file) }.ok()
    }

    pub fn add(&self, counter: usize, n: u64) {
        self.own()[counter].fetch_add(n, Ordering::Relaxed);
    }

    /// This process's counts.
    pub fn get(&self) -> [u64; COUNTERS] {
        let words = self.own();
        std::array::from_fn(|i| words[i].load(Ordering::Relaxed))
    }

    /// The counts of every process that counted in this directory, ended or
    /// not (this one included).
    pub fn host(&self) -> [u64; COUNTERS] {
        let mut sum = [0u64; COUNTERS];
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return self.get();
        };
        let mut mine = false;
        for entry in entries.flatten() {
            if !entry.file_name().to_string_lossy().ends_with(SUFFIX) {
                continue;
            }
            let Ok(bytes) = fs::read(entry.path()) else {
                continue;
            };
            if bytes.len() < FILE_BYTES {
                continue;
            }
            mine |= entry
                .file_name()
                .to_string_lossy()
                .starts_with(&format!("{}-", std::process::id()));
            for (i, word) in bytes[..FILE_BYTES].chunks_exact(8).enumerate() {
                let value = u64::from_ne_bytes(word.try_into().unwrap_or_default());
                sum[i] = sum[i].saturating_add(value);
            }
        }
        if !mine {
            // this process counts in memory (no shared file)
            let own = self.get();
            sum.iter_mut().zip(own).for_each(|(s, o)| *s += o);
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_counts_its_own_and_the_host_sums_every_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = Counters::new(dir.path());
        let b = Counters::new(dir.path());
        a.add(0, 3);
        a.add(4, 100);
        b.add(0, 1);
        assert_eq!(a.get(), [3, 0, 0, 0, 100]);
        assert_eq!(b.get(), [1, 0, 0, 0, 0]);
        // a process that ended left a file behind
        fs::write(
            dir.path().join(format!("4194399-0{SUFFIX}")),
            [7u64, 0, 0, 2, 0].map(u64::to_ne_bytes).concat(),
        )
        .unwrap();
        assert_eq!(a.host(), [11, 0, 0, 2, 100]);
        drop(b);
        assert_eq!(
            a.host(),
            [11, 0, 0, 2, 100],
            "counts outlive their counters"
        );
    }

    #[test]
    fn without_a_writable_directory_the_counts_stay_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, b"").unwrap();
        let c = Counters::new(&file.join("stats")); // a path under a file
        c.add(1, 5);
        assert_eq!(c.get(), [0, 5, 0, 0, 0]);
        assert_eq!(c.host(), [0, 5, 0, 0, 0]);
    }
}

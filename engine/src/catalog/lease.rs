//! Reader leases: a process that has a snapshot open holds a lease on it,
//! and `cleanup` keeps every snapshot that a live process of the machine
//! leases (as table formats keep the versions their readers hold).
//!
//! A lease is an empty file `leases/<number>.<pid>.<start>.<nonce>` in the
//! snapshot directory, made before the snapshot is opened and removed when
//! the process lets it go; a lease of a process that is gone (its pid no
//! longer running, or running a process started at another time) is stale
//! and swept by the next cleanup. Taking a lease and reading the leases
//! exclude each other (`leases/.gate`: shared to take one, exclusive for
//! cleanup), so a reader either is seen by a cleanup or opens after it, and
//! then finds the snapshot gone (`CacheNotFoundError`), never half of it.
//! Leases are best effort: where the directory cannot be written (a
//! read-only dataset) a reader holds none, and cleanup cannot run there
//! either.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::store::fs;
use crate::Result;

/// The directory of leases, in a snapshot directory.
pub const LEASES_DIR: &str = "leases";

const GATE: &str = ".gate";

/// This process, as leases name it: its pid and start time.
fn me() -> (u32, u64) {
    let pid = std::process::id();
    (pid, fs::started(pid).unwrap_or(0))
}

/// A lease on one snapshot, held until dropped (by the process that took
/// it: a forked child's copy leaves its parent's lease alone).
#[derive(Debug)]
pub struct Lease {
    path: PathBuf,
    owner: u32,
}

impl Lease {
    /// Lease snapshot `number` of `snapshot_dir`; `None` where no lease can
    /// be written.
    pub fn take(snapshot_dir: &Path, number: u64) -> Option<Lease> {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = snapshot_dir.join(LEASES_DIR);
        std::fs::create_dir_all(&dir).ok()?;
        let _gate = fs::lock_shared(&dir.join(GATE)).ok()?;
        let (pid, start) = me();
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!("{number}.{pid}.{start}.{n}"));
        File::create(&path).ok()?;
        Some(Lease { path, owner: pid })
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if std::process::id() == self.owner {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The leases of `snapshot_dir` read under its exclusive gate, which the
/// caller holds while it deletes: no lease can be taken meanwhile.
pub struct Held {
    /// The snapshots live processes lease.
    pub numbers: BTreeSet<u64>,
    _gate: Option<File>,
}

/// Read (and sweep) the leases of `snapshot_dir`.
pub fn held(snapshot_dir: &Path) -> Result<Held> {
    let dir = snapshot_dir.join(LEASES_DIR);
    let mut numbers = BTreeSet::new();
    if !dir.exists() {
        return Ok(Held {
            numbers,
            _gate: None,
        });
    }
    let gate = fs::lock_exclusive(&dir.join(GATE))?;
    let entries = std::fs::read_dir(&dir).map_err(crate::Error::io(&dir))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut parts = name.split('.');
        let (Some(number), Some(pid), Some(start)) = (
            parts.next().and_then(|p| p.parse::<u64>().ok()),
            parts.next().and_then(|p| p.parse::<u32>().ok()),
            parts.next().and_then(|p| p.parse::<u64>().ok()),
        ) else {
            continue; // the gate, or a name no lease has
        };
        let live = fs::alive(pid) && (start == 0 || fs::started(pid) == Some(start));
        if live {
            numbers.insert(number);
        } else {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(Held {
        numbers,
        _gate: Some(gate),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_held_until_dropped_and_stale_ones_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        assert!(held(dir.path()).unwrap().numbers.is_empty());
        let a = Lease::take(dir.path(), 3).unwrap();
        let b = Lease::take(dir.path(), 3).unwrap();
        let c = Lease::take(dir.path(), 7).unwrap();
        assert_eq!(held(dir.path()).unwrap().numbers, BTreeSet::from([3, 7]));
        drop(a);
        drop(c);
        assert_eq!(held(dir.path()).unwrap().numbers, BTreeSet::from([3]));
        drop(b);
        // a process that is gone, and this pid with another start time
        let leases = dir.path().join(LEASES_DIR);
        let (pid, start) = me();
        std::fs::write(leases.join(format!("5.{}.1.0", u32::MAX - 1)), "").unwrap();
        std::fs::write(leases.join(format!("6.{pid}.{}.0", start + 1)), "").unwrap();
        assert!(held(dir.path()).unwrap().numbers.is_empty());
        let left: Vec<_> = std::fs::read_dir(&leases)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from(GATE)],
            "stale leases swept"
        );
    }
}

//! What the processes of one host share, kept apart from the dataset (which
//! may be read-only, or shared by many hosts): records that spare a process
//! the work another has done, and figures every process adds to.
//!
//! In shared memory, this user's directory ([`host_dir`]; none where there
//! is no `/dev/shm`, or the directory is another user's):
//!
//! ```text
//! /dev/shm/datasetrt-<uid>/
//!     verified/                 the host's records of checked files ([`records`])
//!         <file version>.bits   a bitmap of the chunks checked: made and read by
//!                               `store::chunks::ChunkCheck` (cache indexes and
//!                               attributes, snapshot columns, alias tables), filled
//!                               whole by the writers of those files
//!         <file version>        empty: the whole file checked (snapshot column
//!                               files without a chunk table, `catalog::snapshot`)
//!         .swept                when the records were last swept
//!     runs/<run key>.claims     the words the host's readers of one run share
//!                               (`catalog::schedule`; `$TMPDIR/datasetrt-runs/`
//!                               without shared memory)
//! ```
//!
//! `<file version>` is `<file name>.<device>.<inode>-<generation>.<length>.<mtime ns>.<ctime ns>`
//! ([`records::host_key`]); `Dataset::cleanup` removes the records of the
//! column files it deletes, the sweep those of versions long unused.
//!
//! On disk, beside the local replicas of a bucket's caches
//! (`<cache_dir>/<url hash>[-evicting]/`, `Remote::replica_root_for`), each
//! process keeps its download counters in
//! `counts/<cache name>/<pid>-<n>.counts` (`counters`), which
//! `Replica::host_stats` sums. The evicting replicas' directory
//! (`<url hash>-evicting/`) also holds the host's eviction lock
//! (`evict.lock`, `Remote::evict_lock_path`) and the loaders' published
//! futures (`readers/`, `load::host`), kept by their own modules.
//!
//! Records and counters are best effort: one missing, stale or unwritable
//! costs a check again or a count kept in memory, never a wrong byte.
//!
//! Not the engine's: the Python package's DataLoader records
//! (`python/datasetrt/_shared.py`) are files directly in `/dev/shm`,
//! `datasetrt-<pid>-<uuid>.json`, not in this directory.

pub(super) mod counters;
pub mod records;

use std::path::{Path, PathBuf};

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

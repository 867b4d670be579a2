//! Small filesystem helpers for atomic publishing and read-only mapping.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::Mmap;

use crate::{Error, Result};

/// fsync a directory so that renames and creations inside it are durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(Error::io(dir))
}

/// This machine's name as temporary names carry it (so that a process on
/// another machine sharing the directory is never taken for a dead one here).
fn host() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        let raw = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let host: String = raw
            .trim()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '.')
            .take(64)
            .collect();
        if host.is_empty() {
            "localhost".into()
        } else {
            host
        }
    })
}

const TEMP_PREFIX: &str = ".tmp-";

/// A number drawn once per process, so that a process reusing a dead one's
/// pid (a restarted container) never collides with its leftovers.
fn nonce() -> u32 {
    static NONCE: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *NONCE.get_or_init(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        crate::store::checksum::crc32c(
            &[
                t.to_le_bytes(),
                u128::from(std::process::id()).to_le_bytes(),
            ]
            .concat(),
        )
    })
}

/// A name for a temporary sibling of `target`, unique across processes and
/// threads: `.tmp-<pid>@<host>-<nonce><n>-<name>`.
pub fn temp_sibling(target: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = target
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    target.with_file_name(format!(
        "{TEMP_PREFIX}{}@{}-{:x}{n}-{name}",
        std::process::id(),
        host(),
        nonce()
    ))
}

/// The process that made temporary entry `name` on this machine, if it was
/// made here.
fn temp_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(TEMP_PREFIX)?;
    let (pid, rest) = rest.split_once('@')?;
    let (owner_host, _) = rest.split_once('-')?;
    (owner_host == host()).then(|| pid.parse().ok())?
}

/// Is process `pid` of this machine running (this process included)?
pub fn alive(pid: u32) -> bool {
    pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists()
}

/// Remove the temporary files and staging directories in `dir` left by
/// processes of this machine that are gone (killed mid-build or mid-update).
/// Entries of live processes and of other machines stay. Best effort: a
/// directory that cannot be read is left alone.
pub fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = temp_owner(&name) else {
            continue;
        };
        if alive(pid) {
            continue;
        }
        let path = entry.path();
        let _ = if path.is_dir() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
    }
}

/// Create `path` holding `bytes`, fsynced (the caller publishes it).
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let result = File::create(path)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .map_err(Error::io(path));
    if result.is_err() {
        let _ = fs::remove_file(path);
    }
    result
}

/// Write `bytes` to `path` through a temporary file, fsync, rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_sibling(path);
    write_synced(&tmp, bytes)?;
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io(path)(e));
    }
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Write `bytes` to `path` through a temporary file and a rename, without
/// fsync: for derived files that carry their own seal, so that one a crash
/// left torn is found and made again (what a thousand fsyncs would cost
/// buys nothing there). Readers see the old file or the new one whole.
pub fn write_derived(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_sibling(path);
    let written = File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes))
        .and_then(|()| fs::rename(&tmp, path));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written.map_err(Error::io(path))
}

/// Publish the complete, fsynced file `tmp` as `path` unless `path` already
/// exists. Returns `false` (and removes `tmp`) when another writer won.
pub fn publish_no_replace(tmp: &Path, path: &Path) -> Result<bool> {
    let linked = fs::hard_link(tmp, path);
    let _ = fs::remove_file(tmp);
    match linked {
        Ok(()) => {
            sync_dir(path.parent().unwrap_or(Path::new(".")))?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(Error::Io {
            path: path.to_path_buf(),
            source: e,
        }),
    }
}

/// Give `file` a length of `len` bytes with every block allocated, so that
/// writes through a mapping cannot fail later (`ENOSPC` here instead of a
/// `SIGBUS` there).
pub fn allocate(file: &File, len: u64) -> std::io::Result<()> {
    file.set_len(len)?;
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let len = libc::off_t::try_from(len)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: a valid open descriptor; posix_fallocate only reads its arguments.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
        // EOPNOTSUPP/EINVAL: a filesystem without allocation; set_len stands
        if rc != 0 && rc != libc::EOPNOTSUPP && rc != libc::EINVAL {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
    }
    Ok(())
}

/// Map a file read-only as an Arrow buffer (the mapping lives as long as any
/// slice of it). `what` names the file in a not-found error.
pub fn map_buffer(path: &Path, what: &'static str) -> Result<arrow::buffer::Buffer> {
    let mmap = std::sync::Arc::new(map_file(path, what)?);
    let len = mmap.len();
    if len == 0 {
        return Ok(arrow::buffer::Buffer::from_vec(Vec::<u8>::new()));
    }
    // SAFETY: the pointer and length describe the live mapping, which the
    // buffer keeps alive through the `Arc` owner; published files are immutable.
    Ok(unsafe {
        arrow::buffer::Buffer::from_custom_allocation(
            std::ptr::NonNull::new(mmap.as_ptr() as *mut u8).expect("mmap pointer is never null"),
            len,
            mmap,
        )
    })
}

/// Map a file read-only. `what` names the file in a not-found error.
pub fn map_file(path: &Path, what: &'static str) -> Result<Mmap> {
    let file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound {
            what,
            path: path.to_path_buf(),
        },
        _ => Error::Io {
            path: path.to_path_buf(),
            source: e,
        },
    })?;
    // SAFETY: published files are immutable (written under a temporary name,
    // fsynced, renamed; never rewritten in place), and lengths are checked
    // against headers before any byte is trusted.
    unsafe { Mmap::map(&file) }.map_err(Error::io(path))
}

/// How the pages of part of a file mapping are about to be read: advice
/// to the kernel ([`advise`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A few bytes here and there (a loader's draws, a file's header): a
    /// fault reads its own page, not the read-ahead window around it
    /// (`MADV_RANDOM`). That window is the block device's read-ahead, 8 MiB
    /// on some machines: a draw's 8 bytes read 8 MiB, and a 10^9-row first
    /// batch read gigabytes.
    Sparse,
    /// All of it, front to back: read ahead again (`MADV_NORMAL`).
    Whole,
    /// These bytes, soon: start reading them now, without waiting
    /// (`MADV_WILLNEED`), so that many reads go to the disk together
    /// instead of one fault after another.
    Soon,
}

/// Advise the kernel how `bytes` (part of a file mapping) are about to be
/// read. Advice only: false when refused (e.g. `bytes` are not mapped).
pub fn advise(bytes: &[u8], access: Access) -> bool {
    if bytes.is_empty() {
        return false;
    }
    let advice = match access {
        Access::Sparse => libc::MADV_RANDOM,
        Access::Whole => libc::MADV_NORMAL,
        Access::Soon => libc::MADV_WILLNEED,
    };
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: sysconf has no preconditions
    let page = *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    });
    let start = bytes.as_ptr() as usize;
    let first = start & !(page - 1);
    let len = start + bytes.len() - first;
    // SAFETY: [first, first + len) lies within the mapping `bytes` is part
    // of (a mapping is page-aligned, so rounding down stays inside it), and
    // none of these advices changes contents
    unsafe { libc::madvise(first as *mut libc::c_void, len, advice) == 0 }
}

/// Free bytes `offset..offset + len` of `file` (reads give zeros after),
/// keeping its size. Best effort: a file system without hole punching keeps
/// the bytes, which only costs disk.
pub fn punch_hole(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on an open descriptor; no memory is passed.
    unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        );
    }
}

/// The byte ranges of `file` that hold data (not holes), in order: what a
/// sparse file holds on disk, whoever wrote it. A file system that does not
/// report holes reports the whole file.
pub fn data_extents(file: &File) -> std::io::Result<Vec<std::ops::Range<u64>>> {
    use std::os::fd::AsRawFd;
    let len = file.metadata()?.len();
    let fd = file.as_raw_fd();
    let mut out = Vec::new();
    let mut at = 0u64;
    while at < len {
        // SAFETY: lseek on an open descriptor; no memory is passed. Each
        // call names its own offset, so a shared file position is not used.
        let start = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
        if start < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // only a hole from `at` to the end
            }
            return Err(e);
        }
        // SAFETY: as above.
        let end = unsafe { libc::lseek(fd, start, libc::SEEK_HOLE) };
        if end < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let (start, end) = (start as u64, (end as u64).min(len));
        if end <= start {
            break;
        }
        out.push(start..end);
        at = end;
    }
    Ok(out)
}

/// Hold an exclusive lock on `path` (created if missing) until the returned
/// file is dropped; waits for the holder. One per open file description, so
/// threads of one process exclude each other too; the kernel releases it if
/// the process dies.
pub fn lock_exclusive(path: &Path) -> Result<File> {
    lock(path, libc::LOCK_EX)
}

/// [`lock_exclusive`], shared: any number of holders, none exclusive.
pub fn lock_shared(path: &Path) -> Result<File> {
    lock(path, libc::LOCK_SH)
}

/// [`lock_exclusive`] if nobody holds `path` now, else `None` at once.
pub fn try_lock_exclusive(path: &Path) -> Result<Option<File>> {
    match lock(path, libc::LOCK_EX | libc::LOCK_NB) {
        Ok(file) => Ok(Some(file)),
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::WouldBlock => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn lock(path: &Path, operation: libc::c_int) -> Result<File> {
    use std::os::fd::AsRawFd;
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(Error::io(path))?;
    loop {
        // SAFETY: flock on an open descriptor; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), operation) } == 0 {
            return Ok(file);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(Error::io(path)(e));
        }
    }
}

/// When process `pid` of this machine started (clock ticks since boot, from
/// `/proc`): with the pid it names one process, even after the pid is
/// reused. `None` when the process is gone or the system does not say.
pub fn started(pid: u32) -> Option<u64> {
    let stat = fs::read(format!("/proc/{pid}/stat")).ok()?;
    // the fields after the command name (in parentheses; it may hold any
    // byte), from field 3: the start time is field 22
    let after = stat.iter().rposition(|&b| b == b')')? + 2;
    let fields = std::str::from_utf8(stat.get(after..)?).ok()?;
    fields.split_ascii_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn a_process_is_named_by_its_pid_and_start_time() {
        let me = started(std::process::id()).expect("this process has a start time");
        assert_eq!(started(std::process::id()), Some(me));
        assert!(started(1).is_some_and(|init| init <= me));
        assert_eq!(started(u32::MAX), None);
    }

    #[test]
    fn data_extents_are_what_a_sparse_file_holds_and_holes_punched_leave_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        file.set_len(1 << 20).unwrap();
        let empty = data_extents(&file).unwrap();
        if empty.len() == 1 && empty[0] == (0..1 << 20) {
            return; // a file system that does not report holes: the whole file
        }
        assert_eq!(empty, vec![]);
        file.write_all_at(&[1; 8192], 65536).unwrap();
        file.write_all_at(&[2; 4096], 512 << 10).unwrap();
        let second = (512 << 10)..(512 << 10) + 4096;
        assert_eq!(
            data_extents(&file).unwrap(),
            vec![65536..65536 + 8192, second.clone()]
        );
        punch_hole(&file, 65536, 8192);
        assert_eq!(data_extents(&file).unwrap(), vec![second]);
    }
}

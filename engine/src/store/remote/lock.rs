//! Byte-range locks on replica files: one process of a machine downloads a
//! range at a time, the others wait and then find the bytes there.

use std::fs::File;
use std::ops::Range;
use std::path::Path;

use crate::{Error, Result};

/// An exclusive lock on bytes of a replica file, shared by nobody else on
/// this machine: an open-file-description lock, released when dropped, and
/// by the kernel if the process dies.
pub(super) struct RangeLock {
    file: File,
    range: Range<u64>,
}

impl RangeLock {
    pub(super) fn acquire(file: File, path: &Path, range: Range<u64>) -> Result<RangeLock> {
        Self::fcntl(
            &file,
            libc::F_WRLCK as libc::c_short,
            &range,
            libc::F_OFD_SETLKW,
        )
        .map_err(Error::io(path))?;
        Ok(RangeLock { file, range })
    }

    fn fcntl(
        file: &File,
        kind: libc::c_short,
        range: &Range<u64>,
        cmd: libc::c_int,
    ) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: a zeroed flock is valid; the fields set are the documented ones.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = kind;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        lock.l_start = range.start as libc::off_t;
        lock.l_len = (range.end - range.start) as libc::off_t;
        loop {
            // SAFETY: fcntl with a lock command and a valid flock pointer.
            let rc = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut lock) };
            if rc == 0 {
                return Ok(());
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

impl Drop for RangeLock {
    fn drop(&mut self) {
        let _ = Self::fcntl(
            &self.file,
            libc::F_UNLCK as libc::c_short,
            &self.range,
            libc::F_OFD_SETLK,
        );
    }
}

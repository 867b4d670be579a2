//! The check of one column file against its manifest entry when a read
//! maps it: length and CRC-32C, once per version of the file per process
//! (and per host, by a record of the check).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::manifest::ColumnEntry;
use crate::store::host::records;
use crate::Unpoison;
use crate::{Error, Result};

/// What identifies one version of a file: path, length, modification time,
/// inode.
type FileVersion = (PathBuf, u64, std::time::SystemTime, u64);

/// Processes verify each column file once per version: files are
/// content-addressed and never rewritten, so a file that passed its check
/// stays good; one changed in place gets a new modification time and is
/// checked again.
fn verified() -> &'static std::sync::Mutex<std::collections::HashSet<FileVersion>> {
    static VERIFIED: OnceLock<std::sync::Mutex<std::collections::HashSet<FileVersion>>> =
        OnceLock::new();
    VERIFIED.get_or_init(Default::default)
}

fn file_version(path: &Path) -> Option<FileVersion> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some((
        path.to_path_buf(),
        meta.len(),
        meta.modified().ok()?,
        meta.ino(),
    ))
}

pub(super) fn mark_verified(file: &Path) {
    if let Some(key) = file_version(file) {
        verified().lock().unpoisoned().insert(key);
    }
}

/// Check a column file against its manifest entry: the mapped length, then
/// the CRC-32C of the file read (not of the mapping; see `crc32c_file`) —
/// once per version of the file per process, and not at all when another
/// process of the host checked this version: the host's record is an empty
/// file named by [`records::host_key`] (files with a chunk table keep a bitmap
/// of checked chunks there instead, see [`ChunkCheck`]), made only after a
/// check that read the file.
pub(super) fn verify_column(file: &Path, mapped_len: usize, entry: &ColumnEntry) -> Result<()> {
    let (Some(crc), Some(len)) = (entry.crc, entry.len) else {
        return Ok(()); // a version-1 manifest: nothing to check against
    };
    if let Some(key) = file_version(file) {
        if verified().lock().unpoisoned().contains(&key) {
            return Ok(());
        }
    }
    if mapped_len as u64 != len {
        return Err(Error::corrupt(
            file,
            format!("snapshot column file is {mapped_len} bytes, its manifest says {len}"),
        ));
    }
    // the record names the version about to be read: one changed meanwhile
    // gets no record
    let record = records::host_key(file);
    if record.as_deref().is_some_and(Path::exists) {
        mark_verified(file);
        return Ok(());
    }
    let (found, read) = crate::store::checksum::crc32c_file(file).map_err(Error::io(file))?;
    if found != crc || read != len {
        return Err(Error::corrupt(
            file,
            format!("snapshot column file checksum mismatch (crc32c {found:08x} over {read} bytes, manifest says {crc:08x} over {len})"),
        ));
    }
    mark_verified(file);
    if let Some(record) = &record {
        records::record_whole(record);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::checksum::crc32c;

    #[test]
    fn a_column_file_is_checked_against_its_manifest_entry() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = b"any bytes, with the checksum and length a manifest records".to_vec();
        let entry = ColumnEntry {
            hash: "0".repeat(32),
            name: "x".to_string(),
            crc: Some(crc32c(&bytes)),
            len: Some(bytes.len() as u64),
            range: None,
        };
        let good = dir.path().join("good");
        std::fs::write(&good, &bytes).unwrap();
        verify_column(&good, bytes.len(), &entry).unwrap();
        // shorter than its manifest says
        let short = dir.path().join("short");
        std::fs::write(&short, &bytes[1..]).unwrap();
        let refused = verify_column(&short, bytes.len() - 1, &entry);
        assert!(matches!(refused, Err(Error::Corrupt { .. })), "{refused:?}");
        // of the right length, but not the bytes the manifest summed
        let damaged = dir.path().join("damaged");
        let mut flipped = bytes.clone();
        flipped[3] ^= 0x01;
        std::fs::write(&damaged, &flipped).unwrap();
        let refused = verify_column(&damaged, bytes.len(), &entry);
        assert!(matches!(refused, Err(Error::Corrupt { .. })), "{refused:?}");
        // a version-1 manifest records nothing to check against
        let unchecked = ColumnEntry {
            crc: None,
            len: None,
            ..entry
        };
        verify_column(&damaged, bytes.len(), &unchecked).unwrap();
    }
}

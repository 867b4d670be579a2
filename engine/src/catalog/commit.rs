//! The commit protocol: which snapshot is the population, and how a new one
//! becomes it without losing another writer's update.
//!
//! A snapshot directory holds numbered, immutable snapshot manifests and one
//! small head record (`HEAD`) naming the current one. The protocol needs two
//! primitives, which object storage offers as conditional writes:
//!
//! * **create-if-absent** of snapshot manifest `N` (here: a hard link, which
//!   fails if the name exists; on object storage: `PutMode::Create`). A number
//!   another writer took is skipped, never overwritten;
//! * **compare-and-swap** of the head (here: read, compare and rename under
//!   an exclusive lock on `HEAD.lock`; on object storage: `PutMode::Update`
//!   with the version the head was read at).
//!
//! A commit derived from snapshot `B` stores its columns, creates the next
//! free manifest `N` (recording `parent=B`) and swaps the head from `B` to
//! `N`. If the head is no longer `B`, another writer committed in between:
//! the commit fails with [`Error::Conflict`] naming both snapshots, unless the
//! caller forces it. A crash between the two steps leaves an unreferenced
//! manifest, which the head never names and the next commit skips.
//!
//! Here the lock is held for the whole commit, so `cleanup` (which deletes
//! files no kept snapshot names) never removes the columns of a commit in
//! flight.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::snapshot::Snapshot;
use crate::store::checksum::{seal_text, unseal_text};
use crate::store::fs;
use crate::{Error, Result};

/// The head record, inside a snapshot directory.
pub const HEAD_FILE: &str = "HEAD";
const LOCK_FILE: &str = "HEAD.lock";
const HEADER: &str = "datasetrt-head 1";
/// Tag files have the head's format under their own first line.
const TAG_HEADER: &str = "datasetrt-tag 1";
/// The committed record, beside the head: the highest snapshot number a
/// head has named, in the head's format under its own first line.
pub const COMMITTED_FILE: &str = "COMMITTED";
const COMMITTED_HEADER: &str = "datasetrt-committed 1";

/// An exclusive lock on a snapshot directory's commits, released on drop
/// (and by the kernel when the process dies, so a killed writer never
/// blocks the next one).
pub struct CommitLock {
    _file: File,
}

/// Take the commit lock of `dir`, waiting for another writer to finish.
pub fn lock(dir: &Path) -> Result<CommitLock> {
    let path = dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(Error::io(&path))?;
    file.lock().map_err(Error::io(&path))?;
    Ok(CommitLock { _file: file })
}

fn head_path(dir: &Path) -> PathBuf {
    dir.join(HEAD_FILE)
}

/// The snapshot number the head names, or `None` when there is no head
/// record yet. A damaged head is an error naming it, never a guess.
pub fn read_head(dir: &Path) -> Result<Option<u64>> {
    let path = head_path(dir);
    let raw = match std::fs::read(&path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&path)(e)),
    };
    parse_record(HEADER, &raw).map(Some).ok_or_else(|| {
        Error::corrupt(
            &path,
            "the head record (which snapshot is the population) is damaged",
        )
    })
}

/// The snapshot number a head record's bytes name, if they are intact.
pub fn parse_head(raw: &[u8]) -> Option<u64> {
    parse_record(HEADER, raw)
}

fn encode_record(header: &str, number: u64) -> String {
    seal_text(&format!("{header}\nsnapshot={number}\n"))
}

/// The snapshot number of a checksummed record (the head or a tag), or
/// `None` when any byte of it is wrong.
fn parse_record(header: &str, raw: &[u8]) -> Option<u64> {
    let mut lines = unseal_text(raw).ok()?.lines();
    if lines.next()? != header {
        return None;
    }
    lines.next()?.strip_prefix("snapshot=")?.parse().ok()
}

/// The highest snapshot number a head of `dir` has named, as recorded; `None`
/// where nothing is recorded yet (a directory older than the record) or the
/// record is damaged: then no snapshot counts as uncommitted.
pub fn read_committed(dir: &Path) -> Option<u64> {
    let raw = std::fs::read(dir.join(COMMITTED_FILE)).ok()?;
    parse_record(COMMITTED_HEADER, &raw)
}

/// Record that every snapshot up to `number` has been committed (the record
/// only grows). Call it holding [`lock`].
pub fn record_committed(dir: &Path, number: u64, _lock: &CommitLock) -> Result<()> {
    if read_committed(dir).is_some_and(|n| n >= number) {
        return Ok(());
    }
    let path = dir.join(COMMITTED_FILE);
    fs::write_atomic(&path, encode_record(COMMITTED_HEADER, number).as_bytes())
}

/// The snapshots in `numbers` that no head ever named: manifests a writer
/// created and then died before moving the head to them. The head names a
/// committed snapshot, and every commit or checkout records the head before
/// it moves it, so a snapshot above the record that is not the head was
/// never committed. Nothing is uncommitted in a directory without a record.
pub fn uncommitted(dir: &Path, numbers: &[u64], head: Option<u64>) -> Vec<u64> {
    let Some(committed) = read_committed(dir) else {
        return Vec::new();
    };
    let through = head.map_or(committed, |h| committed.max(h));
    numbers.iter().copied().filter(|&n| n > through).collect()
}

/// Point the head at `number` (atomically: a temporary file renamed over it).
/// Call it holding [`lock`].
pub fn write_head(dir: &Path, number: u64, _lock: &CommitLock) -> Result<()> {
    fs::write_atomic(&head_path(dir), encode_record(HEADER, number).as_bytes())
}

/// The snapshot the head names. A dataset whose snapshots were written
/// before heads existed (version-1 manifests, no `HEAD`) adopts its newest;
/// any other snapshot directory without a head is an error, since guessing
/// could silently revert the population.
/// The bytes of a tag file naming snapshot `number`.
pub fn encode_tag(number: u64) -> String {
    encode_record(TAG_HEADER, number)
}

/// The snapshot a tag file names: the checksummed format, or a bare number
/// (tags written before tags carried checksums).
pub fn parse_tag(path: &Path, raw: &[u8]) -> Result<u64> {
    if let Some(n) = parse_record(TAG_HEADER, raw) {
        return Ok(n);
    }
    let legacy = std::str::from_utf8(raw)
        .ok()
        .and_then(|t| t.strip_suffix('\n'))
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse().ok());
    legacy.ok_or_else(|| Error::corrupt(path, "the tag file is damaged"))
}

pub fn current(dir: &Path, numbers: &[u64]) -> Result<Option<u64>> {
    if let Some(n) = read_head(dir)? {
        return Ok(Some(n));
    }
    let Some(&newest) = numbers.last() else {
        return Ok(None);
    };
    let guard = lock(dir)?;
    if let Some(n) = read_head(dir)? {
        return Ok(Some(n)); // another process adopted or created it meanwhile
    }
    let manifest = super::snapshot::read_manifest(dir, newest)?;
    // Written before heads existed: the newest was the population. Or a
    // first open died between creating snapshot 0 and its head: snapshot 0
    // is the only population there ever was. Neither is a guess.
    let first_only = numbers == [0] && manifest.parent.is_none();
    if manifest.version == 1 || first_only {
        write_head(dir, newest, &guard)?;
        return Ok(Some(newest));
    }
    Err(Error::corrupt(
        head_path(dir),
        format!(
            "the head record is missing while snapshots {:?} exist; it names the current \
             population, so none is guessed (snapshot manifests are {}/{})",
            numbers,
            dir.display(),
            Snapshot::file_name(newest)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_or_tag_round_trips_and_any_damage_is_refused() {
        for header in [HEADER, TAG_HEADER] {
            let text = encode_record(header, 42);
            assert_eq!(parse_record(header, text.as_bytes()), Some(42));
            for i in 0..text.len() {
                let mut bytes = text.clone().into_bytes();
                bytes[i] ^= 0x01;
                assert_ne!(
                    parse_record(header, &bytes),
                    Some(42),
                    "flip at byte {i} went unseen"
                );
            }
            assert_eq!(
                parse_record(header, &text.as_bytes()[..text.len() - 3]),
                None
            );
            assert_eq!(parse_record(header, b""), None);
        }
        // a head is not a tag, nor the other way round
        assert_eq!(
            parse_record(TAG_HEADER, encode_record(HEADER, 1).as_bytes()),
            None
        );
        let path = Path::new("t");
        assert_eq!(parse_tag(path, b"7\n").unwrap(), 7);
        assert!(parse_tag(path, b"7x\n").is_err() && parse_tag(path, b"\xff").is_err());
    }
}

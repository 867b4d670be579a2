//! Bytes on disk. One published cache per source:
//!
//! ```text
//! <root>/<source name>/
//!     MANIFEST              text, versioned, self-checksummed (see `manifest`)
//!     index.drti            fixed-width index, read in place through mmap (see `format`)
//!     shard-00000.drts ...  payload shards (see `format`)
//!     attributes.arrow      uncompressed Arrow IPC file: the stored per-sample attributes
//! ```
//!
//! The full specification is `docs/FORMAT.md`. A cache is written under a
//! staging name in the same root, fsynced and renamed into place, so a crash
//! leaves either the whole cache or nothing visible.
//!
//! A payload may be a typed record (named arrays behind a header): its
//! format, encoding, parsing and the gather of a field, is [`records`].
//!
//! What the processes of one host share beside the caches (records of the
//! files checked, download counters) is in [`host`].

pub mod checksum;
pub mod chunks;
pub mod codec;
pub mod format;
pub mod fs;
pub mod host;
pub mod ipc;
pub mod manifest;
mod reader;
pub mod records;
pub mod remote;
mod set;
pub mod take;
mod writer;

pub use codec::Codec;
pub use format::IndexEntry;
pub use manifest::Manifest;
pub use reader::Cache;
pub use set::CacheSet;
pub use writer::{merge_parts, CacheWriter, WriterOptions};

/// Columns DatasetRT owns in every population: metadata may not use these
/// keys (`weight` is the sampling weight the catalog keeps).
pub const RESERVED_COLUMNS: [&str; 3] = ["cache_id", "sample_id", "weight"];

/// Columns the `payloads` table adds to the identity: the index's fields and
/// the payload itself. A metadata column of one of these names would collide
/// with them in every `SELECT *` join.
pub const PAYLOAD_COLUMNS: [&str; 5] = ["stored_len", "raw_len", "codec", "checksum", "data"];

/// Check any column name that arrives from outside (a stored column, a
/// registered table's): no control characters, which would break manifest
/// lines and abort some Arrow exporters (polars panics on a NUL).
pub fn check_name_characters(name: &str) -> crate::Result<()> {
    if name.chars().any(char::is_control) {
        return Err(
            crate::Error::invalid(format!("column name {name:?} has control characters"))
                .at_column(name, None),
        );
    }
    Ok(())
}

/// Check a user column name (a metadata key or an update's column): not
/// empty, no control characters, not a `payloads` column.
pub fn check_column_name(name: &str) -> crate::Result<()> {
    if name.is_empty() {
        return Err(crate::Error::invalid("column name \"\" is empty").at_column(name, None));
    }
    check_name_characters(name)?;
    if PAYLOAD_COLUMNS.contains(&name) {
        return Err(crate::Error::invalid(format!(
            "column name {name:?} is taken by table `payloads` ({}); rename it, e.g. to \"{name}_\"",
            PAYLOAD_COLUMNS.join(", ")
        ))
        .at_column(name, None));
    }
    Ok(())
}

/// Source names become directory names; keep them portable and unambiguous.
pub fn validate_source_name(name: &str) -> crate::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && !name.starts_with(['.', '_', '-'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(crate::Error::invalid(format!(
            "invalid source name {name:?}: use 1-200 characters from [A-Za-z0-9._-], \
             not starting with '.', '_' or '-'"
        )))
    }
}

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

pub mod checksum;
pub mod codec;
pub mod format;
pub mod fs;
pub mod ipc;
pub mod manifest;
mod reader;
mod writer;

pub use codec::Codec;
pub use format::IndexEntry;
pub use manifest::Manifest;
pub use reader::Cache;
pub use writer::{CacheWriter, WriterOptions};

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

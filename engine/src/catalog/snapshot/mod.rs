//! Numbered, immutable metadata snapshots.
//!
//! A snapshot is a small text manifest (`NNNNNNNN.snapshot`) naming one
//! column file per column. Column files (`columns/<xxh3-128>.arrow`) are
//! uncompressed Arrow IPC files named by the hash of their content, so
//! snapshots share every column they do not change: a reweight writes only
//! the new `weight` column. Every file is mapped read-only and shared by every
//! process that opens it.
//!
//! Each concern has its file, and each file names only those above it in
//! this list (`engine/tests/it/layers.rs` checks it):
//!
//! 1. `escape`: names and notes kept on one manifest line;
//! 2. `mixture`: a mixture as stored, and its manifest lines;
//! 3. `manifest`: the manifest's types and text (read, write, versions);
//! 4. `check`: one column file against its manifest entry, when mapped;
//! 5. `columns`: column files, their hashes, mapping and storing them;
//! 6. `verify`: every stored file of a snapshot checked in full;
//! 7. `partition`: cutting a new population into hashed partitions;
//! 8. `write`: storing partitions and publishing their manifest;
//! 9. `read`: the runtime [`Snapshot`];
//! 10. `groups`: the rows of a mixture's groups and their sampler;
//! 11. `sampler`: what draws read (alias tables, epoch samplers).
//!
//! This file only names them for the rest of the catalog.

mod check;
mod columns;
mod escape;
mod groups;
mod manifest;
mod mixture;
mod partition;
mod read;
mod sampler;
mod verify;
mod write;

pub(super) use columns::{
    column_hash, ensure_sidecar, ensure_sidecars, store_columns, COLUMNS_DIR,
};
pub(super) use escape::{escape, unescape};
pub(super) use groups::{check as check_mixture, sampler as mixture_sampler};
pub(super) use manifest::{
    manifest_columns, partition_line, used_names, write_manifest, write_partition, ColumnEntry,
    PARTITION_LINES,
};
pub use manifest::{read_manifest, PartitionEntry, SnapshotManifest};
pub use mixture::Mixture;
pub(super) use partition::{compact_variable, default_partition_rows, Partitioned};
pub use read::Snapshot;
pub(super) use verify::verify_files;
pub(super) use write::{publish, store_partition, Known};

//! DatasetRT engine: immutable payload caches, versioned metadata snapshots,
//! DataFusion queries over the training population, and stateless sampling.
//!
//! Data flows one way through the modules:
//!
//! * [`store`]: bytes on disk: shards, a fixed-width index read in place, a
//!   manifest, checksums, codecs, atomic publish.
//! * [`catalog`]: a dataset is a set of caches plus numbered, immutable metadata
//!   snapshots; updates are validated here.
//! * [`query`]: a DataFusion session over the active snapshot (table `metadata`).
//! * [`sample`]: stateless samplers: draw `k` of epoch `e` is `f(seed, e, k)`.
//! * [`load`]: turns a sequence of rows into batches of payload bytes.

pub mod catalog;
pub mod error;
pub mod load;
pub mod query;
pub mod sample;
pub mod store;

pub use catalog::{Dataset, OpenOptions, Snapshot};
pub use error::{Error, Result};

//! Caches in an object store (S3 and S3-compatible servers, through
//! `object_store`).
//!
//! A remote cache has the same files as a local one, under a prefix:
//! `<url>/<name>/{MANIFEST, index.drti, attributes.arrow, shard-*.drts}`.
//! Opening one downloads its manifest, index and attributes (small, read
//! whole) into a local *replica* directory, `<cache_dir>/<hash of url>/<name>/`,
//! and creates each shard there as a sparse file of its full size. Payload
//! bytes are then fetched on demand, by range, into the sparse shards
//! ([`Replica`]); the loader fetches ahead in the order it will read
//! (`load::prefetch`).
//!
//! What a reader can rely on:
//! - **Every delivered byte is verified.** A record is copied out of the
//!   replica and its CRC-32C checked *on the copy*; bytes that fail (a hole
//!   nobody fetched yet, a range another process evicted meanwhile) are
//!   fetched again. Downloaded bytes that fail are a [`Error::Corrupt`] naming
//!   the object and the range.
//! - **Processes share a `cache_dir` safely.** Files appear by atomic rename;
//!   shard ranges are written with `pwrite` of the very bytes the object holds,
//!   so two writers of one range write the same bytes; eviction punches holes,
//!   which the checksum on the copy catches.
//! - **Requests end.** Each request has a timeout and is retried with backoff
//!   a bounded number of times; then the read fails with [`Error::Remote`]
//!   naming the object and the range.
//!
//! The parts: the URL's client and requests (`client`), making a replica
//! (`replicate`) and reading through it (`replica`, with the byte-range
//! locks of `lock`), and uploading what `build` wrote (`publish`).

mod client;
mod lock;
mod publish;
mod replica;
mod replicate;

pub use client::{
    block_on, default_cache_dir, is_url, spawn, Remote, RemoteOptions, DEFAULT_REQUESTS,
    DEFAULT_TIMEOUT, RETRY_TIMEOUT,
};
pub use replica::{FetchRange, FetchStats, Replica, CHUNK_BYTES, MAX_REQUEST_BYTES, PAGE_SLACK};

//! Foreign formats, read to build caches: what a source in another format
//! holds, handed to the caller as Arrow batches without a Python object per
//! member. Nothing here is read at training time; a cache's own bytes are
//! `store`'s. One file per format:
//!
//! * [`tar`]: WebDataset tar shards (`datasetrt.sources.WebDataset`).

pub mod tar;

//! A population stored from a stream of batches, a partition at a time,
//! apart from its commit: what each worker of a distributed `select` does
//! with the rows its tasks produce, so that the rows of an update never
//! pass through one host. The caller gathers the partitions every stream
//! stored (as [`partition_text`] describes them) and commits them as one
//! manifest ([`crate::catalog::Dataset::commit_stored`]).
//!
//! Column files are named by their content: a task that runs again stores
//! the files it stored before, and two streams that produce one column
//! share its file. A stream that reads one partition of the base snapshot
//! and changes some of its columns (a reweight) cuts its rows as that
//! partition was cut, so the columns it leaves alone are the base's files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use super::snapshot::{
    partition_line, store_partition, write_partition, Known, PartitionEntry, Partitioned,
    PARTITION_LINES,
};
use super::validate::{CacheBounds, PartitionChecks, Shape};
use super::Snapshot;
use crate::{Error, Result};

/// Where and against what a stream's partitions are stored: the snapshot
/// directory, the snapshot the update is derived from (its column files
/// are shared, its checked identities not checked again), the rows of a
/// partition, and the caches identities must name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRecipe {
    pub dir: PathBuf,
    pub base: u64,
    pub per: usize,
    pub samples: CacheBounds,
}

/// Refuse rows of `schema` as an update of that schema is refused (before
/// anything runs).
pub fn check_schema(schema: &SchemaRef) -> Result<()> {
    Shape::of(schema).map(drop)
}

/// Stores the batches pushed to it as partitions of `recipe.per` rows
/// (the first one of `first` rows, if given), each checked as an update's
/// rows are and stored as soon as it is whole.
pub struct StreamWriter {
    dir: PathBuf,
    base: Arc<Snapshot>,
    per: usize,
    samples: CacheBounds,
    shape: Shape,
    known: Known,
    /// Rows of the next partition.
    next: usize,
    pending: Vec<RecordBatch>,
    pending_rows: usize,
    /// Rows pushed and stored before `pending`.
    done: usize,
    stored: Vec<PartitionEntry>,
}

impl StreamWriter {
    /// A writer of rows of `schema` (refused as an update of that schema
    /// is) against `base`, the snapshot `recipe.base` of `recipe.dir`.
    pub fn new(
        recipe: &StreamRecipe,
        base: Arc<Snapshot>,
        schema: &SchemaRef,
        first: Option<usize>,
    ) -> Result<StreamWriter> {
        let per = recipe.per.max(1);
        Ok(StreamWriter {
            known: Known::of_parent(&recipe.dir, Some(recipe.base)),
            dir: recipe.dir.clone(),
            base,
            per,
            samples: recipe.samples.clone(),
            shape: Shape::of(schema)?,
            next: first.filter(|&n| n > 0).map_or(per, |n| n.min(per)),
            pending: Vec::new(),
            pending_rows: 0,
            done: 0,
            stored: Vec::new(),
        })
    }

    /// Take `batch` in; store each partition it completes. An invalid row
    /// is an [`Error::InvalidInput`] whose row counts from this stream's
    /// first.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let batch = self.shape.batch(batch, self.done + self.pending_rows)?;
        self.pending_rows += batch.num_rows();
        self.pending.push(batch);
        while self.pending_rows >= self.next {
            let rows = self.next;
            let rest = self.pending_rows - rows;
            let mut whole = std::mem::take(&mut self.pending);
            if rest > 0 {
                let last = whole.pop().expect("a pending batch");
                let keep = last.num_rows() - rest;
                whole.push(last.slice(0, keep));
                self.pending.push(last.slice(keep, rest));
            }
            self.pending_rows = rest;
            self.store(&whole, rows)?;
            self.next = self.per;
        }
        Ok(())
    }

    /// Store the rows pushed since the last whole partition, and return
    /// every partition stored, in row order.
    pub fn finish(mut self) -> Result<Vec<PartitionEntry>> {
        if self.pending_rows > 0 {
            let pending = std::mem::take(&mut self.pending);
            self.store(&pending, self.pending_rows)?;
        }
        Ok(self.stored)
    }

    /// Store `batches` (of `rows` rows) as one partition.
    fn store(&mut self, batches: &[RecordBatch], rows: usize) -> Result<()> {
        let checks = PartitionChecks::new(&self.base, &self.shape.stored, &self.samples)?;
        let first = self.done;
        let part = Partitioned::with_sizes(
            &self.shape.stored,
            batches,
            vec![rows],
            Some(&self.base.prior()),
            |_, part, hashes| checks.check(first, part, hashes).map(drop),
        )?;
        for made in part.parts() {
            let (batch, hashes) = made?;
            let entry = store_partition(&self.dir, &batch, hashes, &mut self.known)?;
            self.stored.push(entry);
        }
        self.done += rows;
        Ok(())
    }
}

/// `part` as the lines a manifest names it with.
pub fn partition_text(part: &PartitionEntry) -> String {
    let mut text = String::new();
    write_partition(&mut text, part);
    text
}

/// The partition `text` (written by [`partition_text`]) names, or an
/// error saying what `from` sent.
pub fn parse_partition(text: &str, from: &str) -> Result<PartitionEntry> {
    let mut parts = Vec::new();
    for line in text.lines() {
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| Error::internal(format!("{from} sent a partition line {line:?}")))?;
        partition_line(key, value, PARTITION_LINES, &mut parts)
            .map_err(|e| Error::internal(format!("{from} sent a bad partition: {e}")))?;
    }
    match <[PartitionEntry; 1]>::try_from(parts) {
        Ok([one]) => Ok(one),
        Err(parts) => Err(Error::internal(format!(
            "{from} sent {} partitions in one description",
            parts.len()
        ))),
    }
}

/// Whether every column file `partitions` name is in snapshot directory
/// `dir` with its length: the files a stream stored before a commit that
/// a cleanup removed meanwhile are an error naming one, and nothing is
/// committed.
pub fn check_present(dir: &Path, partitions: &[PartitionEntry]) -> Result<()> {
    let columns = dir.join(super::snapshot::COLUMNS_DIR);
    let mut seen = std::collections::HashSet::new();
    for c in partitions.iter().flat_map(|p| &p.columns) {
        if !seen.insert(c.hash.as_str()) {
            continue;
        }
        let path = columns.join(format!("{}.arrow", c.hash));
        let len = std::fs::metadata(&path).map(|m| m.len()).ok();
        if len.is_none() || (c.len.is_some() && len != c.len) {
            return Err(Error::NotFound {
                what: "a column file this update stored (a cleanup removed it meanwhile? \
                       nothing was committed: run the update again)",
                path,
            });
        }
    }
    Ok(())
}

//! A dataset and its SQL session kept in step: every change of the active
//! snapshot made through [`LiveQuery`] (a commit, `refresh`, `pin`,
//! `checkout`, `cleanup`) happens under one lock and points the session's
//! `metadata` at the new snapshot, so a query never reads a population the
//! dataset has moved past.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use super::{blocking, QuerySession};
use crate::catalog::{Dataset, PartitionEntry, Snapshot};
use crate::Unpoison;
use crate::{Error, Result};

/// How often [`LiveQuery::select`] runs its query again on a head another
/// writer moved, before the conflict is the caller's.
pub const SELECT_RETRIES: usize = 3;

pub struct LiveQuery {
    dataset: Arc<Dataset>,
    /// Made on first use: a DataFusion context is ~0.14 ms of work that a
    /// loader-only process (a DataLoader worker) never needs.
    session: OnceLock<Arc<QuerySession>>,
    /// Where queries over `metadata` run: these workers' URLs, or (none)
    /// this process.
    workers: Vec<String>,
    /// Serialises changes of the active snapshot (and the session's
    /// creation), so the session follows the dataset.
    changes: Mutex<()>,
    /// The session's memory limit (none: [`super::memory::memory_limit`]).
    memory_limit: Option<usize>,
}

impl LiveQuery {
    pub fn new(dataset: Arc<Dataset>) -> LiveQuery {
        Self::with_workers(dataset, Vec::new())
    }

    /// Queries whose scans of `metadata` run on `workers` (see
    /// [`super::distributed`]); the commits stay here.
    pub fn with_workers(dataset: Arc<Dataset>, workers: Vec<String>) -> LiveQuery {
        LiveQuery {
            dataset,
            session: OnceLock::new(),
            workers,
            changes: Mutex::new(()),
            memory_limit: None,
        }
    }

    /// Queries that hold at most `limit` bytes (none: the default), past
    /// which they spill or fail ([`super::memory`]).
    pub fn with_memory_limit(mut self, limit: Option<usize>) -> LiveQuery {
        self.memory_limit = limit;
        self
    }

    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.dataset
    }

    /// The SQL session, bound to the active snapshot. May wait for a change
    /// in progress (callers holding an interpreter lock release it first).
    pub fn session(&self) -> Result<Arc<QuerySession>> {
        if let Some(session) = self.session.get() {
            return Ok(session.clone());
        }
        let _guard = self.lock();
        if let Some(session) = self.session.get() {
            return Ok(session.clone());
        }
        let session = QuerySession::with_limit(
            &self.dataset.snapshot(),
            self.dataset.cache_set(),
            &self.workers,
            self.memory_limit,
        )?;
        Ok(self.session.get_or_init(|| Arc::new(session)).clone())
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        self.changes.lock().unpoisoned()
    }

    /// Make `change` (which returns the snapshot now active) under the lock
    /// and point the session, if there is one, at its result.
    fn change(
        &self,
        change: impl FnOnce(&Dataset) -> Result<Arc<Snapshot>>,
    ) -> Result<Arc<Snapshot>> {
        let _guard = self.lock();
        let snapshot = change(&self.dataset)?;
        if let Some(session) = self.session.get() {
            session.set_snapshot(&snapshot)?;
        }
        Ok(snapshot)
    }

    /// Commit `batches` as the new population ([`Dataset::update`]).
    pub fn update(
        &self,
        schema: &SchemaRef,
        batches: &[RecordBatch],
        note: &str,
        base: Option<u64>,
        force: bool,
    ) -> Result<Arc<Snapshot>> {
        self.change(|d| d.update(schema, batches, note, base, force))
    }

    /// Commit the active population again with `mixture`
    /// ([`Dataset::set_mixture`]).
    pub fn set_mixture(
        &self,
        mixture: Option<crate::catalog::Mixture>,
        base: Option<u64>,
        force: bool,
    ) -> Result<Arc<Snapshot>> {
        self.change(|d| d.set_mixture(mixture, base, force))
    }

    /// Make the head's snapshot active here.
    pub fn refresh(&self) -> Result<Arc<Snapshot>> {
        self.change(Dataset::refresh)
    }

    /// Make snapshot `number` active in this process only.
    pub fn pin(&self, number: u64) -> Result<Arc<Snapshot>> {
        self.change(|d| d.pin(number))
    }

    /// Move the head to snapshot `number` and make it active.
    pub fn checkout(&self, number: u64) -> Result<Arc<Snapshot>> {
        self.change(|d| d.checkout(number))
    }

    /// [`Dataset::cleanup_with`], never while a change is in progress here.
    pub fn cleanup(&self, keep: usize, dry_run: bool) -> Result<Vec<u64>> {
        let _guard = self.lock();
        self.dataset.cleanup_with(keep, dry_run)
    }

    /// Commit partitions stored apart ([`Dataset::commit_stored`]).
    pub fn commit_stored(
        &self,
        partitions: Vec<PartitionEntry>,
        note: &str,
        base: u64,
        force: bool,
    ) -> Result<Arc<Snapshot>> {
        self.change(|d| d.commit_stored(partitions, note, base, force))
    }

    /// Run `query` against the active snapshot and commit its result as the
    /// new population (`note` records it). If another writer moved the head
    /// meanwhile, the query runs again on the new head, up to
    /// [`SELECT_RETRIES`] times, before the [`Error::Conflict`] is returned.
    ///
    /// In one process the result is collected and committed as an update.
    /// With workers, each worker stores the partitions of the rows it
    /// computes ([`QuerySession::write`]) and only their descriptions come
    /// back: this process commits them as one manifest, and no row of the
    /// update passes through it.
    pub async fn select(self: Arc<Self>, query: String, note: String, force: bool) -> Result<u64> {
        let session = {
            let this = self.clone();
            blocking(move || this.session()).await?
        };
        let mut attempts = 0;
        loop {
            let active = self.dataset.snapshot();
            let base = active.number();
            let (this, note) = (self.clone(), note.clone());
            let committed = match self.workers.is_empty() {
                true => {
                    drop(active);
                    let (schema, batches) = session.sql_population(&query).await?;
                    blocking(move || this.update(&schema, &batches, &note, Some(base), force)).await
                }
                false => {
                    let recipe = self.dataset.stream_recipe(&active);
                    let stored = session.write(&query, recipe, active).await?;
                    blocking(move || this.commit_stored(stored, &note, base, force)).await
                }
            };
            match committed {
                Err(Error::Conflict { .. }) if attempts < SELECT_RETRIES => {
                    attempts += 1;
                    let this = self.clone();
                    blocking(move || this.refresh()).await?;
                }
                other => return other.map(|s| s.number()),
            }
        }
    }
}

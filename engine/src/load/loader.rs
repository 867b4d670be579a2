//! The loader is a query: `SampleExec → PayloadTakeExec`, driven by one task on
//! the process-wide runtime, with read-ahead bounded in bytes and in batches.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::{displayable, ExecutionPlan};
use futures::StreamExt;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use super::prefetch::Progress;
use crate::catalog::{Dataset, Snapshot};
use crate::query::exec::{PayloadTakeExec, SampleExec};
use crate::sample::DrawPlan;
use crate::store::take::binary_view_bytes;
use crate::{Error, Result};

/// Read-ahead limits and read concurrency.
#[derive(Debug, Clone)]
pub struct Prefetch {
    /// Decoded payload bytes buffered ahead of the consumer (at least one batch
    /// is always allowed, however large).
    pub bytes: usize,
    /// Batches buffered ahead of the consumer (refilled in bursts of
    /// three quarters of them; see `refill_batches`).
    pub batches: usize,
    /// Concurrent read groups per batch.
    pub concurrency: usize,
}

impl Default for Prefetch {
    fn default() -> Self {
        Prefetch {
            bytes: super::DEFAULT_PREFETCH_BYTES,
            batches: super::DEFAULT_PREFETCH_BATCHES,
            concurrency: crate::threads(),
        }
    }
}

/// How many queue slots the reading task waits for once the queue is full:
/// three quarters of them, leaving at least one batch queued (a single slot
/// when the queue holds one batch). A consumer slower than the reads (the
/// common case) then wakes the task once per few batches instead of once per
/// batch; every wake-up is a system call on the consumer's thread, and on a
/// virtual machine a sleeping CPU woken as well. On the seed workload
/// (tests/bench/bench_loader.py, one run of 81 alternating trials): 0.93x
/// the in-memory floor waking per batch or two, 0.95x per three or more.
fn refill_batches(queue: usize) -> usize {
    queue.saturating_sub((queue / 4).max(1)).max(1)
}

/// A batch delivered by the loader: `draw`, `row`, `cache_id`, `sample_id`,
/// `data`. Holding it holds its share of the read-ahead budget.
#[derive(Debug)]
pub struct LoadedBatch {
    pub batch: RecordBatch,
    _budget: OwnedSemaphorePermit,
}

/// A running loader. Dropping it cancels the read-ahead.
pub struct Loader {
    plan: Arc<dyn ExecutionPlan>,
    rx: mpsc::Receiver<Result<LoadedBatch>>,
    task: JoinHandle<()>,
    /// `task` was awaited (after the channel closed).
    joined: bool,
    /// Fetches remote records (advises local ones) ahead of `task`.
    prefetch: Option<JoinHandle<()>>,
}

impl Loader {
    /// The physical plan for `draws` over `snapshot`.
    pub fn plan(
        dataset: &Dataset,
        snapshot: Arc<Snapshot>,
        draws: DrawPlan,
        concurrency: usize,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let source = Arc::new(SampleExec::try_new(snapshot, draws)?);
        Ok(Arc::new(PayloadTakeExec::try_new(
            source,
            dataset.cache_set(),
            concurrency,
        )?))
    }

    /// Start reading ahead on `runtime`.
    pub fn start(
        runtime: &tokio::runtime::Handle,
        dataset: &Dataset,
        snapshot: Arc<Snapshot>,
        draws: DrawPlan,
        prefetch: Prefetch,
    ) -> Result<Loader> {
        if prefetch.bytes == 0 || prefetch.batches == 0 {
            return Err(Error::invalid(
                "prefetch_bytes and prefetch_batches must be positive",
            ));
        }
        let budget = prefetch.bytes.min(u32::MAX as usize);
        let progress = Arc::new(Progress::default());
        let fetcher = super::prefetch::start(
            dataset.cache_set(),
            snapshot.clone(),
            draws.clone(),
            progress.clone(),
        )?;
        let plan = Self::plan(dataset, snapshot, draws, prefetch.concurrency)?;
        let (tx, rx) = mpsc::channel(prefetch.batches);
        let semaphore = Arc::new(Semaphore::new(budget));
        let exec = plan.clone();
        let refill = refill_batches(prefetch.batches);
        let task = runtime.spawn(async move {
            let mut stream = match exec.execute(0, Arc::new(TaskContext::default())) {
                Ok(s) => s,
                Err(e) => {
                    let _ = tx.send(Err(e.into())).await;
                    return;
                }
            };
            let mut slots = None;
            while let Some(next) = stream.next().await {
                let item = match next {
                    Ok(batch) => {
                        progress.advance(batch.num_rows() as u64);
                        // payload bytes (views may point into shared, mapped shards)
                        let data = batch.column(batch.num_columns() - 1);
                        let bytes = (binary_view_bytes(data.as_ref()) + batch.num_rows() * 16)
                            .clamp(1, budget);
                        match semaphore.clone().acquire_many_owned(bytes as u32).await {
                            Ok(permit) => Ok(LoadedBatch {
                                batch,
                                _budget: permit,
                            }),
                            Err(_) => return,
                        }
                    }
                    Err(e) => Err(Error::from(e)),
                };
                let failed = item.is_err();
                let slot = loop {
                    if let Some(slot) = slots.as_mut().and_then(Iterator::next) {
                        break slot;
                    }
                    match tx.reserve_many(refill).await {
                        Ok(reserved) => slots = Some(reserved),
                        Err(_) => return, // the consumer is gone
                    }
                };
                slot.send(item);
                if failed {
                    return;
                }
            }
        });
        Ok(Loader {
            plan,
            rx,
            task,
            joined: false,
            prefetch: fetcher,
        })
    }

    /// The next batch, `None` at the end of this reader's share of the epoch.
    pub async fn next(&mut self) -> Option<Result<LoadedBatch>> {
        match self.rx.recv().await {
            Some(item) => Some(item),
            None => self.ended().await,
        }
    }

    /// The channel closed: the end of the epoch if the task finished, an
    /// internal error if it panicked (never a silently short epoch).
    async fn ended(&mut self) -> Option<Result<LoadedBatch>> {
        if std::mem::replace(&mut self.joined, true) {
            return None; // a finished task is not polled twice
        }
        match (&mut self.task).await {
            Err(e) if e.is_panic() => Some(Err(Error::internal(format!(
                "the loader task panicked: {e}"
            )))),
            _ => None,
        }
    }

    /// The next batch if the read-ahead has it ready (`Poll::Pending` if
    /// not): the common case, answered without entering the runtime.
    pub fn ready(&mut self) -> std::task::Poll<Option<Result<LoadedBatch>>> {
        use tokio::sync::mpsc::error::TryRecvError;
        match self.rx.try_recv() {
            Ok(item) => std::task::Poll::Ready(Some(item)),
            Err(TryRecvError::Disconnected) if !self.task.is_finished() => std::task::Poll::Pending,
            Err(TryRecvError::Disconnected) => match futures::FutureExt::now_or_never(self.ended())
            {
                Some(end) => std::task::Poll::Ready(end),
                None => std::task::Poll::Pending,
            },
            Err(TryRecvError::Empty) => std::task::Poll::Pending,
        }
    }

    /// The plan as `EXPLAIN` shows it.
    pub fn explain(&self) -> String {
        displayable(self.plan.as_ref()).indent(true).to_string()
    }

    /// The plan's metrics (rows, payload bytes, read time) so far.
    pub fn metrics(&self) -> String {
        DisplayableExecutionPlan::with_metrics(self.plan.as_ref())
            .indent(true)
            .to_string()
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(prefetch) = &self.prefetch {
            prefetch.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::refill_batches;

    #[test]
    fn the_task_waits_for_slots_the_queue_has_and_leaves_a_batch_queued() {
        // 0 slots would spin, more than the queue would end the epoch early
        for queue in 1..=1024 {
            let refill = refill_batches(queue);
            assert!((1..=queue).contains(&refill), "queue {queue}: {refill}");
            if queue >= 2 {
                assert!(refill < queue, "queue {queue}: woken only when empty");
            }
        }
        assert_eq!(refill_batches(8), 6);
        assert_eq!(refill_batches(usize::MAX), usize::MAX - usize::MAX / 4);
    }
}

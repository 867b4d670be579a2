//! Fetching remote records before the loader reads them, in the order it will.
//!
//! The loader's draws are a pure function of (seed, epoch, position) and the
//! snapshot, so the prefetcher knows this reader's whole future: it walks the
//! same [`DrawPlan`] ahead of the consumer and keeps `requests` range requests
//! in flight into the caches' replicas (`store::remote`).
//!
//! The policy, per dataset:
//! - **The budget holds every remote byte** (or there is none): records are
//!   fetched as whole chunks of their shard (about `CHUNK_BYTES`, whole
//!   records) the first time one of them is needed, and nothing is evicted, so
//!   every byte is downloaded at most once, ever.
//! - **It does not:** exactly the needed records are fetched (consecutive ones
//!   in one request), and when the replicas would exceed the budget — the
//!   bytes their files hold on disk, which every process sharing the
//!   `cache_dir` counts alike, so the budget is the host's — the held
//!   records needed *latest* are evicted first — by their next use in this
//!   epoch, then in the next one, never-again first (Belady's rule, exact
//!   because the future is known). The future is the host's: every evicting
//!   loader publishes its plan and position (`load::host`), and a record's
//!   next use is the soonest any of them needs it; what the replica holds is
//!   read from disk, so a process evicts records others fetched too, one
//!   process at a time. Records fetched ahead and not yet read are needed
//!   sooner than anything else, so they stay. While the budget holds the
//!   read-ahead window, each needed byte is downloaded at most once per
//!   epoch.
//!
//! Local caches get advice instead: the kernel is told which records come
//! next (`madvise(MADV_WILLNEED)`, 64 MiB ahead of the consumer), so a cold
//! epoch reads their pages many at a time, not one page fault at a time.
//!
//! Everything here is an optimisation: a record the prefetcher has not
//! fetched (or failed to fetch) is fetched when it is read, and its error, if
//! any, is reported there.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;

use crate::catalog::Snapshot;
use crate::sample::{DrawPlan, EpochSampler};
use crate::store::remote::{self, FetchRange, Replica};
use crate::store::CacheSet;
use crate::Result;

use super::host;

/// Bytes fetched ahead of the consumer when the budget holds everything.
const AHEAD_BYTES: u64 = 256 << 20;

/// How far the consumer has read: draws of this reader delivered so far.
#[derive(Debug, Default)]
pub struct Progress {
    consumed: AtomicU64,
    moved: Notify,
}

impl Progress {
    pub fn advance(&self, draws: u64) {
        self.consumed.fetch_add(draws, Ordering::Release);
        self.moved.notify_waiters();
    }

    fn consumed(&self) -> u64 {
        self.consumed.load(Ordering::Acquire)
    }
}

/// The remote caches of a dataset: (cache position, replica).
fn replicas(caches: &CacheSet) -> Vec<(usize, Arc<Replica>)> {
    caches
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.replica().map(|r| (i, r.clone())))
        .collect()
}

/// This reader's draws of one epoch, as (cache position, sample), in order,
/// one at a time (`sampler` is the snapshot's for `plan`). An error is a
/// damaged chunk of the snapshot that a draw read.
fn draws<'a>(
    caches: &'a CacheSet,
    snapshot: &'a Snapshot,
    plan: &'a DrawPlan,
    sampler: &'a EpochSampler,
) -> impl Iterator<Item = Result<(u32, u64)>> + 'a {
    let mut hint = 0;
    plan.my_blocks()
        .flat_map(move |b| {
            let (start, end) = plan.block_range(b);
            // a failure here is the first draw's of the block, below
            let _ = sampler.prepare(start..end, crate::threads());
            // What the block's draws read is known before they read it: the
            // kernel is asked for all of it first, so that a snapshot larger
            // than the page cache costs one wait for the disk per step, not
            // one per draw (10^9 rows: 2.2 s for a first batch otherwise)
            sampler.advise(start..end);
            // up to the first failure, which ends the draws (its callers stop there)
            let mut rows: Vec<Result<u64>> = Vec::with_capacity((end - start) as usize);
            for k in start..end {
                let row = sampler.row(k);
                let failed = row.is_err();
                rows.push(row);
                if failed {
                    break;
                }
            }
            let known: Vec<usize> = rows.iter().flatten().map(|&r| r as usize).collect();
            snapshot.advise_identities(&known);
            rows
        })
        .map(move |row| {
            let (id, sample) = snapshot.identity(row? as usize)?;
            hint = caches.position_near(id, hint).unwrap_or(hint);
            Ok((hint as u32, sample as u64))
        })
}

/// This reader's draws of one epoch, all of them (the remote planner's).
fn my_draws(caches: &CacheSet, snapshot: &Snapshot, plan: &DrawPlan) -> Result<Vec<(u32, u64)>> {
    let sampler = snapshot.epoch_sampler(plan)?;
    draws(caches, snapshot, plan, &sampler).collect()
}

/// Next uses of every record by one reader, over its draws of this epoch
/// followed by the next epoch's: positions, grouped by record.
struct NextUse {
    positions: HashMap<(u32, u64), Vec<u64>>,
}

impl NextUse {
    fn new(sequence: impl Iterator<Item = (u32, u64)>) -> Self {
        let mut positions: HashMap<(u32, u64), Vec<u64>> = HashMap::new();
        for (i, key) in sequence.enumerate() {
            positions.entry(key).or_default().push(i as u64);
        }
        NextUse { positions }
    }

    /// The next uses of `plan`'s reader: this epoch's draws, then the next's.
    fn of(caches: &CacheSet, snapshot: &Snapshot, plan: &DrawPlan) -> Result<Self> {
        let this = my_draws(caches, snapshot, plan)?;
        Ok(Self::following(caches, snapshot, plan, this))
    }

    /// The next uses over `this` (the draws of `plan`), then the next epoch's
    /// (none, if they cannot be drawn).
    fn following(
        caches: &CacheSet,
        snapshot: &Snapshot,
        plan: &DrawPlan,
        this: Vec<(u32, u64)>,
    ) -> Self {
        let mut next = plan.clone();
        next.epoch += 1;
        next.start_block = 0;
        let following = my_draws(caches, snapshot, &next).unwrap_or_default();
        NextUse::new(this.into_iter().chain(following))
    }

    /// Draws from position `now` to the first use of `key` at or after it
    /// (`u64::MAX`: never).
    fn distance(&self, key: (u32, u64), now: u64) -> u64 {
        let Some(p) = self.positions.get(&key) else {
            return u64::MAX;
        };
        let i = p.partition_point(|&x| x < now);
        p.get(i).map_or(u64::MAX, |&x| x - now)
    }
}

/// The futures of the host's readers over this snapshot (`load::host`): each
/// reader's next uses, by its published key, and where each reader is.
struct HostFuture {
    caches: CacheSet,
    snapshot: Arc<Snapshot>,
    dir: Option<std::path::PathBuf>,
    /// This reader's key and next uses (always known, published or not).
    own: (String, Arc<NextUse>),
    uses: HashMap<String, Arc<NextUse>>,
}

impl HostFuture {
    /// The readers now: (next uses, position) of each, this one at `consumed`.
    async fn readers(&mut self, consumed: u64) -> Vec<(Arc<NextUse>, u64)> {
        let published = self.dir.as_deref().map(host::readers).unwrap_or_default();
        let mut out = vec![(self.own.1.clone(), consumed)];
        let mut keep = std::collections::HashSet::new();
        for reader in published {
            if reader.fingerprint != self.snapshot.fingerprint() || reader.key == self.own.0 {
                continue; // another snapshot's draws are not known here; this one is above
            }
            keep.insert(reader.key.clone());
            if !self.uses.contains_key(&reader.key) {
                let (caches, snapshot, plan) =
                    (self.caches.clone(), self.snapshot.clone(), reader.plan);
                let built =
                    tokio::task::spawn_blocking(move || NextUse::of(&caches, &snapshot, &plan))
                        .await;
                match built {
                    Ok(Ok(uses)) => self.uses.insert(reader.key.clone(), Arc::new(uses)),
                    _ => continue, // unknown: its records count as needed never
                };
            }
            out.push((self.uses[&reader.key].clone(), reader.consumed));
        }
        self.uses.retain(|k, _| keep.contains(k));
        out
    }
}

/// Start prefetching `plan`'s draws of the remote caches among `caches`;
/// `None` when there are none. The task ends with the epoch, on its first
/// error, or when the handle is dropped.
pub fn start(
    caches: CacheSet,
    snapshot: Arc<Snapshot>,
    plan: DrawPlan,
    progress: Arc<Progress>,
) -> Result<Option<tokio::task::JoinHandle<()>>> {
    if plan.run.is_some() {
        // a run that follows the head learns a block's snapshot only when
        // it claims the block: there is no known future to read ahead
        return Ok(None);
    }
    let remotes = replicas(&caches);
    if remotes.is_empty() {
        let handle = remote::spawn(async move {
            let _ = advise_local(caches, snapshot, plan, progress).await;
        })?;
        return Ok(Some(handle));
    }
    let handle = remote::spawn(async move {
        let _ = run(caches, remotes, snapshot, plan, progress).await;
    })?;
    Ok(Some(handle))
}

/// Local caches: tell the kernel which records come next, `LOCAL_AHEAD_BYTES`
/// ahead of the consumer, so their pages are read many at a time (as a
/// reader at a deep queue depth would) rather than one page fault at a time.
async fn advise_local(
    caches: CacheSet,
    snapshot: Arc<Snapshot>,
    plan: DrawPlan,
    progress: Arc<Progress>,
) -> Result<()> {
    // the draws are walked as the consumer moves, never held whole; the
    // sampler is the one the loader's own draws use (the snapshot keeps it)
    let sampler = {
        let (snapshot, plan) = (snapshot.clone(), plan.clone());
        tokio::task::spawn_blocking(move || snapshot.epoch_sampler(&plan))
            .await
            .map_err(|e| crate::Error::internal(format!("read-ahead planning failed: {e}")))??
    };
    // a draw that fails here fails the loader's own read of it, which
    // reports it: advice just stops there
    let mut ahead = draws(&caches, &snapshot, &plan, &sampler)
        .map_while(Result::ok)
        .peekable();
    let (mut next, mut advised) = (0usize, 0u64);
    // bytes advised for each draw from the consumer's position up to `next`
    let mut sizes = std::collections::VecDeque::new();
    while ahead.peek().is_some() {
        let consumed = progress.consumed() as usize;
        while sizes.len() > next.saturating_sub(consumed) {
            advised -= sizes.pop_front().unwrap_or(0);
        }
        while next < consumed && ahead.next().is_some() {
            next += 1; // read already: nothing to advise there
        }
        while advised < LOCAL_AHEAD_BYTES {
            let Some((cache, sample)) = ahead.next() else {
                break;
            };
            let bytes = caches[cache as usize].advise_willneed(sample);
            sizes.push_back(bytes);
            advised += bytes;
            next += 1;
        }
        if ahead.peek().is_some() {
            // the consumer moves on; wake at least now and then (a missed notify)
            let _ =
                tokio::time::timeout(Duration::from_millis(20), progress.moved.notified()).await;
        }
    }
    Ok(())
}

/// Bytes of local records advised ahead of the consumer (the loader's own
/// read-ahead window of batches lies inside it).
const LOCAL_AHEAD_BYTES: u64 = 64 << 20;

/// Prefetch `plan`'s draws of the `remotes` among `caches`: plan the
/// epoch's draws, then claim their ranges window by window as the consumer
/// moves, making room first when a budget needs it.
async fn run(
    caches: CacheSet,
    remotes: Vec<(usize, Arc<Replica>)>,
    snapshot: Arc<Snapshot>,
    plan: DrawPlan,
    progress: Arc<Progress>,
) -> Result<()> {
    let whole = remotes.iter().all(|(_, r)| r.whole());
    if whole
        && remotes
            .iter()
            .all(|(_, r)| r.present_bytes() == r.total_bytes())
    {
        return Ok(()); // every record is here already (a later epoch): nothing to plan
    }
    let budget = remotes[0].1.remote().options().cache_bytes;
    let requests = remotes[0].1.remote().options().requests;
    let by_position: HashMap<usize, Arc<Replica>> = remotes.iter().cloned().collect();
    let draws = {
        let (caches, snapshot, plan) = (caches.clone(), snapshot.clone(), plan.clone());
        tokio::task::spawn_blocking(move || my_draws(&caches, &snapshot, &plan))
            .await
            .map_err(|e| crate::Error::invalid(format!("prefetch planning failed: {e}")))??
    };
    if draws.is_empty() {
        return Ok(());
    }
    let mean = mean_record_bytes(&remotes);
    // Belady needs the future past this epoch (the next epoch's draws) and
    // every reader's of the host: this one's is published for the others
    let (mut host_future, published) = if whole || budget.is_none() {
        (None, None)
    } else {
        let (future, published) = join_host(&caches, &remotes, &snapshot, &plan, &draws).await?;
        (Some(future), published)
    };
    let ahead_bytes = match (whole, budget) {
        (true, _) | (false, None) => AHEAD_BYTES,
        // a quarter of the budget, shared by the loader's workers: all of
        // them read into the same replica under the one budget of the host
        (false, Some(b)) => (b / 4 / u64::from(plan.num_workers.max(1))).max(1),
    };
    let ahead = (ahead_bytes / mean).max(plan.batch_size as u64 * 2);
    let step = (plan.batch_size as u64).max(requests as u64);

    // The planner claims the ranges of the draws inside the window, in order,
    // evicting first when the budget needs it; the fetchers keep `requests`
    // of them in flight.
    let (tx, rx) = tokio::sync::mpsc::channel::<(Arc<Replica>, FetchRange)>(requests * 4);
    // After a failed fetch the rest are released unfetched: readers fetch
    // (and report) themselves.
    let failed = Arc::new(AtomicBool::new(false));
    let fetchers = spawn_fetchers(rx, requests, failed.clone());
    let mut pos = 0u64;
    let total = draws.len() as u64;
    'plan: while pos < total {
        let Some(limit) = window_end(&progress, pos, ahead, &failed).await else {
            break 'plan; // readers fetch (and report) themselves
        };
        let end = (pos + step).min(total).min(limit);
        if let Some(p) = &published {
            p.advance(progress.consumed());
        }
        let wanted = remote_samples(&draws[pos as usize..end as usize], &by_position);
        if let (Some(future), Some(budget)) = (&mut host_future, budget) {
            let incoming = incoming_bytes(&wanted, &by_position);
            make_room(future, &remotes, &progress, end, incoming, budget, mean).await;
        }
        for (c, mut samples) in wanted {
            let replica = &by_position[&c];
            for range in replica.plan(&mut samples) {
                if tx.send((replica.clone(), range)).await.is_err() {
                    break 'plan;
                }
            }
        }
        pos = end;
    }
    drop(tx);
    let _ = fetchers.await;
    Ok(())
}

/// The mean bytes of a record of the remote caches (at least 1).
fn mean_record_bytes(remotes: &[(usize, Arc<Replica>)]) -> u64 {
    let bytes: u64 = remotes.iter().map(|(_, r)| r.total_bytes()).sum();
    let records: u64 = remotes.iter().map(|(_, r)| r.records()).sum();
    (bytes / records.max(1)).max(1)
}

/// This reader's future for eviction (its next uses over `draws`, this
/// epoch's, then the next epoch's) and its plan, published for the host's
/// other readers (`None` if it could not be).
async fn join_host(
    caches: &CacheSet,
    remotes: &[(usize, Arc<Replica>)],
    snapshot: &Arc<Snapshot>,
    plan: &DrawPlan,
    draws: &[(u32, u64)],
) -> Result<(HostFuture, Option<host::Published>)> {
    let (c, s, p) = (caches.clone(), snapshot.clone(), plan.clone());
    let this: Vec<(u32, u64)> = draws.to_vec();
    let own = tokio::task::spawn_blocking(move || NextUse::following(&c, &s, &p, this))
        .await
        .map_err(|e| crate::Error::internal(format!("prefetch planning failed: {e}")))?;
    let dir = remotes[0]
        .1
        .remote()
        .replica_root_for(false)
        .join("readers");
    let published = host::Published::new(&dir, snapshot.fingerprint(), plan).ok();
    let key = published
        .as_ref()
        .map_or_else(String::new, |p| p.key().to_string());
    let future = HostFuture {
        caches: caches.clone(),
        snapshot: snapshot.clone(),
        dir: Some(dir),
        own: (key, Arc::new(own)),
        uses: HashMap::new(),
    };
    Ok((future, published))
}

/// The fetchers of the planner's ranges, `requests` in flight at a time;
/// once a fetch fails (`failed`), the rest are released unfetched.
fn spawn_fetchers(
    rx: tokio::sync::mpsc::Receiver<(Arc<Replica>, FetchRange)>,
    requests: usize,
    failed: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio_stream_from(rx)
            .map(|(replica, range)| {
                let failed = failed.clone();
                async move {
                    if failed.load(Ordering::Relaxed) {
                        replica.release(&range);
                    } else if replica.fetch_range(range).await.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                }
            })
            .buffer_unordered(requests)
            .for_each(|_| futures::future::ready(()))
            .await;
    })
}

/// Wait until draw `pos` lies inside the window of `ahead` draws past the
/// consumer; the window's end. `None`: a fetch failed meanwhile.
async fn window_end(progress: &Progress, pos: u64, ahead: u64, failed: &AtomicBool) -> Option<u64> {
    loop {
        let limit = progress.consumed() + ahead;
        if pos < limit {
            return Some(limit);
        }
        let moved = progress.moved.notified();
        if progress.consumed() + ahead > pos {
            continue;
        }
        let _ = tokio::time::timeout(Duration::from_millis(50), moved).await;
        if failed.load(Ordering::Relaxed) {
            return None;
        }
    }
}

/// The samples of `draws` that are in remote caches, by cache position.
fn remote_samples(
    draws: &[(u32, u64)],
    by_position: &HashMap<usize, Arc<Replica>>,
) -> HashMap<usize, Vec<u64>> {
    let mut wanted: HashMap<usize, Vec<u64>> = HashMap::new();
    for &(c, s) in draws {
        if by_position.contains_key(&(c as usize)) {
            wanted.entry(c as usize).or_default().push(s);
        }
    }
    wanted
}

/// Bytes of the `wanted` records their replicas do not hold yet.
fn incoming_bytes(
    wanted: &HashMap<usize, Vec<u64>>,
    by_position: &HashMap<usize, Arc<Replica>>,
) -> u64 {
    wanted
        .iter()
        .flat_map(|(c, samples)| {
            let r = &by_position[c];
            samples
                .iter()
                .filter(|&&s| !r.is_present(s))
                .map(move |&s| r.record_bytes(s))
        })
        .sum()
}

/// Before a step fetches `incoming` bytes: when the replicas would hold more
/// than the `budget` on disk (records of `mean` bytes), evict for the host.
/// `end`: where the step's draws end.
async fn make_room(
    future: &mut HostFuture,
    remotes: &[(usize, Arc<Replica>)],
    progress: &Progress,
    end: u64,
    incoming: u64,
    budget: u64,
    mean: u64,
) {
    // the host's bytes, not this process's: DataLoader workers and
    // ranks sharing a cache_dir share one budget. On disk a record
    // may keep one more page at its edges (the documented slack, at
    // most a quarter of the budget: tiny records share their pages)
    let held: u64 = remotes.iter().map(|(_, r)| r.held_on_disk()).sum();
    let on_disk = remotes[0].1.remote().disk_limit(mean).unwrap_or(budget);
    if held + incoming > on_disk {
        let consumed = progress.consumed();
        let readers = future.readers(consumed).await;
        let eviction = Eviction {
            remotes: remotes.to_vec(),
            readers,
            // what any reader has fetched ahead and not yet read stays
            keep_within: end.saturating_sub(consumed),
            limit: on_disk.saturating_sub(incoming),
            // free an eighth of the budget beyond what is needed, so
            // eviction runs now and then, not on every step
            extra: budget / 8,
            lock: remotes[0].1.remote().evict_lock_path(),
        };
        let _ = tokio::task::spawn_blocking(move || eviction.run()).await;
    }
}

/// One eviction for the host: the records held on disk by any process,
/// those needed latest by any reader first.
struct Eviction {
    remotes: Vec<(usize, Arc<Replica>)>,
    /// Every known reader's next uses and position.
    readers: Vec<(Arc<NextUse>, u64)>,
    /// Records some reader needs within this many draws stay.
    keep_within: u64,
    /// Bytes the replicas may hold on disk after the eviction...
    limit: u64,
    /// ...less this much more, freed at once.
    extra: u64,
    /// The host's eviction lock ([`remote::Remote::evict_lock_path`]).
    lock: std::path::PathBuf,
}

impl Eviction {
    fn run(self) {
        let _lock = crate::store::fs::lock_exclusive(&self.lock).ok();
        let held: u64 = self.remotes.iter().map(|(_, r)| r.held_on_disk()).sum();
        if held <= self.limit {
            return; // another process freed enough meanwhile
        }
        let need = held - self.limit + self.extra;
        let mut candidates: Vec<(u64, usize, u64)> = Vec::new();
        for (i, (c, r)) in self.remotes.iter().enumerate() {
            r.observe_disk();
            for s in 0..r.records() {
                if !r.is_present(s) {
                    continue;
                }
                let next = self
                    .readers
                    .iter()
                    .map(|(uses, now)| uses.distance((*c as u32, s), *now))
                    .min()
                    .unwrap_or(u64::MAX);
                if next >= self.keep_within {
                    candidates.push((next, i, s));
                }
            }
        }
        candidates.sort_unstable_by_key(|h| std::cmp::Reverse(h.0));
        let mut freed = 0;
        for (_, i, s) in candidates {
            if freed >= need {
                break;
            }
            let r = &self.remotes[i].1;
            freed += r.record_bytes(s);
            r.evict(s);
        }
    }
}

/// A receiver as a stream.
fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

//! The local, sparse replica of one remote cache's shards: which records it
//! holds, range requests that fill it (verified before they land), reads
//! that verify what they copy, and eviction within the host's budget.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use futures::StreamExt;
use object_store::path::Path as ObjectPath;

use super::lock::RangeLock;
use super::{block_on, Remote};
use crate::store::checksum::crc32c;
use crate::store::format::{shard_file_name, SHARD_HEADER_LEN};
use crate::store::fs;
use crate::store::host::counters::{Counters, COUNTERS};
use crate::store::reader::{Index, Span};
use crate::Unpoison;
use crate::{Error, Result};

/// Disk a held record may take beyond its bytes: a page at its edges.
pub const PAGE_SLACK: u64 = 4096;
/// Largest range one request asks for.
pub const MAX_REQUEST_BYTES: u64 = 8 << 20;
/// Bytes a chunk of a shard holds (rounded to whole records) when the whole
/// cache fits the budget and is downloaded chunk by chunk.
pub const CHUNK_BYTES: u64 = 4 << 20;

/// Download counters of one replica (or a sum of them).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FetchStats {
    pub requests: u64,
    pub bytes: u64,
    /// Records read that were already in the replica.
    pub hits: u64,
    /// Records read that had to be fetched when read (not ahead).
    pub misses: u64,
    pub evicted_bytes: u64,
}

impl From<[u64; COUNTERS]> for FetchStats {
    fn from([requests, bytes, hits, misses, evicted_bytes]: [u64; COUNTERS]) -> Self {
        FetchStats {
            requests,
            bytes,
            hits,
            misses,
            evicted_bytes,
        }
    }
}

impl std::ops::AddAssign for FetchStats {
    fn add_assign(&mut self, o: FetchStats) {
        self.requests += o.requests;
        self.bytes += o.bytes;
        self.hits += o.hits;
        self.misses += o.misses;
        self.evicted_bytes += o.evicted_bytes;
    }
}

/// A record's state in this process.
const ABSENT: u8 = 0;
const IN_FLIGHT: u8 = 1;
const PRESENT: u8 = 2;

/// `n` states, every one ABSENT, in zeroed memory: the allocator takes
/// fresh pages from the kernel, which maps one when it is first written.
fn absent_states(n: u64) -> Box<[AtomicU8]> {
    const _: () = assert!(ABSENT == 0);
    let zeroed = vec![0u8; n as usize].into_boxed_slice();
    // SAFETY: `AtomicU8` has the size, alignment and bit validity of `u8`,
    // so a slice of bytes is a slice of atomics; ownership moves whole.
    unsafe { Box::from_raw(Box::into_raw(zeroed) as *mut [AtomicU8]) }
}

/// The local, sparse replica of one remote cache's shards.
#[derive(Debug)]
pub struct Replica {
    remote: Arc<Remote>,
    name: String,
    shards: Vec<(ObjectPath, PathBuf, File)>,
    /// Per record: ABSENT, IN_FLIGHT or PRESENT (as far as this process
    /// knows). Zeroed memory the kernel maps on first write: a process pays
    /// for the pages of the records it touches, not one byte per record.
    state: Box<[AtomicU8]>,
    /// The cache's index (mapped, checked at open): where each record is.
    index: Arc<Index>,
    /// Stored bytes of every record.
    total: u64,
    /// Bytes of PRESENT records.
    present_bytes: AtomicU64,
    landed: (Mutex<()>, Condvar),
    /// The process whose fetches the IN_FLIGHT states are: a child made by
    /// `fork()` inherits them without the tasks that would finish them.
    owner: AtomicU32,
    /// The budget holds the whole dataset: fetched in whole chunks, never
    /// evicted, read in place.
    whole: bool,
    /// Disk the replica may take (`Remote::disk_limit`); `None` when it is
    /// whole or has no budget.
    disk_limit: Option<u64>,
    /// Records reads fetched themselves (`get_item`, SQL, a read the
    /// read-ahead had not reached), oldest first: what goes first when such a
    /// read would take the replica past the budget.
    read_fetched: Mutex<std::collections::VecDeque<u64>>,
    /// requests, bytes, hits, misses, evicted bytes: this process's, where
    /// the host's other processes see them.
    counts: Counters,
}

const REQUESTS: usize = 0;
const BYTES: usize = 1;
const HITS: usize = 2;
const MISSES: usize = 3;
const EVICTED: usize = 4;

/// One range request: records `first..end` (consecutive, in one shard) at bytes `range`.
#[derive(Debug, Clone)]
pub struct FetchRange {
    pub shard: u32,
    pub range: Range<u64>,
    pub records: Range<u64>,
}

impl Replica {
    /// The replica of cache `name` in `dir` (made by [`Remote::replicate`]),
    /// over its `index`, whose records hold `total` stored bytes. Costs
    /// O(shards) and the index's check, which the host's first process
    /// makes (the later ones test its bitmap): nothing is copied per record.
    pub fn open(
        remote: Arc<Remote>,
        name: &str,
        dir: &Path,
        shard_count: usize,
        index: Arc<Index>,
        total: u64,
        whole: bool,
    ) -> Result<Replica> {
        index.check_all()?;
        debug_assert_eq!(
            total,
            (0..index.records())
                .map(|s| index.span(s).end - index.span(s).start)
                .sum::<u64>(),
            "records fill their shards past the headers"
        );
        let mut shards = Vec::with_capacity(shard_count);
        for i in 0..shard_count {
            let file_name = shard_file_name(i as u32);
            let path = dir.join(&file_name);
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(Error::io(&path))?;
            shards.push((remote.object(&[name, &file_name]), path, file));
        }
        let counts = Counters::new(&remote.replica_root_for(whole).join("counts").join(name));
        let mean = (total / index.records().max(1)).max(1);
        let disk_limit = if whole { None } else { remote.disk_limit(mean) };
        Ok(Replica {
            state: absent_states(index.records()),
            index,
            total,
            remote,
            name: name.to_string(),
            shards,
            present_bytes: AtomicU64::new(0),
            landed: (Mutex::new(()), Condvar::new()),
            owner: AtomicU32::new(std::process::id()),
            whole,
            disk_limit,
            read_fetched: Mutex::new(std::collections::VecDeque::new()),
            counts,
        })
    }

    pub fn remote(&self) -> &Arc<Remote> {
        &self.remote
    }

    /// Does the budget hold the whole cache? Then it is fetched in whole
    /// chunks (each byte once) and never evicted.
    pub fn whole(&self) -> bool {
        self.whole
    }

    pub fn records(&self) -> u64 {
        self.state.len() as u64
    }

    fn span(&self, sample: u64) -> Span {
        self.index.span(sample)
    }

    /// Stored bytes of record `sample`.
    pub fn record_bytes(&self, sample: u64) -> u64 {
        let span = self.span(sample);
        span.end - span.start
    }

    /// Stored bytes of every record.
    pub fn total_bytes(&self) -> u64 {
        self.total
    }

    /// Bytes of the records this process holds.
    pub fn present_bytes(&self) -> u64 {
        self.present_bytes.load(Ordering::Relaxed)
    }

    /// Bytes the replica's shard files hold on disk now, whoever fetched
    /// them: every process sharing this `cache_dir` writes into the same
    /// sparse files, so this is the host's figure (the shard headers and
    /// page rounding included).
    pub fn held_on_disk(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        self.shards
            .iter()
            .filter_map(|(_, _, file)| file.metadata().ok())
            .map(|m| m.blocks() * 512)
            .sum()
    }

    /// Take the host's view of which records are held: a record whose bytes
    /// are all on disk counts as held (whichever process fetched it, so this
    /// process may evict it), one with a hole as absent (another process
    /// evicted it). Records this process is fetching stay as they are. The
    /// view is a hint for eviction and read-ahead; reads verify every byte.
    pub fn observe_disk(&self) {
        self.adopt();
        let extents: Vec<Option<Vec<Range<u64>>>> = self
            .shards
            .iter()
            .map(|(_, _, file)| fs::data_extents(file).ok())
            .collect();
        // held here, but with a hole: evicted by another process (a shard
        // that cannot be read keeps this process's own view)
        for (s, state) in self.state.iter().enumerate() {
            if state.load(Ordering::Relaxed) != PRESENT {
                continue;
            }
            let span = self.span(s as u64);
            if let Some(Some(data)) = extents.get(span.shard as usize) {
                let i = data.partition_point(|e| e.end <= span.start);
                let whole = data
                    .get(i)
                    .is_some_and(|e| e.start <= span.start && span.end <= e.end);
                if !whole {
                    self.move_state(s as u64, PRESENT, ABSENT);
                }
            }
        }
        // on disk, whoever fetched them: the records inside each extent
        // (records of a shard are consecutive samples at increasing offsets)
        for (shard, data) in extents.iter().enumerate() {
            for e in data.iter().flatten() {
                let mut s = self.first_at(shard as u32, e.start);
                while s < self.records() {
                    let span = self.span(s);
                    if span.shard != shard as u32 || span.start >= e.end {
                        break;
                    }
                    if span.end <= e.end {
                        self.move_state(s, ABSENT, PRESENT);
                    }
                    s += 1;
                }
            }
        }
    }

    /// The first record stored at or after byte `offset` of `shard` (or
    /// in a later shard): a binary search of the index.
    fn first_at(&self, shard: u32, offset: u64) -> u64 {
        let (mut lo, mut hi) = (0, self.records());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let span = self.span(mid);
            if (span.shard, span.start) < (shard, offset) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    pub fn is_present(&self, sample: u64) -> bool {
        self.state[sample as usize].load(Ordering::Acquire) == PRESENT
    }

    /// What this process's reads of the replica cost.
    pub fn stats(&self) -> FetchStats {
        FetchStats::from(self.counts.get())
    }

    /// What every process's reads of the replica on this host (sharing its
    /// `cache_dir`) cost, those that ended included.
    pub fn host_stats(&self) -> FetchStats {
        FetchStats::from(self.counts.host())
    }

    /// The requests that fetch `samples` (any order, repeats allowed): in
    /// whole mode the chunks that hold them, else the records themselves,
    /// consecutive records merged; each at most [`MAX_REQUEST_BYTES`]. Records
    /// present or in flight are left out, and the rest are marked in flight
    /// (their bytes count as present from now on).
    pub fn plan(&self, samples: &mut Vec<u64>) -> Vec<FetchRange> {
        self.adopt();
        samples.sort_unstable();
        samples.dedup();
        let whole = self.whole();
        let mut wanted: Vec<u64> = Vec::with_capacity(samples.len());
        for &s in samples.iter() {
            if whole {
                // sorted: a sample at or before the last one wanted is in
                // a chunk already taken; one claimed or held was planned
                // with its chunk before (a chunk is claimed whole). Without
                // this, every step of the read-ahead walked every record of
                // the chunks its draws land in: quadratic in records.
                if wanted.last().is_some_and(|&w| w >= s)
                    || self.state[s as usize].load(Ordering::Acquire) != ABSENT
                {
                    continue;
                }
                let (first, end) = self.chunk_of(s);
                wanted.extend(first..end);
            } else {
                wanted.push(s);
            }
        }
        let mut out: Vec<FetchRange> = Vec::new();
        for s in wanted {
            if !self.move_state(s, ABSENT, IN_FLIGHT) {
                continue;
            }
            let Span {
                shard, start, end, ..
            } = self.span(s);
            if let Some(last) = out.last_mut() {
                if last.shard == shard
                    && last.records.end == s
                    && last.range.end == start
                    && end - last.range.start <= MAX_REQUEST_BYTES
                {
                    last.range.end = end;
                    last.records.end = s + 1;
                    continue;
                }
            }
            out.push(FetchRange {
                shard,
                range: start..end,
                records: s..s + 1,
            });
        }
        out
    }

    /// Move record `s` from state `from` to `to` if it is in `from`. The one
    /// place that keeps `present_bytes`: a record's bytes count from its claim
    /// (IN_FLIGHT) while it is held (PRESENT), not while it is ABSENT.
    fn move_state(&self, s: u64, from: u8, to: u8) -> bool {
        let moved = self.state[s as usize]
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if moved && (from == ABSENT) != (to == ABSENT) {
            let bytes = self.record_bytes(s);
            if to == ABSENT {
                self.present_bytes.fetch_sub(bytes, Ordering::Relaxed);
            } else {
                self.present_bytes.fetch_add(bytes, Ordering::Relaxed);
            }
        }
        moved
    }

    /// In a child made by `fork()`: forget the parent's fetches in flight.
    fn adopt(&self) {
        let pid = std::process::id();
        if self.owner.swap(pid, Ordering::AcqRel) != pid {
            for s in 0..self.records() {
                self.move_state(s, IN_FLIGHT, ABSENT);
            }
        }
    }

    /// Records `first..end` of the chunk that holds `sample`: consecutive
    /// records of its shard, about [`CHUNK_BYTES`] from the first chunk start
    /// at or before it. Two binary searches of the index (records of a
    /// shard are consecutive samples at increasing offsets).
    fn chunk_of(&self, sample: u64) -> (u64, u64) {
        let Span { shard, start, .. } = self.span(sample);
        let chunk = start.saturating_sub(SHARD_HEADER_LEN as u64) / CHUNK_BYTES;
        let lo = chunk * CHUNK_BYTES + SHARD_HEADER_LEN as u64;
        let hi = lo + CHUNK_BYTES;
        let first = self.first_at(shard, lo).min(sample);
        let end = self.first_at(shard, hi).max(sample + 1);
        (first, end)
    }

    /// Fetch `ranges` (from [`Replica::plan`]), `requests` at a time.
    pub async fn fetch(&self, ranges: Vec<FetchRange>) -> Result<()> {
        let requests = self.remote.options.requests;
        let results: Vec<Result<()>> = futures::stream::iter(ranges)
            .map(|r| self.fetch_range(r))
            .buffer_unordered(requests)
            .collect()
            .await;
        results.into_iter().collect()
    }

    /// Fetch one range into the replica: every record in it is verified
    /// before the range is written. Its records end PRESENT, or ABSENT (and
    /// uncounted) on an error.
    pub async fn fetch_range(&self, r: FetchRange) -> Result<()> {
        let result = self.fetch_one(&r).await;
        if result.is_ok() {
            for s in r.records.clone() {
                self.move_state(s, IN_FLIGHT, PRESENT);
            }
        }
        self.release(&r); // after an error: the claims go back
        result
    }

    async fn fetch_one(&self, r: &FetchRange) -> Result<()> {
        let (object, path, file) = &self.shards[r.shard as usize];
        // One process downloads a range at a time: the others wait on its
        // byte-range lock, then find the bytes in the replica.
        let lock = {
            let (file, path) = (file.try_clone().map_err(Error::io(path))?, path.clone());
            let range = r.range.clone();
            tokio::task::spawn_blocking(move || RangeLock::acquire(file, &path, range))
                .await
                .map_err(|e| Error::internal(format!("replica lock task failed: {e}")))??
        };
        if self.holds(r)? {
            drop(lock);
            return Ok(());
        }
        let bytes = self.remote.get_range(object, r.range.clone()).await?;
        self.counts.add(REQUESTS, 1);
        self.counts.add(BYTES, bytes.len() as u64);
        for s in r.records.clone() {
            let Span {
                start, end, crc, ..
            } = self.span(s);
            let at = (start - r.range.start) as usize..(end - r.range.start) as usize;
            let actual = crc32c(&bytes[at]);
            if actual != crc {
                return Err(Error::corrupt_record(
                    self.remote.object_url(object),
                    s,
                    Some(r.shard),
                    Some(start),
                    format!(
                        "sample {s} of cache {:?} at bytes {start}..{end}: checksum mismatch after \
                         download (index crc32c {crc:08x}, downloaded {actual:08x})",
                        self.name
                    ),
                ));
            }
        }
        let file = file.try_clone().map_err(Error::io(path))?;
        let start = r.range.start;
        let path = path.clone();
        tokio::task::spawn_blocking(move || {
            let written = file.write_all_at(&bytes, start).map_err(Error::io(&path));
            drop(lock);
            written
        })
        .await
        .map_err(|e| Error::invalid(format!("replica write failed: {e}")))?
    }

    /// Does the replica hold every record of `r` (each verified)? Another
    /// process may have fetched them.
    fn holds(&self, r: &FetchRange) -> Result<bool> {
        let (_, path, file) = &self.shards[r.shard as usize];
        let mut bytes = vec![0u8; (r.range.end - r.range.start) as usize];
        file.read_exact_at(&mut bytes, r.range.start)
            .map_err(Error::io(path))?;
        Ok(r.records.clone().all(|s| {
            let Span {
                start, end, crc, ..
            } = self.span(s);
            crc32c(&bytes[(start - r.range.start) as usize..(end - r.range.start) as usize]) == crc
        }))
    }

    /// Copy record `sample`'s stored bytes into `out` (its stored length) and
    /// verify them there; fetch it (or wait for the fetch in flight) when the
    /// replica does not hold it. `checksum` is the index entry's CRC.
    pub fn read(self: &Arc<Self>, sample: u64, checksum: u32, out: &mut [u8]) -> Result<()> {
        let Span { shard, start, .. } = self.span(sample);
        let (_, path, file) = &self.shards[shard as usize];
        self.obtain(sample, || {
            file.read_exact_at(out, start).map_err(Error::io(path))?;
            Ok(crc32c(out) == checksum)
        })
    }

    /// Make sure the replica holds record `sample`, whose stored bytes are
    /// `mapped` (the replica's mapping of them): verified in place, fetched
    /// if they fail. Only for whole replicas, which are never evicted, so
    /// verified bytes stay valid for every view of them.
    pub fn ensure(self: &Arc<Self>, sample: u64, checksum: u32, mapped: &[u8]) -> Result<()> {
        debug_assert!(self.whole());
        self.obtain(sample, || Ok(crc32c(mapped) == checksum))
    }

    /// `check` (read and verify the record) until it passes: first after any
    /// fetch in flight lands, then after fetching the record now.
    fn obtain(
        self: &Arc<Self>,
        sample: u64,
        mut check: impl FnMut() -> Result<bool>,
    ) -> Result<()> {
        self.adopt();
        for attempt in 0..2 {
            // wait for a fetch in flight, as long as one request can take
            if self.state[sample as usize].load(Ordering::Acquire) == IN_FLIGHT {
                let guard = self.landed.0.lock().unpoisoned();
                let _ =
                    self.landed
                        .1
                        .wait_timeout_while(guard, self.remote.request_bound(), |_| {
                            self.state[sample as usize].load(Ordering::Acquire) == IN_FLIGHT
                        });
            }
            if check()? {
                if attempt == 0 {
                    self.counts.add(HITS, 1);
                } else {
                    self.within_budget(sample);
                }
                self.move_state(sample, ABSENT, PRESENT); // fetched by another process
                return Ok(());
            }
            if attempt == 1 {
                break;
            }
            // a hole, a fetch that did not land, or evicted by another
            // process: fetch it now (its chunk, in whole mode), or alone when
            // it is claimed by a fetch that is late
            self.counts.add(MISSES, 1);
            self.move_state(sample, PRESENT, ABSENT);
            let ranges = self.plan(&mut vec![sample]);
            let this = self.clone();
            if ranges.iter().any(|r| r.records.contains(&sample)) {
                block_on(async move { this.fetch(ranges).await })??;
            } else {
                self.release_all(&ranges);
                block_on(async move { this.fetch_unclaimed(sample).await })??;
            }
        }
        let Span { shard, start, .. } = self.span(sample);
        Err(Error::corrupt_record(
            &self.shards[shard as usize].1,
            sample,
            Some(shard),
            Some(start),
            format!(
                "sample {sample} of cache {:?}: the replica's bytes fail their checksum after \
                 fetching them again",
                self.name
            ),
        ))
    }

    /// A read fetched record `sample` itself: keep the replica within the
    /// budget by evicting what reads fetched longest ago (the loader's
    /// read-ahead evicts by the known future, `load::prefetch`; a record
    /// fetched by a read is needed by no loader's plan, so it goes first
    /// there too).
    fn within_budget(&self, sample: u64) {
        let Some(limit) = self.disk_limit else {
            return;
        };
        let mut fetched = self.read_fetched.lock().unpoisoned();
        fetched.push_back(sample);
        if self.held_on_disk() <= limit {
            return;
        }
        let _lock = fs::lock_exclusive(&self.remote.evict_lock_path()).ok();
        while self.held_on_disk() > limit && fetched.len() > 1 {
            if let Some(oldest) = fetched.pop_front() {
                self.evict(oldest);
            }
        }
    }

    fn release_all(&self, ranges: &[FetchRange]) {
        ranges.iter().for_each(|r| self.release(r));
    }

    /// Fetch record `sample` although another fetch claimed it.
    async fn fetch_unclaimed(&self, sample: u64) -> Result<()> {
        let Span {
            shard, start, end, ..
        } = self.span(sample);
        self.fetch_one(&FetchRange {
            shard,
            range: start..end,
            records: sample..sample + 1,
        })
        .await
    }

    /// Give up claims that will not be fetched (a fetcher that stopped).
    pub fn release(&self, r: &FetchRange) {
        for s in r.records.clone() {
            self.move_state(s, IN_FLIGHT, ABSENT);
        }
        let _guard = self.landed.0.lock().unpoisoned();
        self.landed.1.notify_all();
    }

    /// Drop record `sample` from the replica: its pages that no record this
    /// process holds shares are punched out of the sparse shard.
    pub fn evict(&self, sample: u64) {
        if !self.move_state(sample, PRESENT, ABSENT) {
            return;
        }
        let Span {
            shard, start, end, ..
        } = self.span(sample);
        self.counts.add(EVICTED, end - start);
        const PAGE: u64 = 4096;
        let mut lo = start / PAGE * PAGE;
        let mut hi = end.div_ceil(PAGE) * PAGE;
        // a neighbour this process holds keeps the page they share
        let held = |s: u64| {
            s < self.records()
                && self.span(s).shard == shard
                && self.state[s as usize].load(Ordering::Acquire) != ABSENT
        };
        let mut s = sample;
        while s > 0 && self.span(s - 1).shard == shard && self.span(s - 1).end > lo {
            s -= 1;
            if held(s) {
                lo += PAGE;
                break;
            }
        }
        let mut s = sample + 1;
        while (s as usize) < self.state.len()
            && self.span(s).shard == shard
            && self.span(s).start < hi
        {
            if held(s) {
                hi -= PAGE;
                break;
            }
            s += 1;
        }
        if lo.max(SHARD_HEADER_LEN as u64) >= hi || lo < PAGE {
            lo = lo.max(PAGE); // the page with the shard header stays
        }
        if hi > lo {
            fs::punch_hole(&self.shards[shard as usize].2, lo, hi - lo);
        }
    }
}

//! A run that follows the head within an epoch: its schedule says which
//! snapshot draws which part of each epoch, so that a change committed
//! during an epoch (a new mixture, new weights) takes effect at one global
//! draw that every rank and worker agrees on, resume continues exactly, and
//! what a checkpoint trained on is recomputed, never stored.
//!
//! The schedule is a directory per run beside the snapshots,
//! `runs/<run>/e<epoch>/<draw>`, one small sealed file per change: from
//! draw `<draw>` on, the epoch draws from snapshot `n` (fingerprint `f`).
//! Files are created only if absent, so the first writer's choice stands.
//!
//! The draw a change takes effect at: the processes of a host that read a
//! run share three words ([`Claims`]): the furthest draw any reader has
//! claimed (a reader claims a block before it draws it), a flag a writer
//! raises while it picks the draw, and the schedule's version. A reader
//! that sees a new head raises the flag, reads the furthest claim and
//! writes the change at it: a block boundary no reader has drawn past. A
//! reader that claims while the flag is up waits for the entry and draws
//! by it. So on one host no block is ever drawn by a snapshot other than
//! the one the schedule gives it; across hosts a reader that finds a change
//! before a draw it already delivered says so instead of diverging.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use memmap2::MmapMut;

use super::{commit, read_manifest, Mixture, Snapshot};
use crate::sample::{EpochSampler, Interleave, Sampling};
use crate::store::checksum::{open_sealed_text, seal_text};
use crate::store::fs;
use crate::Unpoison;
use crate::{Error, Result};

/// The directory of runs, in a dataset's snapshot directory.
pub const RUNS_DIR: &str = "runs";
const HEADER: &str = "datasetrt-run-entry";

/// A run's name: 1 to 128 of `A-Z a-z 0-9 . _ -`, not starting with `.`
/// (it names a directory).
pub fn check_run(run: &str) -> Result<()> {
    let ok = (1..=128).contains(&run.len())
        && !run.starts_with('.')
        && run
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    match ok {
        true => Ok(()),
        false => Err(Error::invalid(format!(
            "a run's name is 1 to 128 letters, digits, '.', '_' or '-' (not starting with \
             '.'), not {run:?}"
        ))),
    }
}

/// Every snapshot some run's schedule in `snapshot_dir` names: what a run
/// drew from, which `cleanup` keeps so `exposures` can answer for it
/// (removing `runs/<run>` lets them go).
pub fn named_snapshots(snapshot_dir: &Path) -> Result<std::collections::BTreeSet<u64>> {
    let mut named = std::collections::BTreeSet::new();
    let runs = snapshot_dir.join(RUNS_DIR);
    let list = |dir: &Path| -> Result<Vec<std::fs::DirEntry>> {
        match std::fs::read_dir(dir) {
            Ok(names) => names
                .collect::<std::io::Result<_>>()
                .map_err(Error::io(dir)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(Error::io(dir)(e)),
        }
    };
    for run in list(&runs)? {
        let name = run.file_name().to_string_lossy().into_owned();
        if check_run(&name).is_err() || !run.path().is_dir() {
            continue;
        }
        for epoch in list(&run.path())? {
            let name = epoch.file_name();
            let number = name
                .to_str()
                .and_then(|n| n.strip_prefix('e')?.parse::<u64>().ok());
            if number.is_some() {
                named.extend(read_entries(&epoch.path(), &[])?.iter().map(|e| e.snapshot));
            }
        }
    }
    Ok(named)
}

/// The entries in epoch directory `dir`, those of `known` (files never
/// change once written) taken as they are and only the others read.
fn read_entries(dir: &Path, known: &[Entry]) -> Result<Vec<Entry>> {
    let names = match std::fs::read_dir(dir) {
        Ok(names) => names,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir)(e)),
    };
    let mut entries = Vec::new();
    for name in names {
        let name = name.map_err(Error::io(dir))?.file_name();
        let Some(from) = name.to_str().and_then(|n| n.parse::<u64>().ok()) else {
            continue; // a temp file being written
        };
        if let Ok(i) = known.binary_search_by_key(&from, |e| e.from) {
            entries.push(known[i].clone());
            continue;
        }
        let path = dir.join(&name);
        let raw = std::fs::read(&path).map_err(Error::io(&path))?;
        let (_, body) = open_sealed_text(&path, &raw, HEADER, 1..=1, "run schedule entry")?;
        let field = |key: &str| {
            body.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .ok_or_else(|| Error::corrupt(&path, format!("no {key} line")))
        };
        let snapshot = field("snapshot")?
            .parse()
            .map_err(|_| Error::corrupt(&path, "bad snapshot line"))?;
        entries.push(Entry {
            from,
            snapshot,
            fingerprint: field("fingerprint")?.to_string(),
        });
    }
    entries.sort_by_key(|e| e.from);
    Ok(entries)
}

/// From draw `from` of an epoch on, draws come from snapshot `snapshot`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub from: u64,
    pub snapshot: u64,
    pub fingerprint: String,
}

/// The first block boundary at or after draw `draw` (blocks of `block`).
fn boundary_at(draw: u64, block: u64) -> u64 {
    draw.div_ceil(block.max(1)).saturating_mul(block.max(1))
}

/// The first block boundary after draw `draw`.
fn next_boundary(draw: u64, block: u64) -> u64 {
    boundary_at(draw.saturating_add(1), block)
}

/// Draws are claimed as `epoch << 40 | draw` (an epoch has fewer than 2^40
/// draws here), so that one word orders claims across epochs.
const DRAW_BITS: u32 = 40;
/// The epochs a claim can name.
const MAX_EPOCHS: u64 = 1 << (64 - DRAW_BITS);

fn pack(epoch: u64, draw: u64) -> u64 {
    (epoch << DRAW_BITS) | draw.min((1 << DRAW_BITS) - 1)
}

/// The words a host's readers of one run share, in a small file mapped
/// shared (`/dev/shm/datasetrt-<uid>/runs/` where there is shared memory).
/// Each process that maps it holds a shared lock on it, so a file no
/// process holds (every reader of its run has ended) is swept by the next
/// opener, as reader leases are.
struct Claims {
    map: MmapMut,
    /// The shared lock, held while the map is.
    _held: std::fs::File,
}

const CLAIMED: usize = 0;
const PENDING: usize = 1;
const VERSION: usize = 2;

impl Claims {
    fn open(key: &str) -> Result<Claims> {
        let dir = match crate::store::host::host_dir() {
            Some(host) => host.join("runs"),
            None => std::env::temp_dir().join("datasetrt-runs"),
        };
        std::fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
        sweep_claims(&dir);
        let path = dir.join(format!("{key}.claims"));
        // a sweeper may remove the file between our open and our lock: then
        // the lock is on a file nobody else will find, and we open again
        let held = loop {
            let held = fs::lock_shared(&path)?;
            if same_file(&held, &path) {
                break held;
            }
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(Error::io(&path))?;
        if file.metadata().map_err(Error::io(&path))?.len() < 24 {
            file.set_len(24).map_err(Error::io(&path))?;
        }
        // SAFETY: the file is ours to share; every access is an atomic word
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(Error::io(&path))?;
        Ok(Claims { map, _held: held })
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        let ptr = self.map.as_ptr() as *mut u64;
        // SAFETY: the map is 24 bytes, page-aligned, and lives as long as self
        unsafe { AtomicU64::from_ptr(ptr.add(i)) }
    }
}

impl Drop for Schedule {
    /// Record the run's furthest claim in its folder (best effort), so that
    /// a reader after the host's claims are swept places changes after it.
    fn drop(&mut self) {
        let claimed = self.claims.word(CLAIMED).load(Ordering::SeqCst);
        if claimed > recorded_claim(&self.dir) {
            record_claim(&self.dir, claimed);
        }
    }
}

/// Names of the files that record a run's furthest claim: the packed
/// claim in 20 digits (the name is the record; the file is empty).
const CLAIMED_PREFIX: &str = "claimed-";

/// The furthest claim recorded in run folder `dir` (0: none).
fn recorded_claim(dir: &Path) -> u64 {
    let Ok(names) = std::fs::read_dir(dir) else {
        return 0;
    };
    names
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix(CLAIMED_PREFIX)?
                .parse()
                .ok()
        })
        .max()
        .unwrap_or(0)
}

/// Record `claimed` in run folder `dir`, and remove the smaller records.
fn record_claim(dir: &Path, claimed: u64) {
    let path = dir.join(format!("{CLAIMED_PREFIX}{claimed:020}"));
    if std::fs::File::create(&path).is_err() {
        return;
    }
    let Ok(names) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in names.flatten() {
        let name = entry.file_name();
        let older = name
            .to_str()
            .and_then(|n| n.strip_prefix(CLAIMED_PREFIX)?.parse::<u64>().ok())
            .is_some_and(|c| c < claimed);
        if older {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Remove the claims files in `dir` that no process holds (runs whose
/// readers have all ended). Best effort: a file that cannot be locked or
/// removed stays for a later sweep.
fn sweep_claims(dir: &Path) {
    let Ok(names) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in names.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "claims") {
            if let Ok(Some(_unused)) = fs::try_lock_exclusive(&path) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// Whether `file` is the file at `path` now (not one removed since).
fn same_file(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// One run's schedule, as one process reads and writes it.
pub struct Schedule {
    snapshot_dir: PathBuf,
    dir: PathBuf,
    claims: Claims,
    seen: Mutex<Seen>,
}

impl std::fmt::Debug for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Schedule({})", self.dir.display())
    }
}

/// What this process has seen of the head and the schedule.
#[derive(Default)]
struct Seen {
    /// The head record's file as last read (length, time, inode) and the
    /// snapshot it named.
    head: Option<((u64, std::time::SystemTime, u64), u64)>,
    /// The schedule's version when `entries` were read, and them by epoch.
    version: u64,
    entries: BTreeMap<u64, Vec<Entry>>,
}

impl Schedule {
    pub fn open(snapshot_dir: &Path, run: &str) -> Result<Schedule> {
        check_run(run)?;
        let dir = snapshot_dir.join(RUNS_DIR).join(run);
        std::fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
        // one key however the dataset's path was spelled (relative, a link)
        let real = std::fs::canonicalize(&dir).map_err(Error::io(&dir))?;
        let key = xxhash_rust::xxh3::xxh3_64(real.to_string_lossy().as_bytes());
        let claims = Claims::open(&format!("{key:016x}"))?;
        // claims swept (or lost with a reboot) come back from the run's
        // folder: the furthest claim any ended reader of it recorded
        claims
            .word(CLAIMED)
            .fetch_max(recorded_claim(&dir), Ordering::SeqCst);
        Ok(Schedule {
            snapshot_dir: snapshot_dir.to_path_buf(),
            claims,
            dir,
            seen: Mutex::default(),
        })
    }

    fn epoch_dir(&self, epoch: u64) -> PathBuf {
        self.dir.join(format!("e{epoch:020}"))
    }

    /// The entries of `epoch` as stored, by `from`.
    pub fn read(&self, epoch: u64) -> Result<Vec<Entry>> {
        self.read_past(epoch, &[])
    }

    /// The entries of `epoch`, those of `known` (files never change once
    /// written) taken as they are and only the others read.
    fn read_past(&self, epoch: u64, known: &[Entry]) -> Result<Vec<Entry>> {
        read_entries(&self.epoch_dir(epoch), known)
    }

    /// Write `entry` for `epoch` unless one is there for its draw already.
    fn write(&self, epoch: u64, entry: &Entry) -> Result<()> {
        let dir = self.epoch_dir(epoch);
        std::fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
        let path = dir.join(format!("{:020}", entry.from));
        let body = format!(
            "{HEADER} 1\nsnapshot={}\nfingerprint={}\n",
            entry.snapshot, entry.fingerprint
        );
        let tmp = fs::temp_sibling(&path);
        fs::write_synced(&tmp, seal_text(&body).as_bytes())?;
        fs::publish_no_replace(&tmp, &path)?;
        Ok(())
    }

    /// The snapshot the head names now, read only when its file changed.
    fn head(&self, seen: &mut Seen) -> Result<Option<u64>> {
        use std::os::unix::fs::MetadataExt;
        let path = self.snapshot_dir.join(commit::HEAD_FILE);
        let Ok(meta) = std::fs::metadata(&path) else {
            return Ok(seen.head.map(|h| h.1));
        };
        let version = (
            meta.len(),
            meta.modified().map_err(Error::io(&path))?,
            meta.ino(),
        );
        if let Some((v, n)) = seen.head {
            if v == version {
                return Ok(Some(n));
            }
        }
        let n = commit::read_head(&self.snapshot_dir)?;
        seen.head = n.map(|n| (version, n));
        Ok(n)
    }

    /// Before the block of `epoch` that ends at draw `end` is drawn
    /// (`block`: the reader's block size; `start_on`: the snapshot the
    /// reader planned the epoch on, which starts the epoch unless the run
    /// already did): claim it, write a change if the head moved (at a block
    /// boundary), and return the epoch's entries.
    pub fn claim(
        &self,
        epoch: u64,
        end: u64,
        block: u64,
        start_on: &Snapshot,
    ) -> Result<Vec<Entry>> {
        if epoch >= MAX_EPOCHS {
            return Err(Error::invalid(format!(
                "a run that follows the head draws fewer than {MAX_EPOCHS} epochs, not epoch \
                 {epoch}"
            )));
        }
        let mut seen = self.seen.lock().unpoisoned();
        let mine = pack(epoch, end);
        // the readers of a live run are within an epoch of each other: a
        // claim further on was left by an earlier run of this name and is
        // replaced (one update, so no live claim is lost to it)
        let _ = self
            .claims
            .word(CLAIMED)
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |was| {
                match was >> DRAW_BITS > epoch + 1 {
                    true => Some(mine),
                    false => (was < mine).then_some(mine),
                }
            });
        // a writer picking the draw of a change may not have seen this claim
        let mut waits = 0u64;
        while self.claims.word(PENDING).load(Ordering::SeqCst) != 0 {
            std::thread::sleep(Duration::from_micros(200));
            waits += 1;
            // the writer holds the run's lock while the flag is up: a flag
            // with the lock free was left by a writer that died
            if waits.is_multiple_of(256) {
                if let Some(_held) = fs::try_lock_exclusive(&self.dir.join("lock"))? {
                    // held: no writer can raise the flag meanwhile
                    let cleared = self.claims.word(PENDING).compare_exchange(
                        1,
                        0,
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    );
                    // the dead writer may have written its entry: read again
                    if cleared.is_ok() {
                        self.claims.word(VERSION).fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }
        let version = self.claims.word(VERSION).load(Ordering::SeqCst);
        if version != seen.version || !seen.entries.contains_key(&epoch) {
            let known = seen.entries.get(&epoch).cloned().unwrap_or_default();
            let mut entries = self.read_past(epoch, &known)?;
            if entries.first().map(|e| e.from) != Some(0) {
                self.write(
                    epoch,
                    &Entry {
                        from: 0,
                        snapshot: start_on.number(),
                        fingerprint: start_on.fingerprint().to_string(),
                    },
                )?;
                entries = self.read_past(epoch, &entries)?;
            }
            seen.version = version;
            seen.entries.retain(|&e, _| e + 1 >= epoch);
            seen.entries.insert(epoch, entries);
        }
        let last = seen.entries[&epoch]
            .last()
            .expect("an epoch starts")
            .snapshot;
        if let Some(head) = self.head(&mut seen)?.filter(|&h| h != last) {
            self.take_head(epoch, head, block, &mut seen)?;
        }
        Ok(seen.entries[&epoch].clone())
    }

    /// Write the change to `head` at the furthest draw claimed (if this
    /// epoch is still the furthest claimed), under the run's lock: a block
    /// boundary (of `block` draws), past the epoch's last entry.
    fn take_head(&self, epoch: u64, head: u64, block: u64, seen: &mut Seen) -> Result<()> {
        let _lock = fs::lock_exclusive(&self.dir.join("lock"))?;
        let known = seen.entries.get(&epoch).cloned().unwrap_or_default();
        let mut entries = self.read_past(epoch, &known)?;
        if entries.last().is_some_and(|e| e.snapshot == head) {
            seen.entries.insert(epoch, entries);
            return Ok(());
        }
        let fingerprint = read_manifest(&self.snapshot_dir, head)?.fingerprint;
        self.claims.word(PENDING).store(1, Ordering::SeqCst);
        let claimed = self.claims.word(CLAIMED).load(Ordering::SeqCst);
        // after the epoch's last entry too: the claims may be younger than
        // the schedule (a resume after a reboot, on another host; a change
        // placed at the furthest claim before any reader claimed past it)
        let after = entries.last().map_or(0, |e| next_boundary(e.from, block));
        let written = match claimed >> DRAW_BITS == epoch {
            true => self.write(
                epoch,
                &Entry {
                    from: boundary_at(claimed & ((1 << DRAW_BITS) - 1), block).max(after),
                    snapshot: head,
                    fingerprint,
                },
            ),
            // a reader is in a later epoch already: it starts that one on the head
            false => Ok(()),
        };
        self.claims.word(VERSION).fetch_add(1, Ordering::SeqCst);
        self.claims.word(PENDING).store(0, Ordering::SeqCst);
        written?;
        entries = self.read_past(epoch, &entries)?;
        seen.version = self.claims.word(VERSION).load(Ordering::SeqCst);
        seen.entries.insert(epoch, entries);
        Ok(())
    }
}

/// The draws of one epoch of a run, by its schedule: draw `k` comes from
/// the snapshot of the last entry at or before `k`. Under a mixture each
/// group continues its own sequence across changes (its count of draws is
/// carried from the mixtures before), so a change of shares neither repeats
/// nor skips a group's rows; otherwise draw `k` is the snapshot's draw `k`.
#[derive(Debug, Default)]
pub struct Segments {
    segments: Vec<Segment>,
    /// Each group's draws so far at the last segment's start, by (column,
    /// value): a mixture over another column starts its groups afresh.
    carried: BTreeMap<(String, String), u64>,
}

#[derive(Debug)]
struct Segment {
    entry: Entry,
    mixture: Option<Mixture>,
    /// What identifies its rows and weights (their column files): the
    /// snapshots of one population share one opened snapshot, whatever
    /// their mixtures.
    population: String,
    /// The snapshot and its sampler, made when a draw first lands here.
    drawer: std::sync::OnceLock<(Arc<Snapshot>, EpochSampler)>,
    /// The groups' draws before this segment, by the mixture's groups.
    base: Vec<u64>,
}

impl Segments {
    /// Take the entries past those already known (the schedule only grows;
    /// an entry that differs from one known is refused: the schedule
    /// changed under a reader that drew by it).
    pub fn extend(&mut self, dir: &Path, entries: &[Entry], drawn_through: u64) -> Result<()> {
        for (i, entry) in entries.iter().enumerate() {
            if let Some(known) = self.segments.get(i) {
                if known.entry != *entry {
                    return Err(Error::invalid(format!(
                        "the run's schedule changed under this reader: draw {} was drawn from \
                         snapshot {}, the schedule now says snapshot {} from draw {}",
                        known.entry.from, known.entry.snapshot, entry.snapshot, entry.from
                    )));
                }
                continue;
            }
            if entry.from < drawn_through {
                return Err(Error::invalid(format!(
                    "a change to snapshot {} takes effect at draw {} of the run, but this reader \
                     has drawn through draw {drawn_through}: the readers of a run that follows \
                     the head must share a host, or stay within one step of each other",
                    entry.snapshot, entry.from
                )));
            }
            let manifest = read_manifest(dir, entry.snapshot)?;
            if manifest.fingerprint != entry.fingerprint {
                return Err(Error::invalid(format!(
                    "the run drew from snapshot {} with fingerprint {}, which now has \
                     fingerprint {}",
                    entry.snapshot, entry.fingerprint, manifest.fingerprint
                )));
            }
            if let Some(last) = self.segments.last() {
                let len = entry.from.saturating_sub(last.entry.from);
                if let Some(m) = &last.mixture {
                    let counts = Interleave::new(m.shares().clone()).counts(len);
                    for (value, (n, before)) in m.values().iter().zip(counts.iter().zip(&last.base))
                    {
                        self.carried
                            .insert((m.column().to_string(), value.clone()), before + n);
                    }
                }
            }
            let base = match &manifest.mixture {
                Some(m) => m
                    .values()
                    .iter()
                    .map(|v| {
                        let key = (m.column().to_string(), v.clone());
                        self.carried.get(&key).copied().unwrap_or(0)
                    })
                    .collect(),
                None => Vec::new(),
            };
            let population = manifest
                .partitions
                .iter()
                .flat_map(|p| p.columns.iter().map(|c| c.hash.as_str()))
                .collect::<Vec<_>>()
                .join(",");
            self.segments.push(Segment {
                entry: entry.clone(),
                mixture: manifest.mixture,
                population,
                drawer: Default::default(),
                base,
            });
        }
        Ok(())
    }

    /// The segment of draw `k`.
    pub fn of(&self, k: u64) -> usize {
        self.segments
            .partition_point(|s| s.entry.from <= k)
            .saturating_sub(1)
    }

    /// The snapshot segment `i` draws from.
    pub fn number(&self, i: usize) -> u64 {
        self.segments[i].entry.snapshot
    }

    /// Segment `i`'s rows (a snapshot of its population: its identities
    /// and row numbers are the segment's snapshot's) and sampler
    /// (`sampling`, `seed`, `epoch`, `epoch_len` as the plan draws them).
    pub fn drawer(
        &self,
        i: usize,
        dir: &Path,
        opened: &mut BTreeMap<String, Arc<Snapshot>>,
        (sampling, seed, epoch, epoch_len): (Sampling, u64, u64, u64),
    ) -> Result<&(Arc<Snapshot>, EpochSampler)> {
        let seg = &self.segments[i];
        if let Some(made) = seg.drawer.get() {
            return Ok(made);
        }
        let snapshot = match opened.get(&seg.population) {
            Some(s) => s.clone(),
            None => {
                let s = Arc::new(Snapshot::open(dir, seg.entry.snapshot)?);
                opened.insert(seg.population.clone(), s.clone());
                s
            }
        };
        let sampler = match &seg.mixture {
            Some(m) => {
                let made = super::snapshot::mixture_sampler(
                    &snapshot,
                    m,
                    (sampling, seed, epoch),
                    epoch_len,
                )?;
                let draws = made.mixture_draws().expect("a mixture's sampler");
                EpochSampler::mixture(seed, epoch, Arc::new(draws.continued(seg.base.clone())))
            }
            None => snapshot.plain_sampler(sampling, seed, epoch, epoch_len)?,
        };
        Ok(seg.drawer.get_or_init(|| (snapshot, sampler)))
    }

    /// The row of draw `k` in segment `i`'s snapshot.
    pub fn row(&self, i: usize, k: u64) -> Result<u64> {
        let seg = &self.segments[i];
        let (_, sampler) = seg.drawer.get().expect("made by drawer");
        match seg.mixture {
            // a mixture's interleaving starts where its segment does
            Some(_) => sampler.row(k - seg.entry.from),
            None => sampler.row(k),
        }
    }

    /// The entries taken so far.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.segments.iter().map(|s| &s.entry)
    }
}

#[cfg(test)]
mod tests {
    use super::{boundary_at, next_boundary};

    #[test]
    fn changes_land_on_block_boundaries() {
        // the furthest claim is a block's end; the epoch's last block may be short
        assert_eq!(boundary_at(420, 20), 420);
        assert_eq!(boundary_at(421, 20), 440);
        assert_eq!(boundary_at(0, 20), 0);
        // past the last entry: at 420, the next change can be no sooner than 440
        assert_eq!(next_boundary(420, 20), 440);
        assert_eq!(next_boundary(419, 20), 420);
        assert_eq!(next_boundary(0, 1), 1);
        assert_eq!(boundary_at(u64::MAX - 3, 8), u64::MAX); // saturates, never wraps
    }
}

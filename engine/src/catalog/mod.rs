//! A dataset: one or more published caches plus numbered, immutable metadata
//! snapshots. The head record names the population; `commit` says how it
//! moves.

mod assemble;
mod cleanup;
pub mod commit;
pub mod lease;
mod mirror;
mod ranges;
pub mod schedule;
pub mod scores;
mod snapshot;
pub mod stream;
mod tags;
mod validate;
mod verify;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

pub use ranges::ColumnRange;
pub use snapshot::PartitionEntry;
pub use snapshot::{read_manifest, Mixture, Snapshot, SnapshotManifest};
pub use stream::{StreamRecipe, StreamWriter};
pub use tags::TAGS_DIR;
pub use validate::CacheBounds;

use crate::store::remote::{self, Remote, RemoteOptions};
use crate::store::{fs, Cache, CacheSet};
use crate::{Error, Result};

pub use crate::store::RESERVED_COLUMNS;

/// Name of the directory, inside a dataset root, that holds snapshots by default.
pub const SNAPSHOTS_DIR: &str = "_snapshots";

/// How a dataset is opened.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Base directory for metadata snapshots; default `<root>/_snapshots`.
    /// Each combination of caches gets its own subdirectory.
    pub snapshot_dir: Option<PathBuf>,
    /// How to reach paths that are URLs (`s3://...`), and where their local
    /// replicas live.
    pub remote: RemoteOptions,
    /// Rows per partition of the snapshots this dataset writes (default:
    /// [`snapshot::default_partition_rows`]).
    pub partition_rows: Option<usize>,
}

/// What a commit names: a population cut and stored by the commit itself,
/// or partitions stored before it.
enum Population<'a> {
    Made(&'a snapshot::Partitioned),
    Stored(&'a [snapshot::PartitionEntry]),
}

/// Caches plus the active metadata snapshot.
#[derive(Debug)]
pub struct Dataset {
    caches: CacheSet,
    snapshot_dir: PathBuf,
    active: RwLock<Arc<Snapshot>>,
    /// The bucket that holds the snapshots, for a dataset of remote caches.
    mirror: Option<mirror::Mirror>,
    /// Rows per partition of the snapshots this dataset writes.
    partition_rows: usize,
}

/// Find the caches a path names: the path itself when it is a cache directory,
/// else every published cache directly below it.
fn discover(path: &Path) -> Result<Vec<PathBuf>> {
    if !path.exists() {
        return Err(Error::NotFound {
            what: "dataset path",
            path: path.to_path_buf(),
        });
    }
    // leftovers of builds killed in this root (the cache's own root when
    // the path is a cache), removed before any error
    if Cache::is_cache_dir(path) {
        if let Some(root) = path.parent() {
            fs::remove_stale_temps(root);
        }
        return Ok(vec![path.to_path_buf()]);
    }
    fs::remove_stale_temps(path);
    let mut found = Vec::new();
    for entry in std::fs::read_dir(path).map_err(Error::io(path))? {
        let entry = entry.map_err(Error::io(path))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(['.', '_']) {
            continue; // staging directories and snapshots
        }
        if entry.path().is_dir() && Cache::is_cache_dir(&entry.path()) {
            found.push(entry.path());
        } else if entry.path().is_dir() && Cache::looks_like_cache(&entry.path()) {
            // Skipping it would silently open a different dataset.
            return Err(Error::NotFound {
                what: "cache MANIFEST (the directory holds cache files without it)",
                path: entry.path().join(crate::store::format::MANIFEST_FILE),
            });
        }
    }
    if found.is_empty() {
        return Err(Error::NotFound {
            what: "published cache (no MANIFEST in the path or its subdirectories)",
            path: path.to_path_buf(),
        });
    }
    found.sort();
    Ok(found)
}

/// Build the partitions snapshot 0 of any set holding the cache at
/// `cache_dir` will link, when it is large enough to be a group of its own
/// (`per / 2` records or more; `false` otherwise), beside the snapshot
/// directories under `snapshot_dir` (default: `<root>/_snapshots`, as
/// [`Dataset::open`] has it). `build` calls it in the process that wrote
/// the cache, so caches built in parallel are partitioned in parallel.
pub fn prepare_partitions(
    cache_dir: &Path,
    snapshot_dir: Option<&Path>,
    partition_rows: Option<usize>,
) -> Result<bool> {
    let cache = Arc::new(Cache::open(cache_dir)?);
    let base = match snapshot_dir {
        Some(dir) => dir.to_path_buf(),
        None => cache
            .dir()
            .parent()
            .map(|p| p.join(SNAPSHOTS_DIR))
            .unwrap_or_else(|| PathBuf::from(SNAPSHOTS_DIR)),
    };
    let per = partition_rows.unwrap_or_else(snapshot::default_partition_rows);
    assemble::prepare(&base, &cache, per)
}

/// FNV-1a, for a short stable name of a set of caches.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The caches `paths` name (see [`Dataset::open`]), one of each
/// `cache_id`, sorted by it. The same cache reached by two paths counts
/// once; two caches of one id in different directories are refused.
fn open_caches(paths: &[PathBuf], remote_options: &RemoteOptions) -> Result<Vec<Arc<Cache>>> {
    let mut by_id: BTreeMap<i64, Arc<Cache>> = BTreeMap::new();
    for path in paths {
        let opened = caches_at(path, remote_options)?;
        for cache in opened {
            let dir = cache.dir().to_path_buf();
            if let Some(other) = by_id.get(&cache.id()) {
                let same =
                    std::fs::canonicalize(other.dir()).ok() == std::fs::canonicalize(&dir).ok();
                if !same {
                    return Err(Error::invalid(format!(
                        "caches {} and {} have the same cache_id {}; one is a copy of the other",
                        other.dir().display(),
                        dir.display(),
                        cache.id()
                    )));
                }
                continue;
            }
            by_id.insert(cache.id(), Arc::new(cache));
        }
    }
    Ok(by_id.into_values().collect())
}

/// The caches one path names: every cache of a bucket (a URL such as
/// `s3://...`), else those [`discover`] finds under a local path.
fn caches_at(path: &Path, remote_options: &RemoteOptions) -> Result<Vec<Cache>> {
    let opened: Vec<Cache> = match path.to_str().filter(|p| remote::is_url(p)) {
        Some(url) => {
            let remote = Remote::new(url, remote_options.clone())?;
            let (names, whole) = remote::block_on({
                let remote = remote.clone();
                async move {
                    let names = remote.discover().await?;
                    let whole = remote.fits(&names).await?;
                    Ok::<_, Error>((names, whole))
                }
            })??;
            names
                .iter()
                .map(|name| Cache::open_remote(&remote, name, whole))
                .collect::<Result<_>>()?
        }
        None => discover(path)?
            .iter()
            .map(|dir| Cache::open(dir))
            .collect::<Result<_>>()?,
    };
    Ok(opened)
}

/// The bucket that keeps the snapshots of `caches` (named by `key`): caches
/// all in one bucket keep their snapshots there too, unless `snapshot_dir`
/// says otherwise.
fn bucket_mirror(
    caches: &[Arc<Cache>],
    snapshot_dir: Option<&Path>,
    key: &[u8],
) -> Option<mirror::Mirror> {
    let urls: std::collections::BTreeSet<&str> = caches
        .iter()
        .map(|c| c.replica().map_or("", |r| r.remote().url()))
        .collect();
    match (snapshot_dir, caches[0].replica()) {
        (None, Some(r)) if urls.len() == 1 => Some(mirror::Mirror::new(
            r.remote().clone(),
            &format!("{:016x}", fnv1a(key)),
        )),
        _ => None,
    }
}

/// The snapshot directory of `caches` (named by `key`) under `snapshot_dir`
/// (default: `<root of the first cache>/_snapshots`), created, and cleared of
/// what processes killed mid-update left behind.
fn make_snapshot_dir(
    caches: &[Arc<Cache>],
    snapshot_dir: Option<PathBuf>,
    key: &[u8],
) -> Result<PathBuf> {
    let base = match snapshot_dir {
        Some(dir) => dir,
        None => caches[0]
            .dir()
            .parent()
            .map(|p| p.join(SNAPSHOTS_DIR))
            .unwrap_or_else(|| PathBuf::from(SNAPSHOTS_DIR)),
    };
    let snapshot_dir = base.join(format!("{:016x}", fnv1a(key)));
    std::fs::create_dir_all(&snapshot_dir).map_err(Error::io(&snapshot_dir))?;
    // leftovers of processes killed mid-update (roots: see discover)
    fs::remove_stale_temps(&snapshot_dir);
    fs::remove_stale_temps(&snapshot_dir.join(snapshot::COLUMNS_DIR));
    fs::remove_stale_temps(&snapshot_dir.join(TAGS_DIR));
    fs::remove_stale_temps(&base.join(assemble::PARTS_DIR));
    fs::remove_stale_temps(&base.join(assemble::PARTS_DIR).join(snapshot::COLUMNS_DIR));
    Ok(snapshot_dir)
}

/// Snapshot 0 of a snapshot directory without a head: every stored sample
/// of `caches`, weight 1.0, committed (and pushed to the bucket, with
/// `mirror`), or the one another process committed first.
fn first_snapshot(
    snapshot_dir: &Path,
    caches: &[Arc<Cache>],
    partition_rows: usize,
    mirror: Option<&mirror::Mirror>,
) -> Result<Snapshot> {
    // made under the lock: the processes of a job that open a
    // new set at once wait for the first to make it, rather than
    // each writing (and reading back) every column file
    let guard = commit::lock(snapshot_dir)?;
    let number = match commit::read_head(snapshot_dir)? {
        Some(n) => n, // another process created it meanwhile
        None => {
            let initial = assemble::first_population(snapshot_dir, caches, partition_rows)?;
            let n = snapshot::write_manifest(
                snapshot_dir,
                &initial,
                0,
                "every stored sample",
                None,
                None,
            )?;
            commit::write_head(snapshot_dir, n, &guard)?;
            if mirror.is_none() {
                commit::record_committed(snapshot_dir, n, &guard)?;
            }
            match mirror {
                Some(m) => match m.push_commit(snapshot_dir, n, n) {
                    Ok(()) => n,
                    Err(Error::Conflict { .. }) => {
                        // another reader of the bucket created it first: take theirs
                        let path = snapshot_dir.join(Snapshot::file_name(n));
                        std::fs::remove_file(&path).map_err(Error::io(&path))?;
                        m.pull(snapshot_dir)?;
                        commit::read_head(snapshot_dir)?.unwrap_or(n)
                    }
                    Err(e) => return Err(e),
                },
                None => n,
            }
        }
    };
    Snapshot::open(snapshot_dir, number)
}

impl Dataset {
    /// Open the caches under `paths` (cache directories or roots holding
    /// caches) and the newest metadata snapshot, creating snapshot 0 (every
    /// stored sample, weight 1.0) when there is none yet.
    pub fn open(paths: &[PathBuf], options: OpenOptions) -> Result<Dataset> {
        if paths.is_empty() {
            return Err(Error::invalid("open() needs at least one path"));
        }
        let partition_rows = options
            .partition_rows
            .unwrap_or_else(snapshot::default_partition_rows);
        let caches = open_caches(paths, &options.remote)?;

        let key: Vec<u8> = caches.iter().flat_map(|c| c.id().to_le_bytes()).collect();
        let mirror = bucket_mirror(&caches, options.snapshot_dir.as_deref(), &key);
        let snapshot_dir = make_snapshot_dir(&caches, options.snapshot_dir, &key)?;

        if let Some(m) = &mirror {
            m.pull(&snapshot_dir)?;
        }
        let numbers = Self::list_in(&snapshot_dir)?;
        let snapshot = match commit::current(&snapshot_dir, &numbers)? {
            Some(n) => Snapshot::open(&snapshot_dir, n)?,
            None => first_snapshot(&snapshot_dir, &caches, partition_rows, mirror.as_ref())?,
        };
        Ok(Dataset {
            caches: CacheSet::new(caches)?,
            snapshot_dir,
            active: RwLock::new(Arc::new(snapshot)),
            mirror,
            partition_rows,
        })
    }

    fn list_in(dir: &Path) -> Result<Vec<u64>> {
        let mut numbers = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(Error::io(dir))? {
            let entry = entry.map_err(Error::io(dir))?;
            if let Some(n) = Snapshot::parse_file_name(&entry.file_name().to_string_lossy()) {
                numbers.push(n);
            }
        }
        numbers.sort_unstable();
        Ok(numbers)
    }

    /// Download counters of the remote caches, summed (zero when all are
    /// local): this process's, or (`host`) every process's that shares this
    /// `cache_dir` on this host, those that ended included.
    pub fn fetch_stats(&self, host: bool) -> remote::FetchStats {
        let mut sum = remote::FetchStats::default();
        for r in self.caches.iter().filter_map(|c| c.replica()) {
            sum += if host { r.host_stats() } else { r.stats() };
        }
        sum
    }

    /// The caches of this dataset, sorted by `cache_id`.
    pub fn caches(&self) -> &CacheSet {
        &self.caches
    }

    /// The caches, shared (for plan nodes and loaders).
    pub fn cache_set(&self) -> CacheSet {
        self.caches.clone()
    }

    /// Position of `cache_id` in [`Dataset::caches`].
    pub fn cache_position(&self, cache_id: i64) -> Result<usize> {
        self.caches.position(cache_id)
    }

    /// Where this dataset's snapshots live.
    pub fn snapshot_dir(&self) -> &Path {
        &self.snapshot_dir
    }

    /// Numbers of every snapshot on disk, oldest first.
    pub fn snapshot_numbers(&self) -> Result<Vec<u64>> {
        Self::list_in(&self.snapshot_dir)
    }

    /// The active population.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.active.read().expect("snapshot lock").clone()
    }

    /// The snapshot the head record names now (another process may have
    /// moved it since this dataset was opened).
    pub fn head(&self) -> Result<u64> {
        if let Some(m) = &self.mirror {
            m.pull(&self.snapshot_dir)?;
        }
        self.local_head()
    }

    /// The head of the local snapshot directory (for a bucket: as last pulled).
    fn local_head(&self) -> Result<u64> {
        commit::read_head(&self.snapshot_dir)?.ok_or_else(|| {
            Error::corrupt(
                self.snapshot_dir.join(commit::HEAD_FILE),
                "the head record is missing",
            )
        })
    }

    /// Validate `batches` as the new population and commit it as the next
    /// snapshot; `note` records what made it. `base` is the snapshot the
    /// update was derived from (default: the active one): if the head has
    /// moved past it, the update is refused with [`Error::Conflict`] unless
    /// `force`. A rejected update changes nothing.
    pub fn update(
        &self,
        schema: &SchemaRef,
        batches: &[RecordBatch],
        note: &str,
        base: Option<u64>,
        force: bool,
    ) -> Result<Arc<Snapshot>> {
        let (schema, batches) = validate::normalize(schema, batches)?;
        let active = self.snapshot();
        let samples = CacheBounds::of(&self.caches);
        let checks = validate::PartitionChecks::new(&active, &schema, &samples)?;
        let mut total = 0.0;
        let population = snapshot::Partitioned::new(
            &schema,
            &batches,
            self.partition_rows,
            Some(&active.prior()),
            |first_row, part, hashes| {
                total += checks.check(first_row, part, hashes)?;
                Ok(())
            },
        )?;
        validate::check_total(population.num_rows(), total)?;
        drop(checks);
        let mixture = carried(&active, |name| schema.index_of(name).is_ok())?;
        let base = base.unwrap_or_else(|| active.number());
        drop(active);
        self.commit(
            Population::Made(&population),
            note,
            base,
            force,
            mixture.as_ref(),
        )
    }

    /// Commit the population of snapshot `base` (default: the active one)
    /// again with `mixture` (none: drawn by its weights alone) as the next
    /// snapshot: the rows and their column files stay as they are. The
    /// mixture is checked first (its column exists, each group of positive
    /// share has a row of positive weight).
    pub fn set_mixture(
        &self,
        mixture: Option<Mixture>,
        base: Option<u64>,
        force: bool,
    ) -> Result<Arc<Snapshot>> {
        let active = self.snapshot();
        let on = match base {
            Some(n) if n != active.number() => self.snapshot_at(n)?,
            _ => active,
        };
        let note = match &mixture {
            Some(m) => {
                snapshot::check_mixture(&on, m)?;
                let shares: Vec<String> = m
                    .values()
                    .iter()
                    .enumerate()
                    .map(|(g, v)| format!("{v}={}", m.shares().share(g)))
                    .collect();
                format!("set_mixture {}: {}", m.column(), shares.join(" "))
            }
            None => "set_mixture: none".to_string(),
        };
        let parts = on.partition_entries();
        let base = on.number();
        drop(on);
        self.commit(
            Population::Stored(&parts),
            &note,
            base,
            force,
            mixture.as_ref(),
        )
    }

    /// How a stream of rows derived from `base` (a snapshot of this
    /// dataset) is stored as partitions of an update, apart from its commit
    /// ([`stream::StreamWriter`]).
    pub fn stream_recipe(&self, base: &Snapshot) -> StreamRecipe {
        StreamRecipe {
            dir: self.snapshot_dir.clone(),
            base: base.number(),
            per: self.partition_rows,
            samples: CacheBounds::of(&self.caches),
        }
    }

    /// Commit partitions stored apart (by the workers of a distributed
    /// `select`, see [`stream`]) as the next snapshot, as [`Dataset::update`]
    /// commits a population: `base` is the snapshot they were derived from.
    /// Their column files must be in this dataset's snapshot directory.
    pub fn commit_stored(
        &self,
        partitions: Vec<snapshot::PartitionEntry>,
        note: &str,
        base: u64,
        force: bool,
    ) -> Result<Arc<Snapshot>> {
        let rows: usize = partitions.iter().map(|p| p.rows).sum();
        if rows == 0 {
            return Err(validate::empty());
        }
        let mass = partitions.iter().map(|p| p.mass.unwrap_or(0.0)).sum();
        validate::check_total(rows, mass)?;
        let names: Vec<&str> = partitions
            .first()
            .map(|p| p.columns.iter().map(|c| c.name.as_str()).collect())
            .unwrap_or_default();
        let mixture = carried(&self.snapshot(), |name| names.contains(&name))?;
        self.commit(
            Population::Stored(&partitions),
            note,
            base,
            force,
            mixture.as_ref(),
        )
    }

    /// Commit `population` on `base` (see [`Dataset::update`]).
    fn commit(
        &self,
        population: Population<'_>,
        note: &str,
        base: u64,
        force: bool,
        mixture: Option<&Mixture>,
    ) -> Result<Arc<Snapshot>> {
        // The commit lock first, the active snapshot only to swap it: readers
        // of `snapshot()` never wait for another process's commit.
        let guard = commit::lock(&self.snapshot_dir)?;
        let head = self.head()?;
        if head != base && !force {
            return Err(Error::Conflict {
                dir: self.snapshot_dir.clone(),
                base,
                head,
            });
        }
        if self.mirror.is_none() {
            self.settle(head, &guard)?;
        }
        let next = Self::list_in(&self.snapshot_dir)?
            .last()
            .map_or(0, |n| n + 1);
        let dir = &self.snapshot_dir;
        let number = match population {
            Population::Made(made) => {
                snapshot::publish(dir, made, next, note, Some(head), mixture)?
            }
            Population::Stored(parts) => {
                stream::check_present(dir, parts)?;
                snapshot::write_manifest(dir, parts, next, note, Some(head), mixture)?
            }
        };
        let snapshot = Arc::new(Snapshot::open(&self.snapshot_dir, number)?);
        // a mixture carried over an update: each group of positive share
        // still has a row to draw (else the head never names this snapshot)
        if let Some(Err(e)) = mixture.map(|m| snapshot::check_mixture(&snapshot, m)) {
            let path = self.snapshot_dir.join(Snapshot::file_name(number));
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        commit::write_head(&self.snapshot_dir, number, &guard)?;
        if self.mirror.is_none() {
            commit::record_committed(&self.snapshot_dir, number, &guard)?;
        }
        if let Some(m) = &self.mirror {
            if let Err(e) = m.push_commit(&self.snapshot_dir, number, head) {
                // the bucket refused: this directory goes back to the bucket's state
                commit::write_head(&self.snapshot_dir, head, &guard)?;
                let path = self.snapshot_dir.join(Snapshot::file_name(number));
                let _ = std::fs::remove_file(&path);
                return Err(match e {
                    Error::Conflict { dir, head, .. } => Error::Conflict { dir, base, head },
                    e => e,
                });
            }
        }
        *self.active.write().expect("snapshot lock") = snapshot.clone();
        Ok(snapshot)
    }

    /// Before a commit moves the head (holding the lock): record the head as
    /// committed (a writer may have died after moving it, before recording
    /// it), then remove the manifests no head ever named — a writer died
    /// between creating one and moving the head — so `history()` never
    /// lists them and their numbers are taken again. In a directory without
    /// a record yet, everything on disk counts as committed.
    fn settle(&self, head: u64, guard: &commit::CommitLock) -> Result<()> {
        let dir = &self.snapshot_dir;
        let numbers = Self::list_in(dir)?;
        let through = match commit::read_committed(dir) {
            Some(_) => head,
            None => numbers.last().copied().unwrap_or(head).max(head),
        };
        commit::record_committed(dir, through, guard)?;
        for n in commit::uncommitted(dir, &numbers, Some(head)) {
            let path = dir.join(Snapshot::file_name(n));
            std::fs::remove_file(&path).map_err(Error::io(&path))?;
        }
        Ok(())
    }

    /// Snapshots on disk that no head ever named (a writer died between
    /// creating one and moving the head): the next commit removes them.
    /// Empty for a dataset in a bucket (its record is the bucket's head).
    pub fn uncommitted(&self) -> Result<Vec<u64>> {
        if self.mirror.is_some() {
            return Ok(Vec::new());
        }
        let numbers = Self::list_in(&self.snapshot_dir)?;
        let head = commit::read_head(&self.snapshot_dir)?;
        Ok(commit::uncommitted(&self.snapshot_dir, &numbers, head))
    }

    /// Snapshot `number`, without making it active.
    pub fn snapshot_at(&self, number: u64) -> Result<Arc<Snapshot>> {
        let active = self.snapshot();
        if active.number() == number {
            return Ok(active);
        }
        Ok(Arc::new(Snapshot::open(&self.snapshot_dir, number)?))
    }

    /// Make an existing snapshot the population, for every process: the
    /// head moves to it (a rollback; no snapshot is deleted).
    pub fn checkout(&self, number: u64) -> Result<Arc<Snapshot>> {
        let guard = commit::lock(&self.snapshot_dir)?;
        let before = self.head()?; // pulls a bucket's head first
                                   // opened under the lock: a cleanup cannot delete it before the head
                                   // names it
        let snapshot = self.snapshot_at(number)?;
        if self.mirror.is_none() {
            // the head moves away from `before`: it stays on record as committed
            commit::record_committed(&self.snapshot_dir, before, &guard)?;
        }
        commit::write_head(&self.snapshot_dir, number, &guard)?;
        if let Some(m) = &self.mirror {
            if let Err(e) = m.push_head(&self.snapshot_dir, before) {
                commit::write_head(&self.snapshot_dir, before, &guard)?;
                return Err(e);
            }
        }
        *self.active.write().expect("snapshot lock") = snapshot.clone();
        Ok(snapshot)
    }

    /// Make snapshot `number` active in this process only (the head stays):
    /// how a loader worker reopens the population its parent pinned.
    pub fn pin(&self, number: u64) -> Result<Arc<Snapshot>> {
        let snapshot = self.snapshot_at(number)?;
        *self.active.write().expect("snapshot lock") = snapshot.clone();
        Ok(snapshot)
    }

    /// Make the head's snapshot active (after another process committed).
    pub fn refresh(&self) -> Result<Arc<Snapshot>> {
        self.pin(self.head()?)
    }

    /// The payload of one stored sample, checksum verified. Uses the same read
    /// path as `PayloadTakeExec`.
    pub fn read(&self, cache_id: i64, sample_id: i64) -> Result<Vec<u8>> {
        self.cache_position(cache_id)?;
        let data = self.caches.take(&[cache_id], &[sample_id], 1)?;
        Ok(data.value(0).to_vec())
    }
}

/// The mixture an update of `active` keeps: its own, while the update
/// keeps the grouping column (`has`); an update that drops it is refused.
fn carried(active: &Snapshot, has: impl Fn(&str) -> bool) -> Result<Option<Mixture>> {
    match active.mixture() {
        Some(m) if !has(m.column()) => Err(Error::invalid(format!(
            "snapshot {} draws by a mixture of column {:?}, which this update drops: keep the              column, or clear the mixture first (set_mixture(None))",
            active.number(),
            m.column()
        ))),
        other => Ok(other.cloned()),
    }
}

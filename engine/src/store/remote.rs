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

use std::fs::File;
use std::future::Future;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientConfigKey, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    RetryConfig,
};

use super::checksum::crc32c;
use super::counters::{Counters, COUNTERS};
use super::format::{
    shard_file_name, IndexEntry, ATTRIBUTES_FILE, INDEX_FILE, MANIFEST_FILE, SHARD_HEADER_LEN,
};
use super::fs;
use crate::{Error, Result};

/// Disk a held record may take beyond its bytes: a page at its edges.
pub const PAGE_SLACK: u64 = 4096;
/// Largest range one request asks for.
pub const MAX_REQUEST_BYTES: u64 = 8 << 20;
/// Bytes a chunk of a shard holds (rounded to whole records) when the whole
/// cache fits the budget and is downloaded chunk by chunk.
pub const CHUNK_BYTES: u64 = 4 << 20;
/// Requests in flight at once, by default.
pub const DEFAULT_REQUESTS: usize = 32;
/// A request's time limit, unless storage option `timeout` sets another.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(20);
/// No retry starts later than this after a request's first attempt.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(15);

/// Is `location` a URL (`s3://...`) rather than a local path?
pub fn is_url(location: &str) -> bool {
    location.split_once("://").is_some_and(|(scheme, _)| {
        !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric())
    })
}

/// Where a remote dataset lives and how to reach it.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// `storage_options`, spelled as `object_store`, Polars and delta-rs spell
    /// them (`aws_endpoint`, `aws_access_key_id`, `aws_region`,
    /// `aws_allow_http`, `timeout`...). The environment is read first.
    pub storage_options: Vec<(String, String)>,
    /// Local directory for replicas (and, by default, snapshots).
    pub cache_dir: PathBuf,
    /// Disk budget of this process's replicas; `None`: unlimited.
    pub cache_bytes: Option<u64>,
    /// Requests in flight at once.
    pub requests: usize,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            storage_options: Vec::new(),
            cache_dir: default_cache_dir(),
            cache_bytes: None,
            requests: DEFAULT_REQUESTS,
        }
    }
}

/// `$DATASETRT_CACHE_DIR`, else `$XDG_CACHE_HOME/datasetrt`, else
/// `~/.cache/datasetrt`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("DATASETRT_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("datasetrt")
}

/// A URL's object store, made once per process: a child created by `fork()`
/// must not use its parent's connections or runtime threads.
#[derive(Debug)]
pub struct Remote {
    url: String,
    bucket_url: String,
    prefix: ObjectPath,
    options: RemoteOptions,
    client: Mutex<Option<(u32, Arc<dyn ObjectStore>)>>,
}

static RUNTIME: crate::ProcessRuntime = crate::ProcessRuntime::new();

/// The object-store I/O runtime of this process (rebuilt after `fork()`).
fn io_runtime() -> Result<Arc<tokio::runtime::Runtime>> {
    RUNTIME
        .get(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("datasetrt-io")
                .enable_all()
                .build()
        })
        .map_err(|e| Error::invalid(format!("cannot start the I/O runtime: {e}")))
}

/// Run `fut` on the I/O runtime and wait for it from a thread outside it.
pub fn block_on<T: Send + 'static>(fut: impl Future<Output = T> + Send + 'static) -> Result<T> {
    let handle = io_runtime()?.spawn(fut);
    futures::executor::block_on(handle)
        .map_err(|e| Error::internal(format!("object-store task failed: {e}")))
}

/// Spawn `fut` on the I/O runtime.
pub fn spawn<F>(fut: F) -> Result<tokio::task::JoinHandle<F::Output>>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    Ok(io_runtime()?.spawn(fut))
}

/// "250ms", "5s", "2m" or "1h" (humantime's common forms), else `None`.
fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let value: f64 = text[..split].parse().ok()?;
    let unit = match text[split..].trim() {
        "ms" => 0.001,
        "s" | "sec" | "secs" => 1.0,
        "m" | "min" | "mins" => 60.0,
        "h" => 3600.0,
        _ => return None,
    };
    Some(Duration::from_secs_f64(value * unit))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl Remote {
    /// Parse `url` (`s3://bucket/prefix`) and check the options.
    pub fn new(url: &str, options: RemoteOptions) -> Result<Arc<Remote>> {
        let url = url.trim_end_matches('/').to_string();
        let (scheme, rest) = url.split_once("://").expect("a URL");
        if scheme != "s3" {
            return Err(Error::invalid(format!(
                "unsupported URL scheme {scheme:?} in {url:?}: DatasetRT reads s3:// (and \
                 S3-compatible servers through aws_endpoint)"
            )));
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(Error::invalid(format!("no bucket in {url:?}")));
        }
        for (key, _) in &options.storage_options {
            if key.parse::<AmazonS3ConfigKey>().is_err() {
                return Err(Error::invalid(format!(
                    "unknown storage option {key:?} (use object_store's names, e.g. \
                     aws_endpoint, aws_access_key_id, aws_secret_access_key, aws_region, \
                     aws_allow_http, timeout)"
                )));
            }
        }
        if options.requests == 0 {
            return Err(Error::invalid("requests in flight must be positive"));
        }
        Ok(Arc::new(Remote {
            bucket_url: format!("s3://{bucket}"),
            prefix: ObjectPath::from(prefix),
            url,
            options,
            client: Mutex::new(None),
        }))
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn options(&self) -> &RemoteOptions {
        &self.options
    }

    /// Where `build` writes caches before uploading them to this URL: never
    /// a replica directory, so a replica (a cache *of* the bucket, maybe
    /// with holes) is never taken for a source of it.
    pub fn staging_root(&self) -> PathBuf {
        let hash = fnv1a(self.url.as_bytes());
        self.options.cache_dir.join(format!("{hash:016x}-staging"))
    }

    /// The local directory of this URL's replicas: one for replicas that are
    /// never evicted (`whole`: read in place, like local caches) and one for
    /// replicas within a smaller budget (holes punched; read by copying).
    pub fn replica_root_for(&self, whole: bool) -> PathBuf {
        let hash = fnv1a(self.url.as_bytes());
        let name = if whole {
            format!("{hash:016x}")
        } else {
            format!("{hash:016x}-evicting")
        };
        self.options.cache_dir.join(name)
    }

    /// The host's eviction lock (in the evicting replicas' directory): one
    /// process evicts at a time, each seeing what the one before it freed.
    pub fn evict_lock_path(&self) -> PathBuf {
        self.replica_root_for(false).join("evict.lock")
    }

    /// Bytes the evicting replicas of this URL may take on disk: the budget,
    /// plus a page at the edges of each record it holds (records of `mean`
    /// bytes), at most a quarter of the budget (tiny records share pages).
    /// `None`: no budget.
    pub fn disk_limit(&self, mean: u64) -> Option<u64> {
        let budget = self.options.cache_bytes?;
        let slack = (budget / mean.max(1))
            .saturating_mul(PAGE_SLACK)
            .min(budget / 4);
        Some(budget.saturating_add(slack))
    }

    /// Does the budget hold every payload byte of caches `names`?
    pub async fn fits(&self, names: &[String]) -> Result<bool> {
        let Some(budget) = self.options.cache_bytes else {
            return Ok(true);
        };
        let mut total = 0;
        for name in names {
            let object = self.object(&[name, MANIFEST_FILE]);
            let bytes = self
                .get_opt(&object)
                .await?
                .ok_or_else(|| Error::NotFound {
                    what: "cache manifest",
                    path: PathBuf::from(self.object_url(&object)),
                })?;
            let manifest = super::Manifest::decode(Path::new(&self.object_url(&object)), &bytes)?;
            total += manifest.shard_bytes.iter().sum::<u64>();
        }
        Ok(budget >= total)
    }

    /// The longest one request (with its retries) can take: what a reader
    /// waiting for another's fetch waits at most.
    pub fn request_bound(&self) -> Duration {
        let timeout = self
            .options
            .storage_options
            .iter()
            .find(|(k, _)| k == "timeout")
            .and_then(|(_, v)| parse_duration(v))
            .unwrap_or(DEFAULT_TIMEOUT);
        // the first attempt, a last retry started just before RETRY_TIMEOUT
        timeout * 2 + RETRY_TIMEOUT
    }

    /// This process's client.
    pub fn client(&self) -> Result<Arc<dyn ObjectStore>> {
        let pid = std::process::id();
        let mut slot = self.client.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((owner, client)) = slot.as_ref() {
            if *owner == pid {
                return Ok(client.clone());
            }
        }
        let mut builder = AmazonS3Builder::from_env()
            .with_url(&self.bucket_url)
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(50),
                    max_backoff: Duration::from_secs(2),
                    base: 2.0,
                },
                max_retries: 3,
                retry_timeout: RETRY_TIMEOUT,
            })
            .with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                "5s",
            )
            .with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::Timeout),
                format!("{}ms", DEFAULT_TIMEOUT.as_millis()),
            );
        for (key, value) in &self.options.storage_options {
            let key: AmazonS3ConfigKey = key.parse().expect("checked in new()");
            builder = builder.with_config(key, value);
        }
        let client: Arc<dyn ObjectStore> = Arc::new(
            builder
                .build()
                .map_err(|e| Error::invalid(format!("cannot reach {}: {e}", self.url)))?,
        );
        *slot = Some((pid, client.clone()));
        Ok(client)
    }

    /// The object at `parts` below the URL.
    pub fn object(&self, parts: &[&str]) -> ObjectPath {
        let mut path = self.prefix.clone();
        for part in parts {
            path = path.clone().join(*part);
        }
        path
    }

    /// The URL of an object, for errors.
    pub fn object_url(&self, path: &ObjectPath) -> String {
        format!("{}/{}", self.bucket_url, path)
    }

    fn error(
        &self,
        path: &ObjectPath,
        range: Option<&Range<u64>>,
        e: object_store::Error,
    ) -> Error {
        let at = range.map_or(String::new(), |r| format!(" bytes {}..{}", r.start, r.end));
        Error::Remote {
            object: self.object_url(path),
            detail: format!("{at}: {e}").trim_start().to_string(),
        }
    }

    /// The whole object, or `None` if it does not exist.
    pub async fn get_opt(&self, path: &ObjectPath) -> Result<Option<Bytes>> {
        let client = self.client()?;
        match client.get(path).await {
            Ok(r) => r
                .bytes()
                .await
                .map(Some)
                .map_err(|e| self.error(path, None, e)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error(path, None, e)),
        }
    }

    /// Bytes `range` of an object.
    pub async fn get_range(&self, path: &ObjectPath, range: Range<u64>) -> Result<Bytes> {
        let client = self.client()?;
        let bytes = client
            .get_range(path, range.clone())
            .await
            .map_err(|e| self.error(path, Some(&range), e))?;
        if bytes.len() as u64 != range.end - range.start {
            return Err(Error::Remote {
                object: self.object_url(path),
                detail: format!(
                    "bytes {}..{}: the server sent {} bytes",
                    range.start,
                    range.end,
                    bytes.len()
                ),
            });
        }
        Ok(bytes)
    }

    /// Put `bytes`; with `create`, only if no object is there yet
    /// (`Ok(false)` if one is).
    pub async fn put(&self, path: &ObjectPath, bytes: Bytes, create: bool) -> Result<bool> {
        let client = self.client()?;
        let mode = if create {
            PutMode::Create
        } else {
            PutMode::Overwrite
        };
        let opts = PutOptions {
            mode,
            ..Default::default()
        };
        match client.put_opts(path, PutPayload::from(bytes), opts).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(self.error(path, None, e)),
        }
    }

    /// Names of the caches at this URL: the URL itself when it holds a
    /// MANIFEST, else every child prefix that does.
    pub async fn discover(&self) -> Result<Vec<String>> {
        let names = self.list_caches().await?;
        if names.is_empty() {
            return Err(Error::NotFound {
                what: "published cache (no MANIFEST below the URL)",
                path: PathBuf::from(&self.url),
            });
        }
        Ok(names)
    }

    /// Names of the published caches directly below the URL (maybe none).
    pub async fn list_caches(&self) -> Result<Vec<String>> {
        let client = self.client()?;
        let own_manifest = self.object(&[MANIFEST_FILE]);
        match client.head(&own_manifest).await {
            Ok(_) => {
                return Err(Error::invalid(format!(
                    "{} is one cache; open the prefix that holds it (its parent)",
                    self.url
                )))
            }
            Err(object_store::Error::NotFound { .. }) => {}
            // a server that fails here fails the listing too: one wait, not two
            Err(e) => return Err(self.error(&own_manifest, None, e)),
        }
        let listing = client
            .list_with_delimiter(Some(&self.prefix))
            .await
            .map_err(|e| self.error(&self.prefix, None, e))?;
        let mut names = Vec::new();
        for dir in listing.common_prefixes {
            let Some(name) = dir.filename().map(str::to_string) else {
                continue;
            };
            if name.starts_with(['.', '_']) {
                continue;
            }
            match client.head(&dir.clone().join(MANIFEST_FILE)).await {
                Ok(_) => names.push(name),
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.error(&dir, None, e)),
            }
        }
        names.sort();
        Ok(names)
    }

    /// Make the replica of cache `name`: download its manifest, index and
    /// attributes (unless the replica already holds this manifest's), create
    /// its shards as sparse files and fetch their headers. Returns the
    /// replica directory, ready for `Cache::open`.
    pub async fn replicate(&self, name: &str, whole: bool) -> Result<PathBuf> {
        let dir = self.replica_root_for(whole).join(name);
        std::fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
        let manifest_object = self.object(&[name, MANIFEST_FILE]);
        let manifest_bytes =
            self.get_opt(&manifest_object)
                .await?
                .ok_or_else(|| Error::NotFound {
                    what: "cache manifest",
                    path: PathBuf::from(self.object_url(&manifest_object)),
                })?;
        let manifest_path = dir.join(MANIFEST_FILE);
        let manifest = super::Manifest::decode(
            Path::new(&self.object_url(&manifest_object)),
            &manifest_bytes,
        )?;
        let local = std::fs::read(&manifest_path).ok();
        let same = local.as_deref() == Some(&manifest_bytes[..]);
        if local.is_some() && !same {
            // another build under the same name: its fetched ranges are not
            // this one's (a stale byte would fail its checksum anyway)
            let _ = std::fs::remove_file(&manifest_path);
            for i in 0..manifest.shard_bytes.len().max(1024) {
                let shard = dir.join(shard_file_name(i as u32));
                if std::fs::remove_file(&shard).is_err() && i >= manifest.shard_bytes.len() {
                    break;
                }
            }
        }
        if !same {
            // written by rename: a process opening the replica meanwhile
            // sees the old file or the new one, whole
            for file in [INDEX_FILE, ATTRIBUTES_FILE] {
                let bytes = self
                    .get_opt(&self.object(&[name, file]))
                    .await?
                    .ok_or_else(|| Error::NotFound {
                        what: "cache file",
                        path: PathBuf::from(self.object_url(&self.object(&[name, file]))),
                    })?;
                fs::write_atomic(&dir.join(file), &bytes)?;
            }
        }
        for (i, &len) in manifest.shard_bytes.iter().enumerate() {
            let path = dir.join(shard_file_name(i as u32));
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(Error::io(&path))?;
            if file.metadata().map_err(Error::io(&path))?.len() != len {
                file.set_len(len).map_err(Error::io(&path))?;
            }
            let mut header = [0u8; SHARD_HEADER_LEN];
            file.read_exact_at(&mut header, 0)
                .map_err(Error::io(&path))?;
            if header == [0u8; SHARD_HEADER_LEN] && len >= SHARD_HEADER_LEN as u64 {
                let object = self.object(&[name, &shard_file_name(i as u32)]);
                let bytes = self.get_range(&object, 0..SHARD_HEADER_LEN as u64).await?;
                file.write_all_at(&bytes, 0).map_err(Error::io(&path))?;
            }
        }
        if !same {
            fs::write_atomic(&manifest_path, &manifest_bytes)?;
        }
        Ok(dir)
    }

    /// Upload the cache `name` that `build` wrote into the staging root
    /// ([`Remote::publish`]), then keep it as this machine's replica of the
    /// published cache if there is none yet (it holds exactly the uploaded
    /// bytes), or remove it.
    pub async fn publish_staged(&self, name: &str) -> Result<()> {
        let staged = self.staging_root().join(name);
        self.publish(&staged, name).await?;
        let replica = self.replica_root_for(true).join(name);
        let root = self.replica_root_for(true);
        std::fs::create_dir_all(&root).map_err(Error::io(&root))?;
        match std::fs::rename(&staged, &replica) {
            Ok(()) => fs::sync_dir(&root)?,
            // a replica is there already: it syncs itself with the bucket
            Err(_) => std::fs::remove_dir_all(&staged).map_err(Error::io(&staged))?,
        }
        Ok(())
    }

    /// Upload the published local cache `dir` as `<url>/<name>`: data files
    /// first, the MANIFEST last and only if none is there, so a reader never
    /// sees a partial cache. Every record of `dir` is checked against its
    /// index first: a cache with holes (a replica) is refused, never
    /// uploaded. An identical MANIFEST already there is success (a retried
    /// upload); a different one is refused.
    pub async fn publish(&self, dir: &Path, name: &str) -> Result<()> {
        let manifest_path = dir.join(MANIFEST_FILE);
        let manifest_bytes = std::fs::read(&manifest_path).map_err(Error::io(&manifest_path))?;
        let manifest = super::Manifest::decode(&manifest_path, &manifest_bytes)?;
        let manifest_object = self.object(&[name, MANIFEST_FILE]);
        if let Some(there) = self.get_opt(&manifest_object).await? {
            return if there == manifest_bytes {
                Ok(())
            } else {
                Err(Error::invalid(format!(
                    "{} already holds a different cache named {name:?}; pick another name",
                    self.url
                )))
            };
        }
        let local = dir.to_path_buf();
        tokio::task::spawn_blocking(move || super::Cache::open(&local)?.check_records())
            .await
            .map_err(|e| Error::internal(format!("checking the cache to upload failed: {e}")))??;
        let mut files: Vec<String> = vec![INDEX_FILE.into(), ATTRIBUTES_FILE.into()];
        files.extend((0..manifest.shard_bytes.len()).map(|i| shard_file_name(i as u32)));
        let requests = self.options.requests.min(8);
        futures::stream::iter(files)
            .map(|file| async move {
                let path = dir.join(&file);
                let bytes = tokio::task::spawn_blocking({
                    let path = path.clone();
                    move || std::fs::read(&path).map_err(Error::io(&path))
                })
                .await
                .map_err(|e| Error::internal(format!("upload task failed: {e}")))??;
                self.put(&self.object(&[name, &file]), Bytes::from(bytes), false)
                    .await
                    .map(|_| ())
            })
            .buffer_unordered(requests)
            .try_collect::<Vec<()>>()
            .await?;
        if !self
            .put(&manifest_object, Bytes::from(manifest_bytes.clone()), true)
            .await?
        {
            let there = self.get_opt(&manifest_object).await?;
            if there.as_deref() != Some(&manifest_bytes[..]) {
                return Err(Error::invalid(format!(
                    "another writer published a different cache named {name:?} at {} meanwhile",
                    self.url
                )));
            }
        }
        Ok(())
    }
}

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

/// The local, sparse replica of one remote cache's shards.
#[derive(Debug)]
pub struct Replica {
    remote: Arc<Remote>,
    name: String,
    shards: Vec<(ObjectPath, PathBuf, File)>,
    /// Per record: ABSENT, IN_FLIGHT or PRESENT (as far as this process knows).
    state: Vec<AtomicU8>,
    /// Per record: (shard, start, end, crc32c), copied from the index at open.
    spans: Vec<(u32, u64, u64, u32)>,
    /// Bytes of PRESENT records.
    present_bytes: AtomicU64,
    landed: (Mutex<()>, Condvar),
    /// The process whose fetches the IN_FLIGHT states are: a child made by
    /// `fork()` inherits them without the tasks that would finish them.
    owner: AtomicU32,
    /// The budget holds the whole dataset: fetched in whole chunks, never
    /// evicted, read in place.
    whole: bool,
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
    /// over its index `entries`.
    pub fn open(
        remote: Arc<Remote>,
        name: &str,
        dir: &Path,
        shard_count: usize,
        entries: impl Iterator<Item = IndexEntry>,
        whole: bool,
    ) -> Result<Replica> {
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
        let spans: Vec<(u32, u64, u64, u32)> = entries
            .map(|e| {
                (
                    e.shard,
                    e.offset,
                    e.offset + e.stored_len as u64,
                    e.checksum,
                )
            })
            .collect();
        let counts = Counters::new(&remote.replica_root_for(whole).join("counts").join(name));
        Ok(Replica {
            state: spans.iter().map(|_| AtomicU8::new(ABSENT)).collect(),
            spans,
            remote,
            name: name.to_string(),
            shards,
            present_bytes: AtomicU64::new(0),
            landed: (Mutex::new(()), Condvar::new()),
            owner: AtomicU32::new(std::process::id()),
            whole,
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
        self.spans.len() as u64
    }

    /// Stored bytes of record `sample`.
    pub fn record_bytes(&self, sample: u64) -> u64 {
        let (_, start, end, _) = self.spans[sample as usize];
        end - start
    }

    /// Stored bytes of every record.
    pub fn total_bytes(&self) -> u64 {
        self.spans.iter().map(|s| s.2 - s.1).sum()
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
        for (s, &(shard, start, end, _)) in self.spans.iter().enumerate() {
            let Some(data) = &extents[shard as usize] else {
                continue; // unreadable: this process's own view stays
            };
            let i = data.partition_point(|e| e.end <= start);
            let on_disk = data
                .get(i)
                .is_some_and(|e| e.start <= start && end <= e.end);
            if on_disk {
                self.move_state(s as u64, ABSENT, PRESENT);
            } else {
                self.move_state(s as u64, PRESENT, ABSENT);
            }
        }
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
                let (first, end) = self.chunk_of(s);
                if wanted.last().is_some_and(|&w| w >= first) {
                    continue;
                }
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
            let (shard, start, end, _) = self.spans[s as usize];
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
    /// at or before it.
    fn chunk_of(&self, sample: u64) -> (u64, u64) {
        let (shard, start, _, _) = self.spans[sample as usize];
        let chunk = (start - SHARD_HEADER_LEN as u64) / CHUNK_BYTES;
        let lo = chunk * CHUNK_BYTES + SHARD_HEADER_LEN as u64;
        let hi = lo + CHUNK_BYTES;
        // records of a shard are consecutive samples at increasing offsets
        let mut first = sample;
        while first > 0 && {
            let (sh, st, _, _) = self.spans[first as usize - 1];
            sh == shard && st >= lo
        } {
            first -= 1;
        }
        let mut end = sample + 1;
        while (end as usize) < self.spans.len() && {
            let (sh, st, _, _) = self.spans[end as usize];
            sh == shard && st < hi
        } {
            end += 1;
        }
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
            let (_, start, end, crc) = self.spans[s as usize];
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
            let (_, start, end, crc) = self.spans[s as usize];
            crc32c(&bytes[(start - r.range.start) as usize..(end - r.range.start) as usize]) == crc
        }))
    }

    /// Copy record `sample`'s stored bytes into `out` (its stored length) and
    /// verify them there; fetch it (or wait for the fetch in flight) when the
    /// replica does not hold it. `checksum` is the index entry's CRC.
    pub fn read(self: &Arc<Self>, sample: u64, checksum: u32, out: &mut [u8]) -> Result<()> {
        let (shard, start, _, _) = self.spans[sample as usize];
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
                let guard = self.landed.0.lock().unwrap_or_else(|p| p.into_inner());
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
        let (shard, start, ..) = self.spans[sample as usize];
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
        if self.whole {
            return;
        }
        let mean = (self.total_bytes() / self.records().max(1)).max(1);
        let Some(limit) = self.remote.disk_limit(mean) else {
            return;
        };
        let mut fetched = self.read_fetched.lock().unwrap_or_else(|p| p.into_inner());
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
        let (shard, start, end, _) = self.spans[sample as usize];
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
        let _guard = self.landed.0.lock().unwrap_or_else(|p| p.into_inner());
        self.landed.1.notify_all();
    }

    /// Drop record `sample` from the replica: its pages that no record this
    /// process holds shares are punched out of the sparse shard.
    pub fn evict(&self, sample: u64) {
        if !self.move_state(sample, PRESENT, ABSENT) {
            return;
        }
        let (shard, start, end, _) = self.spans[sample as usize];
        self.counts.add(EVICTED, end - start);
        const PAGE: u64 = 4096;
        let mut lo = start / PAGE * PAGE;
        let mut hi = end.div_ceil(PAGE) * PAGE;
        // a neighbour this process holds keeps the page they share
        let held = |s: u64| {
            self.spans
                .get(s as usize)
                .is_some_and(|&(sh, ..)| sh == shard)
                && self.state[s as usize].load(Ordering::Acquire) != ABSENT
        };
        let mut s = sample;
        while s > 0 && self.spans[s as usize - 1].0 == shard && self.spans[s as usize - 1].2 > lo {
            s -= 1;
            if held(s) {
                lo += PAGE;
                break;
            }
        }
        let mut s = sample + 1;
        while (s as usize) < self.spans.len()
            && self.spans[s as usize].0 == shard
            && self.spans[s as usize].1 < hi
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

/// An exclusive lock on bytes of a replica file, shared by nobody else on
/// this machine: an open-file-description lock, released when dropped, and
/// by the kernel if the process dies.
struct RangeLock {
    file: File,
    range: Range<u64>,
}

impl RangeLock {
    fn acquire(file: File, path: &Path, range: Range<u64>) -> Result<RangeLock> {
        Self::fcntl(
            &file,
            libc::F_WRLCK as libc::c_short,
            &range,
            libc::F_OFD_SETLKW,
        )
        .map_err(Error::io(path))?;
        Ok(RangeLock { file, range })
    }

    fn fcntl(
        file: &File,
        kind: libc::c_short,
        range: &Range<u64>,
        cmd: libc::c_int,
    ) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: a zeroed flock is valid; the fields set are the documented ones.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = kind;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        lock.l_start = range.start as libc::off_t;
        lock.l_len = (range.end - range.start) as libc::off_t;
        loop {
            // SAFETY: fcntl with a lock command and a valid flock pointer.
            let rc = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut lock) };
            if rc == 0 {
                return Ok(());
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

impl Drop for RangeLock {
    fn drop(&mut self) {
        let _ = Self::fcntl(
            &self.file,
            libc::F_UNLCK as libc::c_short,
            &self.range,
            libc::F_OFD_SETLK,
        );
    }
}

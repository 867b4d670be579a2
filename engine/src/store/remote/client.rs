//! The object store of a URL: options, one client per process (made anew
//! after `fork()`), requests with time limits and bounded retries, listing
//! the caches under a prefix, and where this URL's local directories lie.

use std::future::Future;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientConfigKey, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    RetryConfig,
};

use super::PAGE_SLACK;
use crate::store::format::MANIFEST_FILE;
use crate::Unpoison;
use crate::{Error, Result};

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
    pub(super) url: String,
    bucket_url: String,
    pub(super) prefix: ObjectPath,
    pub(super) options: RemoteOptions,
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
            let manifest =
                crate::store::Manifest::decode(Path::new(&self.object_url(&object)), &bytes)?;
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
        let mut slot = self.client.lock().unpoisoned();
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

    pub(super) fn error(
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

    /// Download object `path` into the file `dest` as it arrives (never
    /// whole in memory: an index of 10^9 records is 32 GB), published
    /// atomically (a temporary sibling, fsync, rename). `Ok(false)`: there
    /// is no such object.
    pub async fn get_to_file(&self, path: &ObjectPath, dest: &Path) -> Result<bool> {
        use futures::StreamExt;
        use std::io::Write;
        let client = self.client()?;
        let mut stream = match client.get(path).await {
            Ok(r) => r.into_stream(),
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(self.error(path, None, e)),
        };
        let tmp = crate::store::fs::temp_sibling(dest);
        let written = async {
            let mut file = std::io::BufWriter::with_capacity(
                1 << 20,
                std::fs::File::create(&tmp).map_err(Error::io(&tmp))?,
            );
            while let Some(piece) = stream.next().await {
                let piece = piece.map_err(|e| self.error(path, None, e))?;
                file.write_all(&piece).map_err(Error::io(&tmp))?;
            }
            let file = file
                .into_inner()
                .map_err(|e| Error::io(&tmp)(e.into_error()))?;
            file.sync_all().map_err(Error::io(&tmp))?;
            std::fs::rename(&tmp, dest).map_err(Error::io(dest))
        }
        .await;
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written?;
        crate::store::fs::sync_dir(dest.parent().unwrap_or(Path::new(".")))?;
        Ok(true)
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
}

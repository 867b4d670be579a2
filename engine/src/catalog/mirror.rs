//! The snapshots of a dataset whose caches are in a bucket live in the bucket
//! too, under `<url>/_snapshots/<key>/`, file for file as in a local snapshot
//! directory; each process works on a local copy (in its replica directory).
//!
//! The commit protocol (`commit`) maps onto the object store's conditional
//! writes: a snapshot manifest is uploaded with `PutMode::Create` (a number
//! another writer took is refused, never overwritten) and the head with
//! `PutMode::Update` at the version this process last read (or `Create` when
//! there is none), so a head another writer moved is a [`Error::Conflict`],
//! not a lost update. Column files are content-addressed: uploading one twice
//! writes the same bytes. Every commit first brings the local copy up to the
//! bucket's head ([`Mirror::pull`]), under the local commit lock.

use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};

use super::commit;
use super::snapshot::{self, Snapshot};
use crate::store::fs;
use crate::store::remote::{block_on, Remote};
use crate::Unpoison;
use crate::{Error, Result};

/// Folder of a bucket's snapshot directories.
pub const REMOTE_SNAPSHOTS: &str = "_snapshots";

#[derive(Debug)]
pub struct Mirror {
    remote: Arc<Remote>,
    key: String,
    /// The bucket's head as this process last read or wrote it.
    head: Mutex<Option<UpdateVersion>>,
}

/// The object of snapshot file `rel` (a path relative to the snapshot
/// directory) of the snapshots under `key`.
fn snapshot_object(remote: &Remote, key: &str, rel: &str) -> ObjectPath {
    let mut parts = vec![REMOTE_SNAPSHOTS, key];
    parts.extend(rel.split('/'));
    remote.object(&parts)
}

/// The whole object `rel` of the snapshots under `key`, which must exist.
async fn get(remote: &Remote, key: &str, rel: &str) -> Result<bytes::Bytes> {
    let object = snapshot_object(remote, key, rel);
    remote
        .get_opt(&object)
        .await?
        .ok_or_else(|| Error::NotFound {
            what: "snapshot file in the bucket",
            path: remote.object_url(&object).into(),
        })
}

/// Download snapshot file `rel` into `dir` (streamed to disk, published by
/// atomic rename).
async fn fetch(remote: &Remote, key: &str, dir: &Path, rel: &str) -> Result<()> {
    let local = dir.join(rel);
    if let Some(parent) = local.parent() {
        std::fs::create_dir_all(parent).map_err(Error::io(parent))?;
    }
    let object = snapshot_object(remote, key, rel);
    if remote.get_to_file(&object, &local).await? {
        Ok(())
    } else {
        Err(Error::NotFound {
            what: "snapshot file in the bucket",
            path: remote.object_url(&object).into(),
        })
    }
}

/// The error of a request for `object` that failed.
fn request_failed(remote: &Remote, object: &ObjectPath, e: object_store::Error) -> Error {
    Error::Remote {
        object: remote.object_url(object),
        detail: e.to_string(),
    }
}

/// The bucket's head record (`head_object`) and its version, if it has one.
async fn read_head(
    remote: &Remote,
    client: &Arc<dyn object_store::ObjectStore>,
    head_object: &ObjectPath,
) -> Result<Option<(Bytes, UpdateVersion)>> {
    match client.get(head_object).await {
        Ok(got) => {
            let version = UpdateVersion {
                e_tag: got.meta.e_tag.clone(),
                version: got.meta.version.clone(),
            };
            let bytes = got
                .bytes()
                .await
                .map_err(|e| request_failed(remote, head_object, e))?;
            Ok(Some((bytes, version)))
        }
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(request_failed(remote, head_object, e)),
    }
}

/// Bring into `dir` each `listed` snapshot file (under `base`) it lacks,
/// but the head and the tags: those are adopted once what they name is
/// here. The tags, as (record, its bytes, the snapshot it names).
async fn pull_listed(
    remote: &Remote,
    key: &str,
    dir: &Path,
    base: &ObjectPath,
    listed: Vec<object_store::ObjectMeta>,
) -> Result<Vec<(String, Bytes, u64)>> {
    let mut tags = Vec::new();
    for meta in listed {
        let Some(parts) = meta.location.prefix_match(base) else {
            continue;
        };
        let rel: Vec<String> = parts.map(|p| p.as_ref().to_string()).collect();
        let rel = rel.join("/");
        if rel == commit::HEAD_FILE {
            continue; // read first, with its version (`read_head`)
        }
        if rel.starts_with("tags/") {
            let bytes = get(remote, key, &rel).await?;
            let number = commit::parse_tag(Path::new(&rel), &bytes)?;
            tags.push((rel, bytes, number));
        } else if !dir.join(&rel).exists() {
            fetch(remote, key, dir, &rel).await?; // manifests and columns never change
        }
    }
    Ok(tags)
}

/// Write record `rel` (`bytes`, naming snapshot `number`) into `dir`, unless
/// it holds it already, once the snapshot it names and that snapshot's
/// column files are here (fetched by name if missing) and verified.
async fn adopt_record(
    remote: &Remote,
    key: &str,
    dir: &Path,
    rel: &str,
    bytes: &[u8],
    number: u64,
) -> Result<()> {
    let local = dir.join(rel);
    if std::fs::read(&local).ok().as_deref() != Some(bytes) {
        let manifest = Snapshot::file_name(number);
        let mut fetched = !dir.join(&manifest).exists();
        if fetched {
            fetch(remote, key, dir, &manifest).await?;
        }
        for hash in snapshot::manifest_columns(dir, number)? {
            let column = format!("{}/{hash}.arrow", snapshot::COLUMNS_DIR);
            if !dir.join(&column).exists() {
                fetch(remote, key, dir, &column).await?;
                fetched = true;
            }
        }
        if fetched {
            if let Some(e) = snapshot::verify_files(dir, number, None).into_iter().next() {
                return Err(e);
            }
            // chunk tables are made here, not fetched: readers
            // then check the columns chunk by chunk
            snapshot::ensure_sidecars(dir, number)?;
        }
        if let Some(parent) = local.parent() {
            std::fs::create_dir_all(parent).map_err(Error::io(parent))?;
        }
        fs::write_atomic(&local, bytes)?;
    }
    Ok(())
}

impl Mirror {
    pub fn new(remote: Arc<Remote>, key: &str) -> Mirror {
        Mirror {
            remote,
            key: key.to_string(),
            head: Mutex::new(None),
        }
    }

    fn base(&self) -> ObjectPath {
        self.remote.object(&[REMOTE_SNAPSHOTS, &self.key])
    }

    fn object(&self, rel: &str) -> ObjectPath {
        snapshot_object(&self.remote, &self.key, rel)
    }

    /// Where errors say the snapshots are.
    pub fn url(&self) -> String {
        self.remote.object_url(&self.base())
    }

    /// Bring into `dir` every snapshot file of the bucket it lacks, the tags
    /// and the head (whose version later commits are conditional on), as a
    /// consistent cut while other machines commit: the head is read first
    /// (everything it names was uploaded before it moved), and adopted —
    /// written into `dir` — only once the snapshot it names and that
    /// snapshot's column files are here and verified. A tag is adopted the
    /// same way.
    pub fn pull(&self, dir: &Path) -> Result<()> {
        let (remote, key) = (self.remote.clone(), self.key.clone());
        let base = self.base();
        let head_object = self.object(commit::HEAD_FILE);
        let dir = dir.to_path_buf();
        let version = block_on(async move {
            let client = remote.client()?;
            // the head first (with its version): a commit uploads its
            // snapshot before moving it
            let head = read_head(&remote, &client, &head_object).await?;
            let listed: Vec<object_store::ObjectMeta> = client
                .list(Some(&base))
                .try_collect()
                .await
                .map_err(|e| request_failed(&remote, &base, e))?;
            // (local record, its bytes, the snapshot it names, the head's version)
            let mut adopt = Vec::new();
            if let Some((bytes, version)) = head {
                let number = commit::parse_head(&bytes).ok_or_else(|| {
                    Error::corrupt(remote.object_url(&head_object), "unreadable head record")
                })?;
                adopt.push((commit::HEAD_FILE.to_string(), bytes, number, Some(version)));
            }
            for (rel, bytes, number) in pull_listed(&remote, &key, &dir, &base, listed).await? {
                adopt.push((rel, bytes, number, None));
            }
            // a record is adopted once what it names is here (fetched by name
            // should the listing have missed it) and verified
            let mut head_version = None;
            for (rel, bytes, number, version) in adopt {
                adopt_record(&remote, &key, &dir, &rel, &bytes, number).await?;
                head_version = head_version.or(version);
            }
            Ok::<_, Error>(head_version)
        })??;
        *self.head.lock().unpoisoned() = version;
        Ok(())
    }

    /// Upload snapshot `number` of `dir` (its columns, then its manifest,
    /// created only if absent) and move the bucket's head to it from the
    /// version last pulled. `base` is the head the commit was derived from,
    /// for the conflict error.
    pub fn push_commit(&self, dir: &Path, number: u64, base: u64) -> Result<()> {
        let mut files: Vec<String> = snapshot::manifest_columns(dir, number)?
            .into_iter()
            .map(|hash| format!("{}/{hash}.arrow", snapshot::COLUMNS_DIR))
            .collect();
        files.sort();
        files.dedup();
        for rel in &files {
            self.put(dir, rel, PutMode::Overwrite)?;
        }
        let manifest = Snapshot::file_name(number);
        if !self.put(dir, &manifest, PutMode::Create)? {
            return Err(self.conflict(base));
        }
        self.push_head(dir, base)
    }

    /// Move the bucket's head to what `dir`'s head names, conditional on the
    /// version last pulled.
    pub fn push_head(&self, dir: &Path, base: u64) -> Result<()> {
        let mode = match self.head.lock().unpoisoned().clone() {
            Some(v) => PutMode::Update(v),
            None => PutMode::Create,
        };
        if !self.put(dir, commit::HEAD_FILE, mode)? {
            return Err(self.conflict(base));
        }
        Ok(())
    }

    /// Upload tag `name` of `dir`.
    pub fn push_tag(&self, dir: &Path, name: &str) -> Result<()> {
        self.put(
            dir,
            &format!("{}/{name}", super::TAGS_DIR),
            PutMode::Overwrite,
        )
        .map(|_| ())
    }

    /// Delete snapshot files (paths relative to the snapshot directory) from
    /// the bucket; ones already gone are fine.
    pub fn delete(&self, rels: &[String]) -> Result<()> {
        for rel in rels {
            let remote = self.remote.clone();
            let object = self.object(rel);
            block_on(async move {
                match remote.client()?.delete(&object).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(e) => Err(Error::Remote {
                        object: remote.object_url(&object),
                        detail: e.to_string(),
                    }),
                }
            })??;
        }
        Ok(())
    }

    /// The conflict another writer's commit caused: its head, as the bucket says.
    fn conflict(&self, base: u64) -> Error {
        let head = block_on({
            let remote = self.remote.clone();
            let path = self.object(commit::HEAD_FILE);
            async move { remote.get_opt(&path).await }
        })
        .ok()
        .and_then(|r| r.ok().flatten())
        .and_then(|raw| commit::parse_head(&raw))
        .unwrap_or(base);
        Error::Conflict {
            dir: self.url().into(),
            base,
            head,
        }
    }

    /// Put `dir/rel`; `Ok(false)` when the mode's condition does not hold.
    fn put(&self, dir: &Path, rel: &str, mode: PutMode) -> Result<bool> {
        let path = dir.join(rel);
        let bytes = std::fs::read(&path).map_err(Error::io(&path))?;
        let remote = self.remote.clone();
        let object = self.object(rel);
        let is_head = rel == commit::HEAD_FILE;
        let result = block_on(async move {
            let client = remote.client()?;
            let opts = PutOptions {
                mode,
                ..Default::default()
            };
            match client
                .put_opts(&object, PutPayload::from(Bytes::from(bytes)), opts)
                .await
            {
                Ok(done) => Ok(Some(UpdateVersion {
                    e_tag: done.e_tag,
                    version: done.version,
                })),
                Err(object_store::Error::AlreadyExists { .. })
                | Err(object_store::Error::Precondition { .. }) => Ok(None),
                Err(e) => Err(Error::Remote {
                    object: remote.object_url(&object),
                    detail: e.to_string(),
                }),
            }
        })??;
        match result {
            Some(version) => {
                if is_head {
                    *self.head.lock().unpoisoned() = Some(version);
                }
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

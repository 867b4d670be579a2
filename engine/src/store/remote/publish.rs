//! Uploading a cache `build` wrote: from its staging directory only (never a
//! replica), every record checked against its index first, the MANIFEST
//! last, so a reader never sees a cache without all its files.

use std::path::Path;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use super::Remote;
use crate::store::format::{shard_file_name, ATTRIBUTES_FILE, INDEX_FILE, MANIFEST_FILE};
use crate::store::fs;
use crate::{Error, Result};

impl Remote {
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
        let manifest = crate::store::Manifest::decode(&manifest_path, &manifest_bytes)?;
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
        tokio::task::spawn_blocking(move || crate::store::Cache::open(&local)?.check_records())
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

//! Making a local replica of a cache in the bucket: its metadata files whole
//! (streamed to disk), its shards as sparse files the reads fill
//! ([`super::Replica`]).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::Remote;
use crate::store::checksum::crc32c;
use crate::store::chunks::{self, ChunkTable};
use crate::store::format::{
    shard_file_name, ATTRIBUTES_FILE, INDEX_FILE, INDEX_HEADER_LEN, MANIFEST_FILE, SHARD_HEADER_LEN,
};
use crate::store::fs;
use crate::store::host::records;
use crate::{Error, Result};

impl Remote {
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
        let manifest = crate::store::Manifest::decode(
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
                let object = self.object(&[name, file]);
                if !self.get_to_file(&object, &dir.join(file)).await? {
                    return Err(Error::NotFound {
                        what: "cache file",
                        path: PathBuf::from(self.object_url(&object)),
                    });
                }
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
        chunk_tables(&dir, &manifest, !same);
        if !same {
            fs::write_atomic(&manifest_path, &manifest_bytes)?;
        }
        Ok(dir)
    }
}

/// Give the replica's index and attributes the chunk tables the bucket
/// does not keep, made from the files as downloaded, when they match the
/// manifest: then every process checks the chunks it reads once per host,
/// as for a local cache, instead of each one the whole index at open (32
/// GB at 10^9 records). Made when the files were just downloaded
/// (`fresh`), or for a replica made before the tables; otherwise the
/// reader checks the table it finds against the manifest. Best effort: a
/// file without its table is checked whole (and a damaged one fails there,
/// named).
fn chunk_tables(dir: &Path, manifest: &crate::store::Manifest, fresh: bool) {
    let wanted = |file: &Path| fresh || !ChunkTable::sidecar(file).exists();
    let index = dir.join(INDEX_FILE);
    let entries = wanted(&index)
        .then(|| fs::map_file(&index, "cache index").ok())
        .flatten();
    if let Some(entries) = entries.as_ref().and_then(|m| m.get(INDEX_HEADER_LEN..)) {
        if crc32c(entries) == manifest.index_crc32c {
            let table = ChunkTable {
                file_len: entries.len() as u64,
                file_crc: manifest.index_crc32c,
                crcs: chunks::chunk_crcs(entries),
            };
            if table.write_sidecar(&index).is_ok() {
                records::record_checked(&index, table.crcs.len());
            }
        }
    }
    let attributes = dir.join(ATTRIBUTES_FILE);
    let (len, crc) = (manifest.attributes_bytes, manifest.attributes_crc32c);
    if wanted(&attributes) {
        if let Ok(table) = ChunkTable::of_file(&attributes) {
            if (table.file_len, table.file_crc) == (len, crc)
                && table.write_sidecar(&attributes).is_ok()
            {
                records::record_checked(&attributes, table.crcs.len());
            }
        }
    }
}

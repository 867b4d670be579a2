//! The cache manifest: a small, versioned, self-checksummed text file.
//!
//! ```text
//! datasetrt-cache 1
//! name=digits-v1
//! cache_id=4242424242
//! records=1797
//! codec=zstd
//! shards=1
//! shard_bytes=812345
//! index_crc32c=1a2b3c4d
//! attributes_bytes=40960
//! attributes_crc32c=5e6f7a8b
//! created_unix_ms=1796000000000
//! checksum=89abcdef
//! ```
//!
//! `shard_bytes` lists each shard's length, comma-separated. `checksum` is the
//! crc32c of every byte before the `checksum=` line.

use std::collections::HashMap;
use std::path::Path;

use super::checksum::{open_sealed_text, seal_text};
use super::codec::Codec;
use super::format::FORMAT_VERSION;
use crate::{Error, Result};

const HEADER: &str = "datasetrt-cache";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub name: String,
    pub cache_id: i64,
    pub records: u64,
    pub codec: Codec,
    pub shard_bytes: Vec<u64>,
    pub index_crc32c: u32,
    pub attributes_bytes: u64,
    pub attributes_crc32c: u32,
    pub created_unix_ms: u64,
}

impl Manifest {
    pub fn encode(&self) -> String {
        let shards: Vec<String> = self.shard_bytes.iter().map(u64::to_string).collect();
        let body = format!(
            "{HEADER} {FORMAT_VERSION}\nname={}\ncache_id={}\nrecords={}\ncodec={}\nshards={}\n\
             shard_bytes={}\nindex_crc32c={:08x}\nattributes_bytes={}\nattributes_crc32c={:08x}\n\
             created_unix_ms={}\n",
            self.name,
            self.cache_id,
            self.records,
            self.codec.name(),
            self.shard_bytes.len(),
            shards.join(","),
            self.index_crc32c,
            self.attributes_bytes,
            self.attributes_crc32c,
            self.created_unix_ms,
        );
        seal_text(&body)
    }

    pub fn decode(path: &Path, text: &[u8]) -> Result<Manifest> {
        let bad = |detail: String| Error::corrupt(path, detail);
        let (_, body) = open_sealed_text(
            path,
            text,
            HEADER,
            FORMAT_VERSION..=FORMAT_VERSION,
            "manifest",
        )?;
        let fields: HashMap<&str, &str> = body
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once('='))
            .collect();
        let get = |k: &str| {
            fields
                .get(k)
                .copied()
                .ok_or_else(|| bad(format!("manifest has no {k:?} field")))
        };
        let num = |k: &str| -> Result<u64> {
            get(k)?
                .parse::<u64>()
                .map_err(|_| bad(format!("manifest field {k:?} is not a number")))
        };
        let hex = |k: &str| -> Result<u32> {
            u32::from_str_radix(get(k)?, 16)
                .map_err(|_| bad(format!("manifest field {k:?} is not hex")))
        };
        let shard_bytes: Vec<u64> = match get("shard_bytes")? {
            "" => Vec::new(),
            list => list
                .split(',')
                .map(|s| s.parse::<u64>())
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| {
                    bad("manifest field \"shard_bytes\" is not a list of numbers".into())
                })?,
        };
        if shard_bytes.len() as u64 != num("shards")? {
            return Err(bad("manifest shard count does not match shard_bytes".into()));
        }
        let codec = Codec::parse(get("codec")?).map_err(|e| bad(e.to_string()))?;
        Ok(Manifest {
            name: get("name")?.to_string(),
            cache_id: get("cache_id")?
                .parse()
                .map_err(|_| bad("manifest field \"cache_id\" is not a number".into()))?,
            records: num("records")?,
            codec,
            shard_bytes,
            index_crc32c: hex("index_crc32c")?,
            attributes_bytes: num("attributes_bytes")?,
            attributes_crc32c: hex("attributes_crc32c")?,
            created_unix_ms: num("created_unix_ms")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            name: "digits-v1".into(),
            cache_id: 42,
            records: 3,
            codec: Codec::Zstd,
            shard_bytes: vec![100, 200],
            index_crc32c: 0xabcdef01,
            attributes_bytes: 999,
            attributes_crc32c: 7,
            created_unix_ms: 1,
        }
    }

    #[test]
    fn manifest_round_trips() {
        let m = sample();
        assert_eq!(
            Manifest::decode(Path::new("M"), m.encode().as_bytes()).unwrap(),
            m
        );
    }

    #[test]
    fn edited_manifest_is_corrupt_and_future_version_unsupported() {
        let text = sample().encode().replace("records=3", "records=4");
        let err = Manifest::decode(Path::new("M"), text.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("checksum mismatch"), "{err}");
        let text = sample()
            .encode()
            .replace("datasetrt-cache 1", "datasetrt-cache 9");
        assert!(matches!(
            Manifest::decode(Path::new("M"), text.as_bytes()).unwrap_err(),
            Error::UnsupportedVersion { found: 9, .. }
        ));
    }
}

//! Binary layouts of the index and the shards (little-endian throughout).
//! `docs/FORMAT.md` is the prose version of this file; keep them in step.

use std::path::Path;

use super::checksum::{check_magic, crc32c, header_version, unseal_bytes};
use super::codec::Codec;
use crate::{Error, Result};

/// Version of the index and shard layouts this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

pub const INDEX_MAGIC: [u8; 8] = *b"DRTINDEX";
pub const INDEX_HEADER_LEN: usize = 32;
pub const INDEX_ENTRY_LEN: usize = 32;

pub const SHARD_MAGIC: [u8; 8] = *b"DRTSHARD";
pub const SHARD_HEADER_LEN: usize = 16;

pub const INDEX_FILE: &str = "index.drti";
pub const ATTRIBUTES_FILE: &str = "attributes.arrow";
pub const MANIFEST_FILE: &str = "MANIFEST";

pub fn shard_file_name(shard: u32) -> String {
    format!("shard-{shard:05}.drts")
}

/// One record's address and integrity data: 32 bytes on disk.
///
/// | bytes | field        | meaning                                    |
/// |-------|--------------|--------------------------------------------|
/// | 0..8  | `offset`     | byte offset of the record in its shard     |
/// | 8..12 | `shard`      | shard number                               |
/// | 12..16| `stored_len` | bytes on disk                              |
/// | 16..20| `raw_len`    | bytes after decoding                       |
/// | 20..24| `checksum`   | crc32c of the stored bytes                 |
/// | 24    | `codec`      | 0 none, 1 zstd, 2 lz4                      |
/// | 25..32| reserved     | zero                                       |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub offset: u64,
    pub shard: u32,
    pub stored_len: u32,
    pub raw_len: u32,
    pub checksum: u32,
    pub codec: Codec,
}

impl IndexEntry {
    pub fn encode(&self) -> [u8; INDEX_ENTRY_LEN] {
        let mut b = [0u8; INDEX_ENTRY_LEN];
        b[0..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..12].copy_from_slice(&self.shard.to_le_bytes());
        b[12..16].copy_from_slice(&self.stored_len.to_le_bytes());
        b[16..20].copy_from_slice(&self.raw_len.to_le_bytes());
        b[20..24].copy_from_slice(&self.checksum.to_le_bytes());
        b[24] = self.codec as u8;
        b
    }

    /// Decode one entry; `Err` carries a description of what is wrong.
    pub fn decode(b: &[u8]) -> std::result::Result<IndexEntry, String> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let codec =
            Codec::from_flag(b[24]).ok_or_else(|| format!("unknown codec flag {}", b[24]))?;
        if b[25..32].iter().any(|&x| x != 0) {
            return Err("reserved bytes are not zero".into());
        }
        Ok(IndexEntry {
            offset: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            shard: u32_at(8),
            stored_len: u32_at(12),
            raw_len: u32_at(16),
            checksum: u32_at(20),
            codec,
        })
    }
}

/// The 32-byte index header.
///
/// | bytes | field                                   |
/// |-------|-----------------------------------------|
/// | 0..8  | magic `DRTINDEX`                        |
/// | 8..12 | format version                          |
/// | 12..16| entry length (32)                       |
/// | 16..24| record count                            |
/// | 24..28| crc32c of all entry bytes               |
/// | 28..32| crc32c of header bytes 0..28            |
pub fn encode_index_header(count: u64, entries_crc: u32) -> [u8; INDEX_HEADER_LEN] {
    let mut h = [0u8; INDEX_HEADER_LEN];
    h[0..8].copy_from_slice(&INDEX_MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(INDEX_ENTRY_LEN as u32).to_le_bytes());
    h[16..24].copy_from_slice(&count.to_le_bytes());
    h[24..28].copy_from_slice(&entries_crc.to_le_bytes());
    let crc = crc32c(&h[0..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes()); // as seal_bytes appends it
    h
}

/// Check an index file mapped as `bytes`; returns the record count.
pub fn check_index(path: &Path, bytes: &[u8]) -> Result<u64> {
    let (count, entries_crc) = check_index_header(path, bytes)?;
    if crc32c(&bytes[INDEX_HEADER_LEN..]) != entries_crc {
        return Err(Error::corrupt(path, "index entries checksum mismatch"));
    }
    Ok(count)
}

/// Check an index file's header and length, not its entries: returns the
/// record count and the CRC-32C its entries must have.
pub fn check_index_header(path: &Path, bytes: &[u8]) -> Result<(u64, u32)> {
    if bytes.len() < INDEX_HEADER_LEN {
        return Err(Error::corrupt(
            path,
            format!("index is {} bytes, shorter than its header", bytes.len()),
        ));
    }
    let h = &bytes[..INDEX_HEADER_LEN];
    check_magic(path, h, &INDEX_MAGIC, "index")?;
    if let Err(why) = unseal_bytes(h) {
        return Err(Error::corrupt(path, format!("index header {why}")));
    }
    header_version(path, h, FORMAT_VERSION..=FORMAT_VERSION)?;
    let entry_len = u32::from_le_bytes(h[12..16].try_into().expect("4 bytes")) as usize;
    if entry_len != INDEX_ENTRY_LEN {
        return Err(Error::corrupt(
            path,
            format!("entry length {entry_len}, expected {INDEX_ENTRY_LEN}"),
        ));
    }
    let count = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
    let expected =
        (INDEX_HEADER_LEN as u64).saturating_add(count.saturating_mul(INDEX_ENTRY_LEN as u64));
    if bytes.len() as u64 != expected {
        return Err(Error::corrupt(
            path,
            format!(
                "index is {} bytes, header promises {expected} ({count} records)",
                bytes.len()
            ),
        ));
    }
    let entries_crc = u32::from_le_bytes(h[24..28].try_into().expect("4 bytes"));
    Ok((count, entries_crc))
}

/// The 16-byte shard header: magic `DRTSHARD`, format version, shard number.
pub fn encode_shard_header(shard: u32) -> [u8; SHARD_HEADER_LEN] {
    let mut h = [0u8; SHARD_HEADER_LEN];
    h[0..8].copy_from_slice(&SHARD_MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&shard.to_le_bytes());
    h
}

pub fn check_shard_header(path: &Path, bytes: &[u8], shard: u32) -> Result<()> {
    let bytes = bytes.get(..SHARD_HEADER_LEN).unwrap_or_default();
    check_magic(path, bytes, &SHARD_MAGIC, "shard")?;
    header_version(path, bytes, FORMAT_VERSION..=FORMAT_VERSION)?;
    let number = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
    if number != shard {
        return Err(Error::corrupt(
            path,
            format!("shard header says shard {number}, expected {shard}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_entry_round_trips() {
        let e = IndexEntry {
            offset: 1 << 40,
            shard: 7,
            stored_len: 123,
            raw_len: 456,
            checksum: 0xdead_beef,
            codec: Codec::Lz4,
        };
        assert_eq!(IndexEntry::decode(&e.encode()).unwrap(), e);
    }

    #[test]
    fn index_checks_catch_truncation_flips_and_versions() {
        let entry = IndexEntry {
            offset: 16,
            shard: 0,
            stored_len: 3,
            raw_len: 3,
            checksum: 1,
            codec: Codec::None,
        }
        .encode();
        let mut file = encode_index_header(1, crc32c(&entry)).to_vec();
        file.extend_from_slice(&entry);
        let p = Path::new("index.drti");
        assert_eq!(check_index(p, &file).unwrap(), 1);

        let err = check_index(p, &file[..file.len() - 1]).unwrap_err();
        assert!(err.to_string().contains("header promises"), "{err}");

        let mut flipped = file.clone();
        flipped[40] ^= 1;
        let err = check_index(p, &flipped).unwrap_err();
        assert!(err.to_string().contains("entries checksum"), "{err}");

        let mut future = file.clone();
        future[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c(&future[0..28]);
        future[28..32].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            check_index(p, &future).unwrap_err(),
            Error::UnsupportedVersion { found: 2, .. }
        ));
    }
}

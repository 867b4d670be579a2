//! The writer's threads: chunks of records compressed and checksummed on
//! native threads ([`encode_chunk`]), then appended to shards in input order
//! by one sink thread ([`run_sink`]), whatever order the chunks finish in.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;

use crate::store::checksum::crc32c;
use crate::store::codec::{Codec, Compressor};
use crate::store::format::{encode_shard_header, shard_file_name, IndexEntry, SHARD_HEADER_LEN};
use crate::{Error, Result};

pub(super) struct Chunk {
    pub id: u64,
    pub data: Vec<u8>,
    pub ends: Vec<usize>,
}

pub(super) struct Encoded {
    id: u64,
    bytes: Vec<u8>,
    /// (stored_len, raw_len, crc32c, codec) per record
    records: Vec<(u32, u32, u32, Codec)>,
}

pub(super) struct SinkOutput {
    pub entries: Vec<IndexEntry>,
    pub shard_bytes: Vec<u64>,
}

pub(super) fn encode_chunk(compressor: &mut Compressor, chunk: Chunk) -> Encoded {
    if compressor.codec() == Codec::None {
        // stored as given: the chunk's bytes are the shard's, not copied
        let mut records = Vec::with_capacity(chunk.ends.len());
        let mut start = 0;
        for &end in &chunk.ends {
            let raw = &chunk.data[start..end];
            records.push((raw.len() as u32, raw.len() as u32, crc32c(raw), Codec::None));
            start = end;
        }
        return Encoded {
            id: chunk.id,
            bytes: chunk.data,
            records,
        };
    }
    let mut bytes = Vec::with_capacity(chunk.data.len() / 2);
    let mut records = Vec::with_capacity(chunk.ends.len());
    let mut start = 0;
    for &end in &chunk.ends {
        let raw = &chunk.data[start..end];
        let before = bytes.len();
        let codec = compressor.compress_into(raw, &mut bytes);
        let stored = &bytes[before..];
        records.push((stored.len() as u32, raw.len() as u32, crc32c(stored), codec));
        start = end;
    }
    Encoded {
        id: chunk.id,
        bytes,
        records,
    }
}

struct ShardSink {
    dir: PathBuf,
    target: u64,
    current: Option<(u32, BufWriter<File>, PathBuf)>,
    current_len: u64,
    shard_bytes: Vec<u64>,
}

impl ShardSink {
    fn close_current(&mut self) -> Result<()> {
        if let Some((_, writer, path)) = self.current.take() {
            let file = writer
                .into_inner()
                .map_err(|e| Error::io(&path)(e.into_error()))?;
            file.sync_all().map_err(Error::io(&path))?;
            self.shard_bytes.push(self.current_len);
        }
        Ok(())
    }

    fn append(&mut self, bytes: &[u8]) -> Result<(u32, u64)> {
        let len = bytes.len() as u64;
        let full = self.current.is_some()
            && self.current_len > SHARD_HEADER_LEN as u64
            && self.current_len + len > self.target;
        if full {
            self.close_current()?;
        }
        if self.current.is_none() {
            let shard = self.shard_bytes.len() as u32;
            let path = self.dir.join(shard_file_name(shard));
            let file = File::create(&path).map_err(Error::io(&path))?;
            let mut w = BufWriter::with_capacity(1 << 20, file);
            w.write_all(&encode_shard_header(shard))
                .map_err(Error::io(&path))?;
            self.current = Some((shard, w, path));
            self.current_len = SHARD_HEADER_LEN as u64;
        }
        let (shard, w, path) = self.current.as_mut().expect("shard open");
        let offset = self.current_len;
        w.write_all(bytes).map_err(Error::io(&*path))?;
        self.current_len += len;
        Ok((*shard, offset))
    }
}

pub(super) fn run_sink(dir: &Path, target: u64, results: Receiver<Encoded>) -> Result<SinkOutput> {
    let mut sink = ShardSink {
        dir: dir.to_path_buf(),
        target,
        current: None,
        current_len: 0,
        shard_bytes: Vec::new(),
    };
    let mut entries = Vec::new();
    let mut pending: BTreeMap<u64, Encoded> = BTreeMap::new();
    let mut next = 0u64;
    for encoded in results {
        pending.insert(encoded.id, encoded);
        while let Some(chunk) = pending.remove(&next) {
            let mut start = 0usize;
            for &(stored_len, raw_len, checksum, codec) in &chunk.records {
                let end = start + stored_len as usize;
                let (shard, offset) = sink.append(&chunk.bytes[start..end])?;
                entries.push(IndexEntry {
                    offset,
                    shard,
                    stored_len,
                    raw_len,
                    checksum,
                    codec,
                });
                start = end;
            }
            next += 1;
        }
    }
    sink.close_current()?;
    Ok(SinkOutput {
        entries,
        shard_bytes: sink.shard_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(id: u64, records: &[&[u8]]) -> Encoded {
        let mut compressor = Compressor::new(Codec::None, 0).unwrap();
        let mut data = Vec::new();
        let mut ends = Vec::new();
        for r in records {
            data.extend_from_slice(r);
            ends.push(data.len());
        }
        encode_chunk(&mut compressor, Chunk { id, data, ends })
    }

    #[test]
    fn chunks_finishing_out_of_order_land_in_input_order_across_shards() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        // chunk 1 finishes first; each record is 40 bytes, a shard holds
        // its header and then records until the next would pass 100 bytes
        tx.send(encoded(1, &[&[2; 40], &[3; 40]])).unwrap();
        tx.send(encoded(0, &[&[0; 40], &[1; 40]])).unwrap();
        drop(tx);
        let target = SHARD_HEADER_LEN as u64 + 100;
        let out = run_sink(dir.path(), target, rx).unwrap();
        let at: Vec<(u32, u64)> = out.entries.iter().map(|e| (e.shard, e.offset)).collect();
        let h = SHARD_HEADER_LEN as u64;
        assert_eq!(at, vec![(0, h), (0, h + 40), (1, h), (1, h + 40)]);
        assert_eq!(out.shard_bytes, vec![h + 80, h + 80]);
        let second = std::fs::read(dir.path().join(shard_file_name(1))).unwrap();
        assert_eq!(&second[SHARD_HEADER_LEN..SHARD_HEADER_LEN + 40], &[2; 40]);
        // each record's checksum is of its stored bytes
        assert_eq!(out.entries[3].checksum, crc32c(&[3; 40]));
    }
}

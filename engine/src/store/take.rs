//! Reading records by identity: the one read path of every payload read
//! (the loader's and SQL's `PayloadTakeExec`, `get_item`, the `payloads`
//! scan). Rows are sorted into the order records were written, read in
//! groups on scoped threads, verified and decoded, then put back in input
//! order. DataFusion's nodes over it live in `query`.

use std::sync::Arc;

use arrow::array::{
    make_view, Array, ArrayRef, AsArray, BinaryViewArray, ByteView, Int64Array, StringArray,
    MAX_INLINE_VIEW_LEN,
};
use arrow::buffer::{Buffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field};

use super::{Cache, CacheSet, Codec, IndexEntry};
use crate::{Error, Result};

/// Name of the payload column the node appends.
pub const DATA_COLUMN: &str = "data";

/// Splitting a batch over threads only pays off for large reads: every group
/// holds at least this many rows and this many payload bytes.
const MIN_ROWS_PER_GROUP: usize = 32;
const MIN_BYTES_PER_GROUP: usize = 4 << 20;

impl CacheSet {
    /// Decoded payloads of a list of `(cache_id, sample_id)`, in input order, as
    /// a `BinaryView` array.
    ///
    /// Records stored raw are not copied: after their checksum is verified the
    /// array's views point straight into the mapped shard (page cache). Compressed
    /// records are decoded into one buffer per read group. Reads are sorted by
    /// (cache, sample) — the order records were written, so shard by shard,
    /// offset by offset — and split into up to `concurrency` groups on scoped
    /// threads. Everything that touches a record (index entry, checksum, decode,
    /// the view's 4-byte prefix) happens in its group while the bytes are hot;
    /// putting the views in input order afterwards reads no payload memory.
    pub fn take(
        &self,
        cache_ids: &[i64],
        sample_ids: &[i64],
        concurrency: usize,
    ) -> Result<BinaryViewArray> {
        take_payloads(self, cache_ids, sample_ids, concurrency)
    }

    /// The payload columns for rows `(cache_ids[i], sample_ids[i])`, in order.
    /// Only [`PayloadColumn::Data`] reads payload bytes; the rest come from the index.
    pub fn payload_columns(
        &self,
        cache_ids: &[i64],
        sample_ids: &[i64],
        columns: &[PayloadColumn],
        concurrency: usize,
    ) -> Result<Vec<ArrayRef>> {
        payload_columns(self, cache_ids, sample_ids, columns, concurrency)
    }
}

fn take_payloads(
    caches: &CacheSet,
    cache_ids: &[i64],
    sample_ids: &[i64],
    concurrency: usize,
) -> Result<BinaryViewArray> {
    let n = cache_ids.len();
    let rows = caches.resolve(cache_ids, sample_ids)?;
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_unstable_by_key(|&i| rows[i as usize]);
    let groups = group_count(caches, &rows, n, concurrency);
    let per = n.div_ceil(groups).max(1);
    let run = |chunk: &[u32]| read_group(caches, &rows, chunk);
    let chunks: Vec<&[u32]> = order.chunks(per).collect();
    let outputs: Vec<GroupOutput> = if chunks.len() <= 1 {
        chunks.into_iter().map(run).collect::<Result<_>>()?
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = chunks[1..].iter().map(|c| scope.spawn(|| run(c))).collect();
            let mut outs = vec![run(chunks[0])];
            outs.extend(handles.into_iter().map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::internal("a payload read thread panicked")))
            }));
            outs.into_iter().collect::<Result<Vec<_>>>()
        })?
    };

    // Input order; each group's local buffer numbers become the array's.
    let mut buffers: Vec<Buffer> = Vec::new();
    let mut block_of: std::collections::HashMap<(u32, u32), u32> = std::collections::HashMap::new();
    let mut views = vec![0u128; n];
    for out in outputs {
        let blocks: Vec<u32> = out
            .buffers
            .into_iter()
            .map(|local| match local {
                Local::Shard(key, buffer) => *block_of.entry(key).or_insert_with(|| {
                    buffers.push(buffer.clone());
                    buffers.len() as u32 - 1
                }),
                Local::Owned(bytes) => {
                    buffers.push(Buffer::from_vec(bytes));
                    buffers.len() as u32 - 1
                }
            })
            .collect();
        for (row, view) in out.views {
            let view = ByteView::from(view);
            views[row as usize] = if view.length <= MAX_INLINE_VIEW_LEN {
                view.as_u128() // the bytes are in the view itself
            } else {
                view.with_buffer_index(blocks[view.buffer_index as usize])
                    .as_u128()
            };
        }
    }
    let views = ScalarBuffer::from(views);
    debug_assert!(
        <arrow::datatypes::BinaryViewType as arrow::datatypes::ByteViewType>::validate(
            &views, &buffers
        )
        .is_ok()
    );
    // SAFETY: every view was made by `make_view` from the exact bytes it
    // describes (so its length and prefix match); a non-inline view's offset
    // and length lie within the buffer it names, because that buffer is the
    // shard or the group buffer the bytes were taken from, renumbered above
    // to its position in `buffers`. Binary views need no UTF-8 check.
    Ok(unsafe { BinaryViewArray::new_unchecked(views, buffers, None) })
}

/// A buffer a read group's views point into.
enum Local<'a> {
    /// A mapped shard, keyed by (cache position, shard number).
    Shard((u32, u32), &'a Buffer),
    /// Decoded bytes of compressed records (at most 4 GiB: view offsets are u32).
    Owned(Vec<u8>),
}

/// What one read group produced: views numbered against its own buffers.
struct GroupOutput<'a> {
    buffers: Vec<Local<'a>>,
    /// (input row, view)
    views: Vec<(u32, u128)>,
}

/// The groups to read `rows` (`n` of them) in: up to `concurrency`, each of
/// at least `MIN_ROWS_PER_GROUP` rows and, by estimate, `MIN_BYTES_PER_GROUP`
/// payload bytes.
fn group_count(caches: &CacheSet, rows: &[(u32, u64)], n: usize, concurrency: usize) -> usize {
    // Splitting is decided on the caches' mean record size (the entries are
    // read inside the groups); a compressed record costs about its decoded
    // size, some 4x what is stored.
    let mean: Vec<usize> = caches
        .iter()
        .map(|c| {
            let stored = c.manifest().shard_bytes.iter().sum::<u64>() / c.records().max(1);
            let decode = if c.manifest().codec == Codec::None {
                1
            } else {
                4
            };
            (stored * decode) as usize
        })
        .collect();
    let estimate: usize = rows.iter().map(|&(c, _)| mean[c as usize]).sum();
    concurrency
        .min(n.div_ceil(MIN_ROWS_PER_GROUP))
        .min(estimate.div_ceil(MIN_BYTES_PER_GROUP))
        .max(1)
}

fn read_group<'a>(
    caches: &'a [Arc<Cache>],
    rows: &[(u32, u64)],
    chunk: &[u32],
) -> Result<GroupOutput<'a>> {
    let mut buffers: Vec<Local<'a>> = Vec::new();
    let mut views = Vec::with_capacity(chunk.len());
    let mut owned: Option<usize> = None; // the Owned buffer being filled
    for &row in chunk {
        let (c, sample) = rows[row as usize];
        let cache = &caches[c as usize];
        let entry = cache.entry(sample)?;
        // an evicting replica's records are copied out and verified on the copy
        let mapped = match cache.replica() {
            Some(r) if !r.whole() => None,
            _ => Some(cache.stored(sample, &entry, true)?),
        };
        let view = if entry.raw_len <= MAX_INLINE_VIEW_LEN {
            // at most 12 bytes: they live in the view itself
            let mut small = [0u8; MAX_INLINE_VIEW_LEN as usize];
            let small = &mut small[..entry.raw_len as usize];
            cache.read_entry(sample, &entry, small, false)?;
            make_view(small, 0, 0)
        } else if let Some((shard, start, end)) = mapped
            .filter(|(shard, _, _)| entry.codec == Codec::None && shard.len() <= u32::MAX as usize)
        {
            let key = (c, entry.shard);
            // rows are in (cache, sample) order: mostly the last shard again
            let found = buffers
                .iter()
                .rposition(|b| matches!(b, Local::Shard(k, _) if *k == key));
            let local = found.unwrap_or_else(|| {
                buffers.push(Local::Shard(key, shard));
                buffers.len() - 1
            });
            make_view(&shard[start..end], local as u32, start as u32)
        } else {
            let len = entry.raw_len as usize;
            let fits =
                |b: &Local| matches!(b, Local::Owned(v) if v.len() + len <= u32::MAX as usize);
            let local = match owned {
                Some(i) if fits(&buffers[i]) => i,
                _ => {
                    buffers.push(Local::Owned(Vec::new()));
                    buffers.len() - 1
                }
            };
            owned = Some(local);
            let Local::Owned(bytes) = &mut buffers[local] else {
                unreachable!("an owned buffer")
            };
            let at = bytes.len();
            bytes.resize(at + len, 0);
            cache.read_entry(sample, &entry, &mut bytes[at..], false)?;
            make_view(&bytes[at..], local as u32, at as u32)
        };
        views.push((row, view));
    }
    Ok(GroupOutput { buffers, views })
}

/// Total value bytes of a `BinaryView` payload column.
pub fn binary_view_bytes(array: &dyn Array) -> usize {
    let views = array.as_binary_view();
    views.views().iter().map(|v| *v as u32 as usize).sum()
}

/// A column the payload store can add to a row, given its identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadColumn {
    CacheId,
    SampleId,
    /// Bytes on disk (index only).
    StoredLen,
    /// Bytes after decoding (index only).
    RawLen,
    /// "none", "zstd" or "lz4" (index only).
    Codec,
    /// CRC-32C of the stored bytes (index only).
    Checksum,
    /// The decoded payload: the only column that reads payload bytes.
    Data,
}

impl PayloadColumn {
    pub const ALL: [PayloadColumn; 7] = [
        PayloadColumn::CacheId,
        PayloadColumn::SampleId,
        PayloadColumn::StoredLen,
        PayloadColumn::RawLen,
        PayloadColumn::Codec,
        PayloadColumn::Checksum,
        PayloadColumn::Data,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PayloadColumn::CacheId => "cache_id",
            PayloadColumn::SampleId => "sample_id",
            PayloadColumn::StoredLen => "stored_len",
            PayloadColumn::RawLen => "raw_len",
            PayloadColumn::Codec => "codec",
            PayloadColumn::Checksum => "checksum",
            PayloadColumn::Data => DATA_COLUMN,
        }
    }

    pub fn field(self) -> Field {
        let ty = match self {
            PayloadColumn::Codec => DataType::Utf8,
            PayloadColumn::Data => DataType::BinaryView,
            _ => DataType::Int64,
        };
        Field::new(self.name(), ty, false)
    }
}

fn payload_columns(
    caches: &CacheSet,
    cache_ids: &[i64],
    sample_ids: &[i64],
    columns: &[PayloadColumn],
    concurrency: usize,
) -> Result<Vec<ArrayRef>> {
    let needs_index = columns.iter().any(|c| {
        matches!(
            c,
            PayloadColumn::StoredLen
                | PayloadColumn::RawLen
                | PayloadColumn::Codec
                | PayloadColumn::Checksum
        )
    });
    let entries: Vec<IndexEntry> = if needs_index {
        caches
            .resolve(cache_ids, sample_ids)?
            .into_iter()
            .map(|(c, sample)| caches[c as usize].entry(sample))
            .collect::<Result<_>>()?
    } else {
        Vec::new()
    };
    let mut out: Vec<ArrayRef> = Vec::with_capacity(columns.len());
    for column in columns {
        let array: ArrayRef = match column {
            PayloadColumn::CacheId => Arc::new(Int64Array::from(cache_ids.to_vec())),
            PayloadColumn::SampleId => Arc::new(Int64Array::from(sample_ids.to_vec())),
            PayloadColumn::StoredLen => Arc::new(Int64Array::from_iter_values(
                entries.iter().map(|e| e.stored_len as i64),
            )),
            PayloadColumn::RawLen => Arc::new(Int64Array::from_iter_values(
                entries.iter().map(|e| e.raw_len as i64),
            )),
            PayloadColumn::Codec => Arc::new(StringArray::from_iter_values(
                entries.iter().map(|e| e.codec.name()),
            )),
            PayloadColumn::Checksum => Arc::new(Int64Array::from_iter_values(
                entries.iter().map(|e| e.checksum as i64),
            )),
            PayloadColumn::Data => Arc::new(caches.take(cache_ids, sample_ids, concurrency)?),
        };
        out.push(array);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserved_payload_names_are_the_payload_columns() {
        let names: Vec<&str> = PayloadColumn::ALL[2..].iter().map(|c| c.name()).collect();
        assert_eq!(names, crate::store::PAYLOAD_COLUMNS);
    }
}

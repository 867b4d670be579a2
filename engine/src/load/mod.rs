//! Getting payload bytes out: rows of a snapshot in, contiguous bytes out.

use crate::catalog::{Dataset, Snapshot};
use crate::Result;

/// Decoded payloads of a batch of rows, packed in one buffer.
#[derive(Debug, Default)]
pub struct Payloads {
    pub data: Vec<u8>,
    /// End offset of each payload in `data`.
    pub ends: Vec<usize>,
}

impl Payloads {
    pub fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.data[start..self.ends[i]]
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
}

/// Read the payloads of `rows` of `snapshot`, in order, checksums verified.
pub fn read_rows(dataset: &Dataset, snapshot: &Snapshot, rows: &[u32]) -> Result<Payloads> {
    let caches = dataset.caches();
    let ids = snapshot.cache_ids().values();
    let samples = snapshot.sample_ids().values();
    let mut out = Payloads {
        data: Vec::new(),
        ends: Vec::with_capacity(rows.len()),
    };
    let mut pos = 0usize;
    for &row in rows {
        let row = row as usize;
        if caches[pos].id() != ids[row] {
            pos = dataset.cache_position(ids[row])?;
        }
        caches[pos].read_into(samples[row] as u64, &mut out.data, true)?;
        out.ends.push(out.data.len());
    }
    Ok(out)
}

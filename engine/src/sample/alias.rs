//! Walker/Vose alias table: O(n) build, O(1) weighted draw. A table is
//! written once per weight column as a file and mapped read-only, so loader
//! workers share its pages instead of each building a private copy.
//!
//! File layout (little-endian): magic `DRTALIAS`, u32 version, u32 reserved,
//! u64 n, u32 crc32c of the chunk table, u32 reserved; body: `n` f64
//! probabilities then `n` u32 aliases; then the chunk table: a CRC-32C per
//! 64 KiB of the body (`store::chunks`). A draw checks the chunks it reads
//! the first time any process of the host reads them, so mapping a table of
//! 10^9 rows costs its header and chunk table, not a pass over 12 GB.
//! (Written as the in-memory bytes: little-endian hosts.) Version 1 had one
//! CRC-32C over the body; such a file is rebuilt.

use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow::buffer::{Buffer, ScalarBuffer};
use memmap2::MmapOptions;

use super::rng::{mix64, unit_f64};
use super::Weights;
use crate::store::checksum::{check_magic, crc32c, header_version};
use crate::store::chunks::{self, chunk_count, ChunkCheck};
use crate::store::fs::{map_file, temp_sibling};
use crate::store::host::records;
use crate::{Error, Result};

const MAGIC: [u8; 8] = *b"DRTALIAS";
const VERSION: u32 = 2;
const HEADER: usize = 32;

/// Bytes of a stored table of `n` rows: header, body, chunk table.
fn file_len(n: usize) -> usize {
    HEADER + n * 12 + chunk_count(n as u64 * 12) * 4
}

/// Fill `prob` and `alias` (each `weights.len()` long) with the alias table.
fn fill(weights: &Weights<'_>, prob: &mut [f64], alias: &mut [u32]) -> Result<()> {
    let n = weights.len();
    if n == 0 || n > u32::MAX as usize {
        return Err(Error::invalid(format!("cannot sample from {n} weights")));
    }
    let total: f64 = weights.iter().sum();
    if !(total.is_finite() && total > 0.0) || weights.iter().any(|w| !w.is_finite() || *w < 0.0) {
        return Err(Error::invalid(
            "weights must be finite, non-negative, with a positive sum",
        ));
    }
    // n / total overflows when the weights are near the smallest doubles
    // (equal subnormal weights made every entry infinite, and the draws far
    // from uniform): then w / total * n, which only rounds differently, so
    // tables of ordinary weights keep their bits
    let scale = n as f64 / total;
    let (n_f, finite) = (n as f64, scale.is_finite());
    for ((p, a), (k, w)) in prob
        .iter_mut()
        .zip(alias.iter_mut())
        .zip(weights.iter().enumerate())
    {
        *p = match finite {
            true => w * scale,
            false => w / total * n_f,
        };
        *a = k as u32;
    }
    // Vose's pairing with two forward scans instead of stacks, so memory is
    // touched in order. `scan` looks for p < 1, `large` for p >= 1; a large
    // entry that drops below 1 behind the scan is paired right away.
    let next_small = |from: usize, prob: &[f64]| (from..n).find(|&k| prob[k] < 1.0).unwrap_or(n);
    let next_large = |from: usize, prob: &[f64]| (from..n).find(|&k| prob[k] >= 1.0).unwrap_or(n);
    let mut small = next_small(0, prob);
    let mut scan = next_small(small.saturating_add(1), prob);
    let mut large = next_large(0, prob);
    while small < n && large < n {
        alias[small] = large as u32;
        prob[large] = (prob[large] + prob[small]) - 1.0;
        if prob[large] < 1.0 && large < scan {
            small = large;
        } else {
            small = scan;
            scan = next_small(scan.saturating_add(1), prob);
        }
        if prob[large] < 1.0 {
            large = next_large(large + 1, prob);
        }
    }
    // Whatever is left unpaired (its alias is itself) is 1.0 up to rounding.
    for (k, p) in prob.iter_mut().enumerate() {
        if alias[k] == k as u32 {
            *p = 1.0;
        }
    }
    Ok(())
}

/// Weighted sampling with replacement in O(1) per draw.
#[derive(Debug, Clone)]
pub struct AliasTable {
    prob: ScalarBuffer<f64>,
    alias: ScalarBuffer<u32>,
    /// For a stored table: checks the body's chunks as draws read them.
    check: Option<Arc<ChunkCheck>>,
}

impl AliasTable {
    /// Build from non-negative, finite weights with a positive sum.
    pub fn new<'w>(weights: impl Into<Weights<'w>>) -> Result<AliasTable> {
        let weights = weights.into();
        let mut prob = vec![0.0f64; weights.len()];
        let mut alias = vec![0u32; weights.len()];
        fill(&weights, &mut prob, &mut alias)?;
        Ok(AliasTable {
            prob: prob.into(),
            alias: alias.into(),
            check: None,
        })
    }

    /// Map the table of `n` rows stored at `path`, or build it from
    /// `weights` (asked for only then), store it there and map it. The file
    /// is derived data: it is written without fsync, published atomically
    /// (concurrent builders agree), and rebuilt when its header, length or
    /// chunk table does not match (e.g. after a crash) or it is of an older
    /// version.
    pub fn load_or_build<'w>(
        path: &Path,
        n: usize,
        weights: &dyn Fn() -> Result<Weights<'w>>,
    ) -> Result<AliasTable> {
        match Self::stored(path, n)? {
            Some(table) => Ok(table),
            None => Self::build_stored(path, &weights()?),
        }
    }

    /// The table of `n` rows stored at `path`, mapped; `None` when there is
    /// none, or one to rebuild (damaged header or chunk table, wrong length,
    /// older version).
    pub fn stored(path: &Path, n: usize) -> Result<Option<AliasTable>> {
        if !path.exists() {
            return Ok(None);
        }
        match Self::map(path, n) {
            Ok(table) => Ok(Some(table)),
            Err(Error::Corrupt { .. } | Error::UnsupportedVersion { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Build the table of `weights`, store it at `path` (replacing what is
    /// there) and map it.
    pub fn build_stored(path: &Path, weights: &Weights<'_>) -> Result<AliasTable> {
        let n = weights.len();
        // Build straight into the file's pages: no second copy to write out.
        let tmp = temp_sibling(path);
        let built = (|| -> Result<()> {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(Error::io(&tmp))?;
            // Allocate the blocks before mapping: on a full disk a write into
            // a mapped page the disk cannot back is a SIGBUS, not an error.
            crate::store::fs::allocate(&file, file_len(n) as u64).map_err(Error::io(&tmp))?;
            // SAFETY: a fresh private temporary file that no one else maps.
            let mut map =
                unsafe { MmapOptions::new().populate().map_mut(&file) }.map_err(Error::io(&tmp))?;
            let (header, rest) = map.split_at_mut(HEADER);
            let (body, table) = rest.split_at_mut(n * 12);
            let (prob_bytes, alias_bytes) = body.split_at_mut(n * 8);
            // SAFETY: the mapping is page-aligned and HEADER is a multiple of 8,
            // so both slices are aligned for their types and exactly n long.
            let prob =
                unsafe { std::slice::from_raw_parts_mut(prob_bytes.as_mut_ptr().cast::<f64>(), n) };
            // SAFETY: as for `prob`: `alias_bytes` starts 8n bytes further, a
            // multiple of 4, and holds exactly n u32s.
            let alias = unsafe {
                std::slice::from_raw_parts_mut(alias_bytes.as_mut_ptr().cast::<u32>(), n)
            };
            fill(weights, prob, alias)?;
            for (slot, crc) in table.chunks_exact_mut(4).zip(chunks::chunk_crcs(body)) {
                slot.copy_from_slice(&crc.to_le_bytes());
            }
            header[0..8].copy_from_slice(&MAGIC);
            header[8..12].copy_from_slice(&VERSION.to_le_bytes());
            header[16..24].copy_from_slice(&(n as u64).to_le_bytes());
            header[24..28].copy_from_slice(&crc32c(table).to_le_bytes());
            Ok(())
        })();
        if let Err(e) = built {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        // Replacing is safe: readers that mapped an older copy keep its inode.
        std::fs::rename(&tmp, path).map_err(Error::io(path))?;
        // its chunks were summed from the bytes just built: none is read again
        records::record_checked(path, chunk_count(n as u64 * 12));
        Self::map(path, n)
    }

    /// Map the stored table at `path`: its header and chunk table are
    /// checked here, the body's chunks as draws read them.
    fn map(path: &Path, n: usize) -> Result<AliasTable> {
        let mmap = Arc::new(map_file(path, "alias table")?);
        // draws read an entry here and there
        crate::store::fs::advise(&mmap, crate::store::fs::Access::Sparse);
        let bad = |detail: String| Error::corrupt(path, detail);
        check_magic(path, &mmap, &MAGIC, "alias table")?;
        header_version(path, &mmap, VERSION..=VERSION)?;
        if mmap.len() != file_len(n) {
            return Err(bad(format!(
                "expected an alias table of {n} rows ({} bytes)",
                file_len(n)
            )));
        }
        let crc = u32::from_le_bytes(mmap[24..28].try_into().expect("4 bytes"));
        let table = &mmap[HEADER + n * 12..];
        if crc32c(table) != crc {
            return Err(bad("alias table's chunk table checksum mismatch".into()));
        }
        let crcs = table
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        // SAFETY: the pointer and length describe the live mapping, kept alive
        // by the buffer's `Arc` owner; the file is immutable once published.
        let buffer = unsafe {
            Buffer::from_custom_allocation(
                NonNull::new(mmap.as_ptr() as *mut u8).expect("mmap pointer is never null"),
                mmap.len(),
                mmap.clone(),
            )
        };
        let body = buffer.slice_with_length(HEADER, n * 12);
        let check = ChunkCheck::new(path, body, HEADER as u64, crcs, records::host_key(path))?;
        Ok(AliasTable {
            prob: ScalarBuffer::new(buffer.clone(), HEADER / 8, n),
            alias: ScalarBuffer::new(buffer, (HEADER + n * 8) / 4, n),
            check: Some(Arc::new(check)),
        })
    }

    /// Check stored table `path` of `n` rows whole: its header, chunk table
    /// and every chunk of its body, whatever this host checked before.
    pub fn verify(path: &Path, n: usize) -> Result<()> {
        let table = Self::map(path, n)?;
        match table.check.as_deref() {
            Some(check) => check.check_all(crate::store::chunks::check_threads()),
            None => Ok(()),
        }
    }

    pub fn len(&self) -> usize {
        self.prob.len()
    }

    pub fn is_empty(&self) -> bool {
        self.prob.is_empty()
    }

    /// Check the chunks of entry `column` of a table of `n` rows: its
    /// probability and its alias (apart from the draw: once every chunk is
    /// known good, a draw is loads and a comparison).
    #[cold]
    #[inline(never)]
    fn check_entry(check: &ChunkCheck, n: usize, column: usize) -> Result<()> {
        check.check(column * 8..column * 8 + 8)?;
        let at = n * 8 + column * 4;
        check.check(at..at + 4)
    }

    /// Ask the kernel to start reading the entry a draw of `bits` reads
    /// (and, unchecked, its chunks), without waiting: the reads of a run of
    /// draws then go to the disk together. A table in memory has nothing
    /// to read.
    pub fn advise(&self, bits: u64) {
        let Some(check) = self.check.as_deref() else {
            return;
        };
        let n = self.prob.len();
        let column = ((bits as u128 * n as u128) >> 64) as usize;
        check.advise(column * 8..column * 8 + 8);
        let at = n * 8 + column * 4;
        check.advise(at..at + 4);
    }

    /// The row chosen by 64 random bits. An error is a damaged chunk of a
    /// stored table that this draw had to read.
    #[inline]
    pub fn draw(&self, bits: u64) -> Result<usize> {
        let n = self.prob.len();
        let column = ((bits as u128 * n as u128) >> 64) as usize;
        if let Some(check) = self.check.as_deref().filter(|c| !c.is_all()) {
            Self::check_entry(check, n, column)?;
        }
        let coin = unit_f64(mix64(bits));
        // both entries read before the choice: their two cache misses (a
        // table larger than the caches) overlap instead of following each
        // other, which halved the draws per second of a checked table
        let (prob, alias) = (self.prob[column], self.alias[column] as usize);
        Ok(if coin < prob { column } else { alias })
    }
}

#[cfg(test)]
mod tests {
    use super::super::rng::draw_bits;
    use super::*;

    #[test]
    fn zero_weight_rows_are_never_drawn_and_shares_follow_weights() {
        let weights = [0.0, 1.0, 3.0, 0.0, 4.0];
        let t = AliasTable::new(&weights).unwrap();
        let n = 400_000u64;
        let mut counts = [0u64; 5];
        for k in 0..n {
            counts[t.draw(draw_bits(3, 0, k)).unwrap()] += 1;
        }
        assert_eq!(counts[0] + counts[3], 0);
        for (i, &w) in weights.iter().enumerate() {
            let p = w / 8.0;
            let sd = (n as f64 * p * (1.0 - p)).sqrt();
            let diff = (counts[i] as f64 - n as f64 * p).abs();
            assert!(diff <= 5.0 * sd + 1.0, "row {i}: {counts:?}");
        }
    }

    #[test]
    fn a_stored_table_draws_exactly_like_a_fresh_one() {
        let dir = tempfile::tempdir().unwrap();
        let weights: Vec<f64> = (0..1000).map(|i| (i % 7) as f64).collect();
        let path = dir.path().join("w.alias");
        let fresh = AliasTable::new(&weights).unwrap();
        let stored = AliasTable::load_or_build(&path, 1000, &|| Ok((&weights[..]).into())).unwrap();
        let again = AliasTable::load_or_build(&path, 1000, &|| {
            panic!("a stored table is mapped, not built: no weights needed")
        })
        .unwrap();
        for k in 0..10_000 {
            let bits = draw_bits(5, 1, k);
            assert_eq!(fresh.draw(bits).unwrap(), stored.draw(bits).unwrap());
            assert_eq!(fresh.draw(bits).unwrap(), again.draw(bits).unwrap());
        }
        // the chunk table damaged: the file is not mapped (and is rebuilt)
        let good = std::fs::read(&path).unwrap();
        let mut raw = good.clone();
        raw[HEADER + 12_000 + 1] ^= 1;
        std::fs::write(&path, &raw).unwrap();
        assert!(matches!(
            AliasTable::map(&path, 1000).unwrap_err(),
            Error::Corrupt { .. }
        ));
    }

    #[test]
    fn a_damaged_body_chunk_fails_the_draws_that_read_it_and_only_them() {
        let dir = tempfile::tempdir().unwrap();
        let n = 20_000; // a body of 240,000 bytes: 4 chunks
        let weights: Vec<f64> = (0..n).map(|i| (i % 5 + 1) as f64).collect();
        let path = dir.path().join("w.alias");
        let fresh = AliasTable::new(&weights).unwrap();
        AliasTable::load_or_build(&path, n, &|| Ok((&weights[..]).into())).unwrap();
        let mut raw = std::fs::read(&path).unwrap();
        let damaged_row = 100; // its probability lies in chunk 0
        raw[HEADER + damaged_row * 8] ^= 0x40;
        std::fs::write(&path, &raw).unwrap();
        let stored = AliasTable::map(&path, n).unwrap();
        let (mut good, mut failed) = (0, 0);
        for k in 0..2_000 {
            let bits = draw_bits(5, 1, k);
            let column = ((bits as u128 * n as u128) >> 64) as usize;
            match stored.draw(bits) {
                Ok(row) => {
                    assert!(
                        column * 8 >= chunks::CHUNK,
                        "draw {k} read the damaged chunk"
                    );
                    assert_eq!(row, fresh.draw(bits).unwrap());
                    good += 1;
                }
                Err(e) => {
                    assert!(column * 8 < chunks::CHUNK, "draw {k}: {e}");
                    assert!(e.to_string().contains("chunk 0 "), "{e}");
                    failed += 1;
                }
            }
        }
        assert!(good > 0 && failed > 0, "{good} {failed}");
    }

    #[test]
    fn the_table_reproduces_the_weights_exactly() {
        // probability of row i = (prob[i] + sum of (1 - prob[j]) over j aliased to i) / n
        let mut x = 7u64;
        let weights: Vec<f64> = (0..5000)
            .map(|i| {
                x = mix64(x);
                if i % 7 == 0 {
                    0.0
                } else {
                    (x % 1000) as f64 / 10.0 + 0.01
                }
            })
            .collect();
        let t = AliasTable::new(&weights).unwrap();
        let n = weights.len() as f64;
        let total: f64 = weights.iter().sum();
        let mut mass = vec![0.0f64; weights.len()];
        for i in 0..weights.len() {
            mass[i] += t.prob[i] / n;
            mass[t.alias[i] as usize] += (1.0 - t.prob[i]) / n;
        }
        for (i, w) in weights.iter().enumerate() {
            assert!(
                (mass[i] - w / total).abs() < 1e-12,
                "row {i}: {} vs {}",
                mass[i],
                w / total
            );
        }
    }

    #[test]
    fn bad_weights_are_refused() {
        assert!(AliasTable::new(&[] as &[f64]).is_err());
        assert!(AliasTable::new(&[0.0, 0.0]).is_err());
        assert!(AliasTable::new(&[1.0, f64::NAN]).is_err());
        assert!(AliasTable::new(&[1.0, -1.0]).is_err());
    }
}

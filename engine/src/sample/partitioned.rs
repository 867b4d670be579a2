//! A partitioned population's weights as the weighted samplers read them,
//! touching only the partitions their draws land in.
//!
//! *With replacement*: a table over the partitions' weight masses picks a
//! partition, that partition's own alias table a row of it.
//! `P(row) = mass_p / total × w_row / mass_p`, the flat law. A partition's
//! table is mapped (or built and stored) when a draw first lands there, and
//! the tables a run of draws needs can be made ahead, in parallel
//! ([`PartitionedWeights::prepare`]). A partition's table is named by its
//! weight column's content, so a reweight that changes one partition builds
//! one table.
//!
//! *Balanced*: row `r` covers the positions `floor(C[r-1] + u) ..
//! floor(C[r] + u)` of the epoch, `C` the running sum of the weights scaled
//! to the epoch's length. The partition of a position is found from the
//! running sum of the masses, the block of 256 rows from the partition's
//! block sums (built on first use: 8 bytes per 256 rows, 128 KiB for a
//! partition of 2^22 rows), the row by summing the block's weights in place,
//! in an order seeded per block and pass (in row order, rows of a pattern
//! that repeats with the rows, such as interleaved labels, all rounded the
//! same way: a label could get no draw in an epoch). Nothing per row is
//! held. A lookup sums at most one block (4,096 rows took 5× the time of
//! the flat table's binary search at 10^6 rows; 256 rows about as long).
//!
//! With one partition both are exactly the flat samplers' draws.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use arrow::buffer::ScalarBuffer;

use super::alias::AliasTable;
use super::rng::mix64;
use super::rng::Permutation;
use crate::{Error, Result};

/// Salt of the bits a draw's row in its partition takes (the partition's
/// are the draw's own bits).
const SALT_ROW: u64 = 0x726f_775f_696e_5f70;

/// Salt of the key of a block's order in a balanced lookup.
const SALT_BLOCK: u64 = 0x626c_6f63_6b5f_6f72;

/// Rows per block of a partition's balanced lookup.
const BLOCK: usize = 256;

/// Where a population's per-partition weights and alias tables come from.
pub trait PartitionSource: Send + Sync + std::fmt::Debug {
    /// Map, or build and store, the alias table of partition `p`'s weights.
    fn table(&self, p: usize) -> Result<AliasTable>;
    /// Partition `p`'s stored table, mapped; `None` when it is to be built
    /// (or is not stored at all).
    fn stored(&self, _p: usize) -> Result<Option<AliasTable>> {
        Ok(None)
    }
    /// Build partition `p`'s table anew from its weights (its stored one
    /// was found damaged by a draw) and store it in place of that one.
    fn rebuild(&self, p: usize) -> Result<AliasTable> {
        self.table(p)
    }
    /// Partition `p`'s weights, every chunk checked, their sum in row order
    /// the partition's recorded mass.
    fn weights(&self, p: usize) -> Result<ScalarBuffer<f64>>;
}

/// One partition's weights held in memory.
#[derive(Debug)]
struct Given(ScalarBuffer<f64>);

impl PartitionSource for Given {
    fn table(&self, _: usize) -> Result<AliasTable> {
        AliasTable::new(self.0.as_ref())
    }
    fn weights(&self, _: usize) -> Result<ScalarBuffer<f64>> {
        Ok(self.0.clone())
    }
}

/// A partition's weights and the sums of its blocks of `BLOCK` rows:
/// `sums[b]` is the sum, in row order, of the rows before block `b`.
#[derive(Debug)]
struct Blocks {
    weights: ScalarBuffer<f64>,
    sums: Vec<f64>,
}

/// The weighted samplers' view of a partitioned population: partitions'
/// rows and masses, their alias tables and block sums made on first use.
#[derive(Debug)]
pub struct PartitionedWeights {
    /// Over the partitions' masses; `None` with one partition.
    top: Option<AliasTable>,
    /// The first row of each partition.
    starts: Vec<u64>,
    /// The masses of partitions `0..=p`, summed in order, for each `p`.
    through: Vec<f64>,
    tables: Vec<OnceLock<AliasTable>>,
    /// Tables built again because a draw found the stored one damaged.
    rebuilt: Vec<OnceLock<AliasTable>>,
    blocks: Vec<OnceLock<Blocks>>,
    source: Box<dyn PartitionSource>,
}

impl PartitionedWeights {
    /// Partitions of `rows[p]` rows and weight mass `masses[p]`; `source`
    /// gives partition `p`'s table and weights when a draw first needs them.
    pub fn new(
        rows: &[usize],
        masses: &[f64],
        source: Box<dyn PartitionSource>,
    ) -> Result<PartitionedWeights> {
        if rows.is_empty() || rows.len() != masses.len() {
            return Err(Error::invalid(format!(
                "{} partitions with {} masses",
                rows.len(),
                masses.len()
            )));
        }
        let top = match masses {
            [_] => None,
            _ => Some(AliasTable::new(masses)?),
        };
        let mut starts = Vec::with_capacity(rows.len());
        let mut at = 0u64;
        for &r in rows {
            starts.push(at);
            at += r as u64;
        }
        let mut total = 0.0f64;
        let through = masses
            .iter()
            .map(|m| {
                total += m;
                total
            })
            .collect();
        Ok(PartitionedWeights {
            top,
            starts,
            through,
            tables: rows.iter().map(|_| OnceLock::new()).collect(),
            rebuilt: rows.iter().map(|_| OnceLock::new()).collect(),
            blocks: rows.iter().map(|_| OnceLock::new()).collect(),
            source,
        })
    }

    /// One partition of `weights`, held in memory.
    pub fn one(weights: &[f64]) -> Result<PartitionedWeights> {
        let buffer = ScalarBuffer::from(weights.to_vec());
        Self::new(
            &[weights.len()],
            &[super::mass(weights)],
            Box::new(Given(buffer)),
        )
    }

    /// The sum of every weight: the partitions' masses summed in order.
    pub fn total(&self) -> f64 {
        *self.through.last().expect("at least one partition")
    }

    pub fn num_partitions(&self) -> usize {
        self.tables.len()
    }

    /// The partition a draw of `bits` lands in, and the bits its row in
    /// that partition is drawn with.
    #[inline]
    fn split(&self, bits: u64) -> Result<(usize, u64)> {
        Ok(match &self.top {
            None => (0, bits),
            Some(top) => (top.draw(bits)?, mix64(bits ^ SALT_ROW)),
        })
    }

    /// Partition `p`'s table, made on first use.
    fn table(&self, p: usize) -> Result<&AliasTable> {
        if let Some(table) = self.tables[p].get() {
            return Ok(table);
        }
        let table = self.source.table(p)?;
        Ok(self.tables[p].get_or_init(|| table))
    }

    /// The row (of the whole population) chosen by 64 random bits. An error
    /// is a table the draw needed that could not be made, or a damaged
    /// chunk of a stored one.
    #[inline]
    pub fn draw(&self, bits: u64) -> Result<u64> {
        let (p, inner) = self.split(bits)?;
        if let Some(table) = self.rebuilt[p].get() {
            return Ok(self.starts[p] + table.draw(inner)? as u64);
        }
        match self.table(p)?.draw(inner) {
            Ok(row) => Ok(self.starts[p] + row as u64),
            Err(damaged @ Error::Corrupt { .. }) => {
                let table = self.rebuild(p, &damaged)?;
                Ok(self.starts[p] + table.draw(inner)? as u64)
            }
            Err(e) => Err(e),
        }
    }

    /// Partition `p`'s table built again from its weights, once, after a
    /// draw found the stored one `damaged`. An alias table is derived data:
    /// the weights (checked) are the truth, so a damaged table is no reason
    /// to fail every weighted loader of the snapshot.
    #[cold]
    fn rebuild(&self, p: usize, damaged: &Error) -> Result<&AliasTable> {
        if let Some(table) = self.rebuilt[p].get() {
            return Ok(table);
        }
        let table = self.source.rebuild(p)?;
        eprintln!(
            "datasetrt: warning: {damaged}; the alias table was built again from the weights"
        );
        Ok(self.rebuilt[p].get_or_init(|| table))
    }

    /// Ask the kernel to start reading what a draw of `bits` reads in its
    /// partition's table, if that table is made (see
    /// [`AliasTable::advise`]).
    pub fn advise(&self, bits: u64) {
        if let Ok((p, inner)) = self.split(bits) {
            if let Some(table) = self.tables[p].get() {
                table.advise(inner);
            }
        }
    }

    /// Make the tables of every partition the draws of `bits` land in that
    /// are not made yet (stored ones mapped on [`crate::IO_THREADS`], the
    /// others built on up to `threads`). Drawing them then reads
    /// tables only.
    pub fn prepare(&self, bits: impl Iterator<Item = u64>, threads: usize) -> Result<()> {
        if self.top.is_none() {
            return self.table(0).map(|_| ());
        }
        let mut needed = BTreeSet::new();
        for b in bits {
            let (p, _) = self.split(b)?;
            if self.tables[p].get().is_none() {
                needed.insert(p);
            }
        }
        self.make(needed.into_iter().collect(), threads)
    }

    /// Make the table of every partition a draw can land in (its mass is
    /// not zero) that is not made yet (as [`Self::prepare`] does): for
    /// many draws, where finding the partitions they land in would cost
    /// another pass over them and would find nearly all.
    pub fn prepare_all(&self, threads: usize) -> Result<()> {
        let needed = (0..self.tables.len())
            .filter(|&p| {
                let before = if p == 0 { 0.0 } else { self.through[p - 1] };
                self.through[p] > before && self.tables[p].get().is_none()
            })
            .collect();
        self.make(needed, threads)
    }

    /// Make the tables of partitions `needed`: those stored mapped first,
    /// on [`crate::IO_THREADS`] (a few small reads each, mostly waiting on
    /// the disk), then the others built, on up to `threads`.
    fn make(&self, needed: Vec<usize>, threads: usize) -> Result<()> {
        let map = |&p: &usize| -> Result<()> {
            if let Some(table) = self.source.stored(p)? {
                let _ = self.tables[p].set(table);
            }
            Ok(())
        };
        crate::try_each(&needed, crate::IO_THREADS, map)?;
        let built: Vec<usize> = needed
            .into_iter()
            .filter(|&p| self.tables[p].get().is_none())
            .collect();
        crate::try_each(&built, threads, |&p| self.table(p).map(|_| ()))
    }

    /// How many partitions' tables are made.
    pub fn tables_made(&self) -> usize {
        self.tables.iter().filter(|t| t.get().is_some()).count()
    }

    /// Partition `p`'s weights and block sums, made on first use.
    fn blocks(&self, p: usize) -> Result<&Blocks> {
        if let Some(blocks) = self.blocks[p].get() {
            return Ok(blocks);
        }
        let weights = self.source.weights(p)?;
        let mut sums = Vec::with_capacity(weights.len().div_ceil(BLOCK) + 1);
        let mut acc = 0.0f64;
        for block in weights.chunks(BLOCK) {
            sums.push(acc);
            for w in block {
                acc += w;
            }
        }
        sums.push(acc);
        Ok(self.blocks[p].get_or_init(|| Blocks { weights, sums }))
    }

    /// The row of position `position` of a balanced epoch of `len` draws
    /// with offset `u` in [0, 1) and key `key` (the pass's): the row
    /// whose span of the running sum `C`, scaled to `len` (the last row's
    /// taken as exactly `len`), holds `position + 1 - u`. `C` runs over the
    /// blocks in order and over each block's rows in a seeded order
    /// ([`block_order`]): summed in row order, rows of a pattern that
    /// repeats with the rows (labels interleaved) all fell on the same side
    /// of the rounding, and a label got no draw in most epochs.
    pub fn balanced_row(&self, len: u64, position: f64, u: f64, key: u64) -> Result<u64> {
        let total = self.total();
        let len_f = len as f64;
        // C / total * len, not C * (len / total): scale-invariant, so that
        // weights near the smallest (or subnormal) doubles do not overflow
        let scaled = |c: f64| c / total * len_f;
        let before = |c: f64| scaled(c) + u < position + 1.0;
        let last = self.through.len() - 1;
        // the partition: its last row's C is its running mass
        let p = self.through[..last].partition_point(|&t| before(t));
        let base = if p == 0 { 0.0 } else { self.through[p - 1] };
        let Blocks { weights, sums } = self.blocks(p)?;
        // the block, then the row, walking the block in its order
        let blocks = sums.len() - 1;
        let b = sums[1..]
            .partition_point(|&s| before(base + s))
            .min(blocks - 1);
        let (start, end) = (b * BLOCK, ((b + 1) * BLOCK).min(weights.len()));
        let order = block_order(key, p, b, end - start);
        let mut acc = sums[b];
        let mut row = start;
        for i in 0..(end - start) as u64 {
            row = start + order.apply(i) as usize;
            acc += weights[row];
            if !before(base + acc) {
                break;
            }
        }
        Ok(self.starts[p] + row as u64)
    }
}

/// The seeded order in which a balanced lookup walks the `rows` rows of
/// block `b` of partition `p` in the pass of key `key`: a fresh one per
/// block and pass, so which rows of a block get the rounding's extra draw
/// does not follow any pattern of the rows.
fn block_order(key: u64, p: usize, b: usize, rows: usize) -> Permutation {
    let block = mix64((p as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b as u64);
    Permutation::new(rows as u64, mix64(key ^ SALT_BLOCK) ^ block)
}

#[cfg(test)]
mod tests {
    use super::super::rng::draw_bits;
    use super::*;

    /// Tables built from in-memory weights.
    #[derive(Debug)]
    struct Parts {
        weights: Vec<Vec<f64>>,
    }

    impl PartitionSource for Parts {
        fn table(&self, p: usize) -> Result<AliasTable> {
            AliasTable::new(&self.weights[p])
        }
        fn weights(&self, p: usize) -> Result<ScalarBuffer<f64>> {
            Ok(self.weights[p].clone().into())
        }
    }

    fn two_level(weights: &[Vec<f64>]) -> PartitionedWeights {
        let rows: Vec<usize> = weights.iter().map(|w| w.len()).collect();
        let masses: Vec<f64> = weights.iter().map(|w| super::super::mass(w)).collect();
        let parts = Parts {
            weights: weights.to_vec(),
        };
        PartitionedWeights::new(&rows, &masses, Box::new(parts)).unwrap()
    }

    #[test]
    fn preparing_for_many_draws_makes_every_table_a_draw_can_need() {
        let t = two_level(&[vec![1.0, 2.0], vec![0.0, 0.0], vec![3.0], vec![0.5; 4]]);
        t.prepare_all(2).unwrap();
        // the partition without mass is never drawn from: no table
        assert_eq!(t.tables_made(), 3);
        assert!(t.tables[1].get().is_none());
        // and the draws are those of tables made on first use
        let lazy = two_level(&[vec![1.0, 2.0], vec![0.0, 0.0], vec![3.0], vec![0.5; 4]]);
        for k in 0..1000 {
            let bits = draw_bits(5, 0, k);
            assert_eq!(t.draw(bits).unwrap(), lazy.draw(bits).unwrap());
        }
    }

    #[test]
    fn draws_follow_the_flat_law_across_partitions() {
        let weights = vec![
            vec![1.0, 0.0, 3.0],
            vec![0.0, 0.0],
            vec![2.0, 2.0, 0.5, 0.5],
        ];
        let flat: Vec<f64> = weights.concat();
        let total: f64 = flat.iter().sum();
        let t = two_level(&weights);
        let n = 400_000u64;
        let mut counts = vec![0u64; flat.len()];
        for k in 0..n {
            counts[t.draw(draw_bits(3, 0, k)).unwrap() as usize] += 1;
        }
        for (i, &w) in flat.iter().enumerate() {
            let p = w / total;
            let sd = (n as f64 * p * (1.0 - p)).sqrt();
            let diff = (counts[i] as f64 - n as f64 * p).abs();
            assert!(diff <= 5.0 * sd + 1.0, "row {i}: {counts:?}");
            if w == 0.0 {
                assert_eq!(counts[i], 0, "row {i} has weight 0");
            }
        }
    }

    #[test]
    fn one_partition_draws_exactly_as_its_table() {
        let weights: Vec<f64> = (0..500).map(|i| (i % 9) as f64).collect();
        let table = AliasTable::new(&weights).unwrap();
        let t = two_level(&[weights]);
        for k in 0..5_000 {
            let bits = draw_bits(7, 2, k);
            assert_eq!(t.draw(bits).unwrap(), table.draw(bits).unwrap() as u64);
        }
    }

    #[test]
    fn a_draw_makes_only_the_table_of_the_partition_it_lands_in() {
        let weights = vec![vec![1.0; 10], vec![0.0; 10], vec![1.0; 10]];
        let rows: Vec<usize> = vec![10; 3];
        let masses = [10.0, 0.0, 10.0];
        let parts = Box::new(Parts {
            weights: weights.clone(),
        });
        let t = PartitionedWeights::new(&rows, &masses, parts).unwrap();
        let row = t.draw(draw_bits(1, 0, 0)).unwrap();
        assert_eq!(t.tables_made(), 1);
        assert!(!(10..20).contains(&row), "{row}");
        // the partition of weight 0 is never asked for, however many draws
        t.prepare((0..1_000).map(|k| draw_bits(1, 0, k)), 2)
            .unwrap();
        assert_eq!(t.tables_made(), 2);
        assert!(t.tables[1].get().is_none());
    }

    #[test]
    fn prepared_tables_draw_as_lazily_made_ones() {
        let weights: Vec<Vec<f64>> = (0..9)
            .map(|p| (0..50).map(|i| ((i * 7 + p) % 11) as f64).collect())
            .collect();
        let lazy = two_level(&weights);
        let prepared = two_level(&weights);
        prepared
            .prepare((0..300).map(|k| draw_bits(4, 1, k)), 3)
            .unwrap();
        assert_eq!(prepared.tables_made(), 9);
        for k in 0..300 {
            let bits = draw_bits(4, 1, k);
            assert_eq!(lazy.draw(bits).unwrap(), prepared.draw(bits).unwrap());
        }
    }

    #[test]
    fn a_table_that_cannot_be_made_fails_the_draws_that_need_it() {
        #[derive(Debug)]
        struct Broken;
        impl PartitionSource for Broken {
            fn table(&self, p: usize) -> Result<AliasTable> {
                Err(Error::invalid(format!("partition {p} is gone")))
            }
            fn weights(&self, p: usize) -> Result<ScalarBuffer<f64>> {
                Err(Error::invalid(format!("partition {p} is gone")))
            }
        }
        let t = PartitionedWeights::new(&[5, 5], &[1.0, 1.0], Box::new(Broken)).unwrap();
        let err = t.draw(draw_bits(1, 0, 0)).unwrap_err();
        assert!(err.to_string().contains("is gone"), "{err}");
        let err = t
            .prepare((0..50).map(|k| draw_bits(1, 0, k)), 2)
            .unwrap_err();
        assert!(err.to_string().contains("is gone"), "{err}");
    }

    /// The flat balanced lookup over all rows: the block whose running sum
    /// (summed in row order, scaled, the last exactly `len`) first reaches
    /// the position, then the row of that block, walked in its order.
    fn flat_balanced(weights: &[f64], len: u64, position: f64, u: f64, key: u64) -> u64 {
        let total: f64 = weights.iter().sum();
        let reaches = |c: f64| c / total * len as f64 + u >= position + 1.0;
        let blocks: Vec<&[f64]> = weights.chunks(BLOCK).collect();
        let mut acc = 0.0;
        for (b, block) in blocks.iter().enumerate() {
            let before = acc;
            acc = block.iter().fold(acc, |a, w| a + w);
            if !reaches(acc) && b + 1 < blocks.len() {
                continue;
            }
            let order = block_order(key, 0, b, block.len());
            let mut sum = before;
            let mut row = 0;
            for i in 0..block.len() as u64 {
                row = b * BLOCK + order.apply(i) as usize;
                sum += weights[row];
                if reaches(sum) {
                    break;
                }
            }
            return row as u64;
        }
        unreachable!("the last block is always reached")
    }

    #[test]
    fn balanced_rows_of_one_partition_are_the_flat_lookups() {
        // 10,000 rows over many blocks: the lookup crosses block boundaries
        let weights: Vec<f64> = (0..10_000).map(|i| ((i * 31) % 7) as f64 * 0.3).collect();
        let t = PartitionedWeights::one(&weights).unwrap();
        for (len, u) in [(10_000u64, 0.25), (777, 0.9), (123_457, 0.0)] {
            for position in (0..len).step_by(7) {
                let p = position as f64;
                assert_eq!(
                    t.balanced_row(len, p, u, 17).unwrap(),
                    flat_balanced(&weights, len, p, u, 17),
                    "len {len} position {position}"
                );
            }
        }
    }

    #[test]
    fn balanced_counts_over_partitions_are_floor_or_ceil_of_expectation() {
        let weights: Vec<Vec<f64>> = vec![
            (0..5000).map(|i| ((i * 13) % 5) as f64).collect(),
            vec![0.0; 10],
            (0..9000).map(|i| 0.5 + ((i * 7) % 3) as f64).collect(),
            vec![2.5],
        ];
        let flat = weights.concat();
        let total: f64 = flat.iter().sum();
        let t = two_level(&weights);
        for (len, u) in [(14_011u64, 0.5), (50_000, 0.01), (3_000, 0.99)] {
            let mut counts = vec![0u64; flat.len()];
            for position in 0..len {
                counts[t.balanced_row(len, position as f64, u, 5).unwrap() as usize] += 1;
            }
            for (i, &c) in counts.iter().enumerate() {
                let e = len as f64 * flat[i] / total;
                assert!(
                    c == e.floor() as u64 || c == e.ceil() as u64,
                    "len {len} row {i}: {c} vs {e}"
                );
            }
        }
    }
}

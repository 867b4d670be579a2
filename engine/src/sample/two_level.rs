//! Weighted draws with replacement over a partitioned population: a table
//! over the partitions' weight masses picks a partition, that partition's own
//! alias table a row of it. `P(row) = mass_p / total × w_row / mass_p`, the
//! flat law, and a draw reads nothing of the partitions it does not land in:
//! a partition's table is mapped (or built and stored) when a draw first
//! lands there, and the tables a run of draws needs can be made ahead, in
//! parallel ([`TwoLevelAlias::prepare`]). A partition's table is named by
//! its weight column's content, so a reweight that changes one partition
//! builds one table.
//!
//! With one partition a draw is that partition's table's draw of the same
//! bits: the sequence of the flat table, draw for draw.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use super::alias::AliasTable;
use super::rng::mix64;
use crate::{Error, Result};

/// Salt of the bits a draw's row in its partition takes (the partition's
/// are the draw's own bits).
const SALT_ROW: u64 = 0x726f_775f_696e_5f70;

/// Where a population's per-partition alias tables come from.
pub trait PartitionTables: Send + Sync + std::fmt::Debug {
    /// Map, or build and store, the alias table of partition `p`'s weights.
    fn table(&self, p: usize) -> Result<AliasTable>;
}

/// A table given whole (a population held in memory).
#[derive(Debug)]
struct Given(AliasTable);

impl PartitionTables for Given {
    fn table(&self, _: usize) -> Result<AliasTable> {
        Ok(self.0.clone())
    }
}

/// Weighted sampling with replacement in O(1) per draw over partitions
/// whose tables are made on first use.
#[derive(Debug)]
pub struct TwoLevelAlias {
    /// Over the partitions' masses; `None` with one partition.
    top: Option<AliasTable>,
    /// The first row of each partition.
    starts: Vec<u64>,
    tables: Vec<OnceLock<AliasTable>>,
    source: Box<dyn PartitionTables>,
}

impl TwoLevelAlias {
    /// Partitions of `rows[p]` rows and weight mass `masses[p]`; `source`
    /// makes partition `p`'s table when a draw first needs it.
    pub fn new(
        rows: &[usize],
        masses: &[f64],
        source: Box<dyn PartitionTables>,
    ) -> Result<TwoLevelAlias> {
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
        Ok(TwoLevelAlias {
            top,
            starts,
            tables: rows.iter().map(|_| OnceLock::new()).collect(),
            source,
        })
    }

    /// One partition whose table is `table`.
    pub fn flat(table: AliasTable) -> TwoLevelAlias {
        let tables = vec![OnceLock::from(table.clone())];
        TwoLevelAlias {
            top: None,
            starts: vec![0],
            tables,
            source: Box::new(Given(table)),
        }
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
        Ok(self.starts[p] + self.table(p)?.draw(inner)? as u64)
    }

    /// Make the tables of every partition the draws of `bits` land in that
    /// are not made yet, on up to `threads` threads. Drawing them then reads
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
        let needed: Vec<usize> = needed.into_iter().collect();
        let threads = threads.clamp(1, needed.len().max(1));
        if threads == 1 {
            return needed.iter().try_for_each(|&p| self.table(p).map(|_| ()));
        }
        let next = AtomicUsize::new(0);
        let failed = Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    while let Some(&p) = needed.get(next.fetch_add(1, Ordering::Relaxed)) {
                        if let Err(e) = self.table(p) {
                            failed
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .get_or_insert(e);
                            return;
                        }
                    }
                });
            }
        });
        match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// How many partitions' tables are made.
    pub fn tables_made(&self) -> usize {
        self.tables.iter().filter(|t| t.get().is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::super::rng::draw_bits;
    use super::*;

    /// Tables built from in-memory weights, counting what they were asked for.
    #[derive(Debug)]
    struct Parts {
        weights: Vec<Vec<f64>>,
        asked: Mutex<Vec<usize>>,
    }

    impl PartitionTables for Parts {
        fn table(&self, p: usize) -> Result<AliasTable> {
            self.asked.lock().unwrap().push(p);
            AliasTable::new(&self.weights[p])
        }
    }

    fn two_level(weights: &[Vec<f64>]) -> TwoLevelAlias {
        let rows: Vec<usize> = weights.iter().map(|w| w.len()).collect();
        let masses: Vec<f64> = weights.iter().map(|w| super::super::mass(w)).collect();
        let parts = Parts {
            weights: weights.to_vec(),
            asked: Mutex::default(),
        };
        TwoLevelAlias::new(&rows, &masses, Box::new(parts)).unwrap()
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
            asked: Mutex::default(),
        });
        let t = TwoLevelAlias::new(&rows, &masses, parts).unwrap();
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
        impl PartitionTables for Broken {
            fn table(&self, p: usize) -> Result<AliasTable> {
                Err(Error::invalid(format!("partition {p} is gone")))
            }
        }
        let t = TwoLevelAlias::new(&[5, 5], &[1.0, 1.0], Box::new(Broken)).unwrap();
        let err = t.draw(draw_bits(1, 0, 0)).unwrap_err();
        assert!(err.to_string().contains("is gone"), "{err}");
        let err = t
            .prepare((0..50).map(|k| draw_bits(1, 0, k)), 2)
            .unwrap_err();
        assert!(err.to_string().contains("is gone"), "{err}");
    }
}

//! The sampling modes. Every draw is a pure function of `(seed, epoch, k)`
//! and the snapshot's weights, so any split of `k` over ranks and workers,
//! and any resume position, gives the same global sequence.

use std::sync::Arc;

use super::mixture::MixtureDraws;
use super::partitioned::PartitionedWeights;
use super::rng::{draw_bits, mix64, unit_f64, Permutation};
use super::Weights;
use crate::{Error, Result};

/// Which pure function of `(seed, epoch, k)` and the snapshot the draws
/// are: a loader state records it, so that a state is never resumed onto a
/// different sequence. 1: weighted draws from one alias table over every
/// row (builds before partitioned draws), balanced draws from the running
/// sum of every row's weight; 2: weighted from a table over the
/// partitions' masses, then the partition's own table, balanced from the
/// running sum of the masses, then the partition's. The two are the same
/// sequence for a snapshot of one partition, and for permutations and
/// weighted draws without replacement. 3: as 2, but a balanced lookup
/// walks each block of 256 rows in a seeded order (in row order, a pattern
/// repeating with the rows was rounded alike in every block); only
/// balanced draws differ from 2. 4: as 3, but balanced draws inside a
/// mixture group round over the group's draws in the epoch (3 rounded each
/// pass over the group's rows anew); only balanced draws under a mixture
/// differ from 3.
pub const DRAW_SCHEME: u64 = 4;

/// How the rows of an epoch are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sampling {
    /// Weighted, with replacement (alias tables: one over the partitions'
    /// masses, one per partition). The default.
    Replacement,
    /// Every row exactly once per epoch, in a seeded order.
    Permutation,
    /// A seeded weighted order without repeats (Efraimidis–Spirakis keys);
    /// rows of weight 0 never appear.
    WeightedWithoutReplacement,
    /// Row `i` appears the floor or the ceiling of `epoch_len * w_i / sum(w)`
    /// times, in a seeded order.
    Balanced,
}

impl Sampling {
    pub fn parse(name: &str) -> Result<Sampling> {
        match name {
            "replacement" => Ok(Sampling::Replacement),
            "permutation" => Ok(Sampling::Permutation),
            "weighted_without_replacement" => Ok(Sampling::WeightedWithoutReplacement),
            "balanced" => Ok(Sampling::Balanced),
            other => Err(Error::invalid(format!(
                "unknown sampling {other:?}: expected \"replacement\", \"permutation\", \
                 \"weighted_without_replacement\" or \"balanced\""
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Sampling::Replacement => "replacement",
            Sampling::Permutation => "permutation",
            Sampling::WeightedWithoutReplacement => "weighted_without_replacement",
            Sampling::Balanced => "balanced",
        }
    }

    /// Whether this mode's draws under draw scheme `scheme`, over a
    /// snapshot of `partitions` partitions (with a `mixture` or not), are
    /// the draws this build makes.
    pub fn draws_as_scheme(self, scheme: u64, partitions: usize, mixture: bool) -> bool {
        let balanced = self == Sampling::Balanced;
        match scheme {
            DRAW_SCHEME => true,
            3 => !(balanced && mixture),
            2 => !balanced,
            1 => !balanced && (partitions == 1 || self != Sampling::Replacement),
            _ => false,
        }
    }

    /// Draws per epoch when the caller does not choose: the number of rows
    /// (rows of positive weight, for weighted without replacement).
    /// `weights` is asked for only by the modes whose default depends on
    /// them (a population's weights may be read and checked only on demand).
    pub fn default_epoch_len<'w>(
        self,
        rows: usize,
        weights: &dyn Fn() -> Result<Weights<'w>>,
    ) -> Result<u64> {
        Ok(match self {
            Sampling::WeightedWithoutReplacement => {
                weights()?.iter().filter(|&&w| w > 0.0).count() as u64
            }
            _ => rows as u64,
        })
    }
}

/// `w * 2^exponent`, exact while the result is a normal double (in steps
/// a double holds: 2^1074 is not one).
fn times_two_to(w: f64, exponent: i32) -> f64 {
    let mut out = w;
    let mut left = exponent;
    while left != 0 {
        let step = left.clamp(-1000, 1000);
        out *= 2f64.powi(step);
        left -= step;
    }
    out
}

/// The rows of positive weight in a seeded weighted order without repeats
/// (Efraimidis–Spirakis keys, the largest first).
fn weighted_order(weights: &Weights<'_>, seed: u64, epoch: u64) -> Result<Arc<[u32]>> {
    // ln(u) / w overflows for w below ~2e-307 (every key of equal
    // tiny weights became -inf: rows in row order); scaling all
    // weights by one power of two keeps the keys' order and is
    // exact. Ordinary weights are not scaled, so keep their keys.
    let (smallest, largest) = weights
        .iter()
        .filter(|&&w| w > 0.0)
        .fold((f64::INFINITY, 0f64), |(lo, hi), &w| (lo.min(w), hi.max(w)));
    // the largest becomes about 1 (none overflows; rows 10^290
    // times lighter than it may round to -inf keys: last)
    let exponent = match smallest < 1e-290 {
        true => -(largest.log2().floor() as i32),
        false => 0,
    };
    let mut keyed: Vec<(f64, u32)> = weights
        .iter()
        .enumerate()
        .filter(|(_, &w)| w > 0.0)
        .map(|(i, &w)| {
            let bits = draw_bits(seed ^ SALT_WEIGHTED, epoch, i as u64);
            // u in (0, 1]: log is finite
            let u = ((bits >> 11) as f64 + 1.0) * (1.0 / (1u64 << 53) as f64);
            (u.ln() / times_two_to(w, exponent), i as u32)
        })
        .collect();
    if keyed.is_empty() {
        return Err(Error::invalid("no row has a positive weight"));
    }
    keyed.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    Ok(keyed.into_iter().map(|(_, i)| i).collect())
}

fn stream_key(seed: u64, epoch: u64, pass: u64, salt: u64) -> u64 {
    draw_bits(seed ^ salt, epoch, pass)
}

const SALT_PERMUTATION: u64 = 0x7065_726d_7574_6521;
const SALT_BALANCED: u64 = 0x6261_6c61_6e63_6564;
const SALT_WEIGHTED: u64 = 0x7765_6967_6874_6564;

/// The draws of one epoch under one sampling mode.
#[derive(Debug, Clone)]
pub struct EpochSampler {
    seed: u64,
    epoch: u64,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Replacement(Arc<PartitionedWeights>),
    Permutation {
        n: u64,
    },
    Balanced {
        weights: Arc<PartitionedWeights>,
        len: u64,
    },
    Weighted {
        order: Arc<[u32]>,
    },
    /// Groups at target shares, each drawn by its own sampler.
    Mixture(Arc<MixtureDraws>),
}

/// The most rows `WeightedWithoutReplacement` draws from: each process
/// sorts every row by its key, and holds the order as u32 rows.
const MAX_ROWS_SORTED: usize = u32::MAX as usize;

impl EpochSampler {
    /// The sampler of a mixture: draw `k` is [`MixtureDraws::draw`]'s row.
    pub fn mixture(seed: u64, epoch: u64, draws: Arc<MixtureDraws>) -> EpochSampler {
        EpochSampler {
            seed,
            epoch,
            kind: Kind::Mixture(draws),
        }
    }

    /// The mixture this sampler draws from, if it draws from one.
    pub fn mixture_draws(&self) -> Option<&Arc<MixtureDraws>> {
        match &self.kind {
            Kind::Mixture(draws) => Some(draws),
            _ => None,
        }
    }

    /// The sampler over a population of `rows` rows. `weights` is asked
    /// for only by the modes that need every weight (not `Permutation`, nor
    /// `Replacement` and `Balanced` given the population's `partitioned`
    /// weights); `epoch_len` is needed for `Balanced` (the number of draws
    /// its counts are computed for).
    pub fn new<'w>(
        sampling: Sampling,
        rows: usize,
        weights: &dyn Fn() -> Result<Weights<'w>>,
        partitioned: Option<&Arc<PartitionedWeights>>,
        seed: u64,
        epoch: u64,
        epoch_len: u64,
    ) -> Result<EpochSampler> {
        if rows == 0 {
            return Err(Error::invalid("cannot sample from an empty population"));
        }
        if rows > MAX_ROWS_SORTED && sampling == Sampling::WeightedWithoutReplacement {
            return Err(Error::invalid(format!(
                "weighted_without_replacement sorts every row in each process: it draws from at \
                 most 2^32 - 1 rows, this population has {rows} (\"replacement\", \"balanced\" \
                 and \"permutation\" take any size; docs/scale.md)"
            )));
        }
        let partitioned = || -> Result<Arc<PartitionedWeights>> {
            match partitioned {
                Some(p) => Ok(p.clone()),
                None => Ok(Arc::new(PartitionedWeights::one(&weights()?.to_vec())?)),
            }
        };
        let kind = match sampling {
            Sampling::Replacement => Kind::Replacement(partitioned()?),
            Sampling::Permutation => Kind::Permutation { n: rows as u64 },
            Sampling::Balanced => {
                if epoch_len == 0 {
                    return Err(Error::invalid(
                        "balanced sampling needs a positive epoch_len",
                    ));
                }
                let weights = partitioned()?;
                let total = weights.total();
                if !(total.is_finite() && total > 0.0) {
                    return Err(Error::invalid(
                        "weights must be finite, non-negative, with a positive sum",
                    ));
                }
                Kind::Balanced {
                    weights,
                    len: epoch_len,
                }
            }
            Sampling::WeightedWithoutReplacement => Kind::Weighted {
                order: weighted_order(&weights()?, seed, epoch)?,
            },
        };
        Ok(EpochSampler { seed, epoch, kind })
    }

    /// The row of draw `k`. Draws past the epoch length continue the pattern
    /// (a new pass of the permutation, the balanced counts, or the weighted
    /// order), which is how ranks are padded to equal counts. An error is a
    /// damaged table the draw had to read (a stored alias table's chunk).
    pub fn row(&self, k: u64) -> Result<u64> {
        Ok(match &self.kind {
            Kind::Replacement(alias) => alias.draw(draw_bits(self.seed, self.epoch, k))?,
            Kind::Permutation { n } => {
                let perm = Permutation::new(
                    *n,
                    stream_key(self.seed, self.epoch, k / n, SALT_PERMUTATION),
                );
                perm.apply(k % n)
            }
            Kind::Balanced { weights, len } => {
                let pass = k / len;
                let key = stream_key(self.seed, self.epoch, pass, SALT_BALANCED);
                let p = Permutation::new(*len, key).apply(k % len) as f64;
                let u = unit_f64(mix64(key ^ 0x5bd1_e995));
                // Row r covers positions floor(C[r-1] + u) .. floor(C[r] + u):
                // the first r with C[r] + u >= p + 1.
                weights.balanced_row(*len, p, u, key)?
            }
            Kind::Weighted { order } => u64::from(order[(k % order.len() as u64) as usize]),
            Kind::Mixture(draws) => draws.draw(k)?.1,
        })
    }

    /// The rows of draws `ks`, on up to `threads` threads (after making
    /// what they read, see [`EpochSampler::prepare`]): the draws are
    /// independent, so each thread fills its own run of them.
    pub fn rows(&self, ks: std::ops::Range<u64>, threads: usize) -> Result<Vec<u64>> {
        self.prepare(ks.clone(), threads)?;
        let n = ks.end.saturating_sub(ks.start) as usize;
        let mut out = vec![0u64; n];
        // below a few thousand draws a thread costs more than it saves
        let threads = threads.clamp(1, n.div_ceil(1 << 12).max(1));
        let per = n.div_ceil(threads).max(1);
        let fill = |at: usize, slots: &mut [u64]| -> Result<()> {
            for (i, slot) in slots.iter_mut().enumerate() {
                *slot = self.row(ks.start + (at + i) as u64)?;
            }
            Ok(())
        };
        if threads == 1 {
            fill(0, &mut out)?;
            return Ok(out);
        }
        std::thread::scope(|scope| {
            let runs: Vec<_> = out
                .chunks_mut(per)
                .enumerate()
                .map(|(i, slots)| scope.spawn(move || fill(i * per, slots)))
                .collect();
            runs.into_iter()
                .try_for_each(|run| run.join().expect("a draw thread panicked"))
        })?;
        Ok(out)
    }

    /// Ask the kernel to start reading, without waiting, the stored alias
    /// entries draws `ks` read (`Replacement`, once their tables are made:
    /// see [`EpochSampler::prepare`]), so that their reads go to the disk
    /// together rather than one after another. `Balanced` reads a block of
    /// its partition's weights in place and is not advised; the other
    /// modes read nothing stored per draw.
    pub fn advise(&self, ks: std::ops::Range<u64>) {
        if let Kind::Replacement(alias) = &self.kind {
            for k in ks {
                alias.advise(draw_bits(self.seed, self.epoch, k));
            }
        }
    }

    /// Make ahead (building on up to `threads` threads) what draws `ks` will read
    /// first: for `Replacement`, the alias tables of the partitions they
    /// land in (a partition's table is otherwise built by the draw that
    /// first lands there, alone). The other modes have nothing to make.
    pub fn prepare(&self, ks: std::ops::Range<u64>, threads: usize) -> Result<()> {
        match &self.kind {
            // many draws land in nearly every partition: make those tables
            // rather than hash every draw twice to find them
            Kind::Replacement(alias)
                if ks.end.saturating_sub(ks.start) >= 64 * alias.num_partitions() as u64 =>
            {
                alias.prepare_all(threads)
            }
            Kind::Replacement(alias) => {
                alias.prepare(ks.map(|k| draw_bits(self.seed, self.epoch, k)), threads)
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(sampling: Sampling, w: &[f64], seed: u64, epoch: u64, len: u64) -> EpochSampler {
        EpochSampler::new(sampling, w.len(), &|| Ok(w.into()), None, seed, epoch, len).unwrap()
    }

    #[test]
    fn rows_on_threads_are_the_draws_one_by_one() {
        let w: Vec<f64> = (0..5_000).map(|i| (i % 13) as f64).collect();
        for sampling in [
            Sampling::Replacement,
            Sampling::Permutation,
            Sampling::Balanced,
            Sampling::WeightedWithoutReplacement,
        ] {
            let s = sampler(sampling, &w, 9, 2, 30_000);
            let one: Vec<u64> = (7..20_007).map(|k| s.row(k).unwrap()).collect();
            for threads in [1, 2, 3, 8] {
                assert_eq!(s.rows(7..20_007, threads).unwrap(), one, "{sampling:?}");
            }
            assert!(s.rows(5..5, 2).unwrap().is_empty());
        }
    }

    #[test]
    fn permutations_are_bijections_for_awkward_sizes() {
        for n in [1u64, 2, 3, 5, 17, 1000, 4097] {
            let p = Permutation::new(n, 42);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let j = p.apply(i);
                assert!(!seen[j as usize], "n={n}: {j} twice");
                seen[j as usize] = true;
            }
        }
    }

    #[test]
    fn permutation_covers_every_row_once_and_epochs_differ() {
        let w = vec![1.0; 300];
        let s0 = sampler(Sampling::Permutation, &w, 9, 0, 300);
        let s1 = sampler(Sampling::Permutation, &w, 9, 1, 300);
        let mut rows: Vec<u64> = (0..300).map(|k| s0.row(k).unwrap()).collect();
        let first = rows.clone();
        rows.sort_unstable();
        assert_eq!(rows, (0..300).collect::<Vec<_>>());
        assert_ne!(
            first,
            (0..300).map(|k| s1.row(k).unwrap()).collect::<Vec<_>>()
        );
        assert_ne!(first, (0..300).collect::<Vec<_>>());
    }

    #[test]
    fn balanced_counts_are_floor_or_ceil_of_expectation() {
        let w: Vec<f64> = (0..97)
            .map(|i| ((i * 7919) % 13) as f64 + if i % 5 == 0 { 0.0 } else { 0.5 })
            .collect();
        let total: f64 = w.iter().sum();
        for len in [50u64, 97, 1000, 1234] {
            for seed in 0..5 {
                let s = sampler(Sampling::Balanced, &w, seed, 3, len);
                let mut counts = vec![0u64; w.len()];
                for k in 0..len {
                    counts[s.row(k).unwrap() as usize] += 1;
                }
                for (i, &c) in counts.iter().enumerate() {
                    let e = len as f64 * w[i] / total;
                    assert!(
                        c == e.floor() as u64 || c == e.ceil() as u64,
                        "len {len} row {i}: {c} vs {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn weighted_without_replacement_never_repeats_and_skips_zero_weights() {
        let w = [3.0, 0.0, 1.0, 2.0, 0.0, 5.0];
        let s = sampler(Sampling::WeightedWithoutReplacement, &w, 1, 0, 4);
        let mut rows: Vec<u64> = (0..4).map(|k| s.row(k).unwrap()).collect();
        rows.sort_unstable();
        assert_eq!(rows, vec![0, 2, 3, 5]);
        assert_eq!(
            Sampling::WeightedWithoutReplacement
                .default_epoch_len(w.len(), &|| Ok((&w[..]).into()))
                .unwrap(),
            4
        );
    }

    #[test]
    fn heavier_rows_come_first_more_often_without_replacement() {
        let w = [1.0, 9.0];
        let firsts = (0..2000)
            .filter(|&seed| {
                sampler(Sampling::WeightedWithoutReplacement, &w, seed, 0, 2)
                    .row(0)
                    .unwrap()
                    == 1
            })
            .count();
        // P(row 1 first) = 0.9; sd over 2000 trials is ~13
        assert!((1730..=1870).contains(&firsts), "{firsts}");
    }

    /// Per-label draw counts of `epochs` balanced epochs of `len` draws
    /// over rows of `labels` and weights `w`.
    fn balanced_label_counts(labels: &[usize], w: &[f64], len: u64, epochs: u64) -> Vec<Vec<f64>> {
        let k = labels.iter().max().unwrap() + 1;
        (0..epochs)
            .map(|e| {
                let s = sampler(Sampling::Balanced, w, e % 7, e, len);
                let mut counts = vec![0.0; k];
                for d in 0..len {
                    counts[labels[s.row(d).unwrap() as usize]] += 1.0;
                }
                counts
            })
            .collect()
    }

    #[test]
    fn balanced_epochs_are_balanced_for_every_column_whatever_the_row_order() {
        // labels interleaved (i % 5, weights 1..5 by label: in row order a
        // label got no draw in 21 of 30 epochs), in sorted runs, and in a
        // period (2) that divides the block size
        let n = 1500;
        let interleaved: Vec<usize> = (0..n).map(|i| i % 5).collect();
        let sorted: Vec<usize> = (0..n).map(|i| i * 5 / n).collect();
        let pairs: Vec<usize> = (0..n).map(|i| (i % 2) * 2 + (i / 700).min(1)).collect();
        for (what, labels) in [
            ("interleaved", interleaved),
            ("sorted", sorted),
            ("period 2", pairs),
        ] {
            let w: Vec<f64> = labels.iter().map(|&l| (l + 1) as f64).collect();
            let total: f64 = w.iter().sum();
            let len = 1000u64;
            let epochs = 200;
            let counts = balanced_label_counts(&labels, &w, len, epochs);
            for label in 0..counts[0].len() {
                let share: f64 = labels
                    .iter()
                    .zip(&w)
                    .filter(|(&l, _)| l == label)
                    .map(|(_, w)| w)
                    .sum::<f64>()
                    / total;
                let expected = len as f64 * share;
                let of: Vec<f64> = counts.iter().map(|c| c[label]).collect();
                let mean = of.iter().sum::<f64>() / epochs as f64;
                let var = of.iter().map(|c| (c - mean).powi(2)).sum::<f64>() / (epochs - 1) as f64;
                let binomial = len as f64 * share * (1.0 - share);
                // a value expected 20 or more times is never absent
                if expected >= 20.0 {
                    assert!(of.iter().all(|&c| c > 0.0), "{what} label {label}: {of:?}");
                }
                // no more spread than independent draws (the estimate of the
                // variance from 200 epochs has a relative sd of ~10 %)
                assert!(
                    var <= 1.3 * binomial,
                    "{what} label {label}: variance {var} vs binomial {binomial}"
                );
                assert!(
                    (mean - expected).abs() <= 4.0 * (binomial / epochs as f64).sqrt() + 1.0,
                    "{what} label {label}: mean {mean} vs {expected}"
                );
            }
        }
    }

    #[test]
    fn equal_weights_draw_uniformly_at_any_scale() {
        // subnormal, the smallest normal, tiny, huge (sums stay finite)
        for scale in [2e-310, 5e-324 * 64.0, f64::MIN_POSITIVE, 1e-300, 1.0, 1e300] {
            let n = 50usize;
            let w = vec![scale; n];
            // balanced: every row once per epoch of n draws
            let s = sampler(Sampling::Balanced, &w, 3, 1, n as u64);
            let mut rows: Vec<u64> = (0..n as u64).map(|k| s.row(k).unwrap()).collect();
            rows.sort_unstable();
            assert_eq!(
                rows,
                (0..n as u64).collect::<Vec<_>>(),
                "balanced at {scale:e}"
            );
            // with replacement: chi-square of 50,000 draws on 49 degrees of
            // freedom (p = 0.999 at 85.4)
            let s = sampler(Sampling::Replacement, &w, 3, 1, 0);
            let draws = 50_000u64;
            let mut counts = vec![0f64; n];
            for k in 0..draws {
                counts[s.row(k).unwrap() as usize] += 1.0;
            }
            let e = draws as f64 / n as f64;
            let chi2: f64 = counts.iter().map(|c| (c - e).powi(2) / e).sum();
            assert!(chi2 < 85.4, "replacement at {scale:e}: chi-square {chi2}");
            // without replacement: the first row is any row, not row 0
            let firsts: std::collections::BTreeSet<u64> = (0..200)
                .map(|seed| {
                    sampler(Sampling::WeightedWithoutReplacement, &w, seed, 0, n as u64)
                        .row(0)
                        .unwrap()
                })
                .collect();
            assert!(
                firsts.len() > 40,
                "without replacement at {scale:e}: {firsts:?}"
            );
        }
    }
}

//! Mixtures: draws from groups of rows (the values of one column) at target
//! shares. Which group draw `k` comes from is a fixed interleaving of the
//! groups ([`Interleave`]) in which every prefix meets the shares to within
//! one draw; which row of the group it is, the group's own sampler over its
//! rows, at the group's own count of draws.

use std::sync::Arc;

use super::EpochSampler;
use crate::{Error, Result};

/// The finest share a mixture keeps: shares are stored as integer parts of
/// a whole of at most this many (the whole is also the interleaving's
/// period).
pub const SHARE_WHOLE: u32 = 1 << 16;

/// The most groups a mixture has (the interleaving costs groups × whole
/// steps to build).
pub const MAX_GROUPS: usize = 1024;

/// Target shares as integer parts of a whole: what a manifest stores, so
/// that every process draws by the same exact fractions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shares {
    parts: Vec<u32>,
    whole: u32,
}

impl Shares {
    /// Shares from non-negative finite numbers with a positive sum (any
    /// scale: they are normalised). Shares that are multiples of 1/10,
    /// 1/100, 1/1000 or 1/10000 are kept exactly; others to the nearest
    /// 1/65536, by largest remainder.
    pub fn from_f64(shares: &[f64]) -> Result<Shares> {
        if shares.is_empty() || shares.len() > MAX_GROUPS {
            return Err(Error::invalid(format!(
                "a mixture has 1 to {MAX_GROUPS} groups, not {}",
                shares.len()
            )));
        }
        if let Some(bad) = shares.iter().find(|s| !(s.is_finite() && **s >= 0.0)) {
            return Err(Error::invalid(format!(
                "a mixture's shares must be finite and non-negative, got {bad}"
            )));
        }
        let sum: f64 = shares.iter().sum();
        if !(sum > 0.0 && sum.is_finite()) {
            return Err(Error::invalid(
                "a mixture's shares must have a positive, finite sum",
            ));
        }
        let p: Vec<f64> = shares.iter().map(|s| s / sum).collect();
        for whole in [10u32, 100, 1000, 10_000] {
            let scaled: Vec<f64> = p.iter().map(|x| x * whole as f64).collect();
            if scaled.iter().all(|x| (x - x.round()).abs() < 1e-9) {
                let parts: Vec<u32> = scaled.iter().map(|x| x.round() as u32).collect();
                if parts.iter().sum::<u32>() == whole {
                    return Shares::new(parts);
                }
            }
        }
        // largest remainder: the floors, then one more for the largest
        // remainders until the parts make the whole (ties to the lower group)
        let whole = SHARE_WHOLE as f64;
        let mut parts: Vec<u32> = p.iter().map(|x| (x * whole).floor() as u32).collect();
        let short = SHARE_WHOLE - parts.iter().sum::<u32>().min(SHARE_WHOLE);
        let mut order: Vec<usize> = (0..p.len()).collect();
        order.sort_by(|&a, &b| {
            let ra = p[a] * whole - parts[a] as f64;
            let rb = p[b] * whole - parts[b] as f64;
            rb.total_cmp(&ra).then(a.cmp(&b))
        });
        for &g in order.iter().take(short as usize) {
            parts[g] += 1;
        }
        Shares::new(parts)
    }

    /// Shares of `parts` out of their sum, reduced to the smallest whole.
    pub fn new(mut parts: Vec<u32>) -> Result<Shares> {
        let whole: u64 = parts.iter().map(|&p| u64::from(p)).sum();
        if whole == 0 || whole > u64::from(SHARE_WHOLE) || parts.len() > MAX_GROUPS {
            return Err(Error::invalid(format!(
                "a mixture's parts must sum to 1..={SHARE_WHOLE} over at most {MAX_GROUPS} \
                 groups, got {parts:?}"
            )));
        }
        let divisor = parts.iter().fold(0u32, |g, &p| gcd(g, p));
        for p in parts.iter_mut() {
            *p /= divisor;
        }
        Ok(Shares {
            whole: whole as u32 / divisor,
            parts,
        })
    }

    /// Each group's part of [`Shares::whole`].
    pub fn parts(&self) -> &[u32] {
        &self.parts
    }

    /// The whole the parts make: the interleaving's period.
    pub fn whole(&self) -> u32 {
        self.whole
    }

    /// Group `g`'s share.
    pub fn share(&self, g: usize) -> f64 {
        f64::from(self.parts[g]) / f64::from(self.whole)
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The groups of draws `0, 1, 2, ...` for one set of shares: for every `k`,
/// each group's count among the first `k` draws is within one of
/// `share × k` (strictly: within `1 - 1/(2n - 2)` for `n` groups of positive
/// share). Tijdeman's solution of the chairman assignment problem: at each
/// step, of the groups not ahead of their share by more than that margin,
/// the one whose next draw is due soonest. The sequence repeats with period
/// [`Shares::whole`] (each group has then had exactly its part), so it is
/// computed once, as a table.
#[derive(Debug)]
pub struct Interleave {
    shares: Shares,
    /// The group of each position of one period.
    group: Vec<u16>,
    /// The draws of that group before that position, within the period.
    index: Vec<u32>,
}

impl Interleave {
    pub fn new(shares: Shares) -> Interleave {
        let whole = shares.whole as usize;
        let positive: Vec<usize> = (0..shares.parts.len())
            .filter(|&g| shares.parts[g] > 0)
            .collect();
        let mut group = Vec::with_capacity(whole);
        let mut index = Vec::with_capacity(whole);
        let mut counts = vec![0u32; shares.parts.len()];
        // margin C = 1 / m: eligible when m (w t - c W) >= W; due at (m (c + 1) - 1) / (m w)
        let m = (2 * positive.len()).saturating_sub(2).max(1) as i128;
        let w_all = i128::from(shares.whole);
        for t in 1..=whole as i128 {
            let mut best: Option<(usize, i128)> = None;
            for &g in &positive {
                let w = i128::from(shares.parts[g]);
                let c = i128::from(counts[g]);
                if m * (w * t - c * w_all) < w_all {
                    continue;
                }
                let due = m * (c + 1) - 1;
                let sooner = match best {
                    None => true,
                    // due / w < best_due / best_w, ties to the lower group
                    Some((b, b_due)) => due * i128::from(shares.parts[b]) < b_due * w,
                };
                if sooner {
                    best = Some((g, due));
                }
            }
            // Tijdeman: some group is always eligible
            let g = best.map_or(positive[0], |(g, _)| g);
            group.push(g as u16);
            index.push(counts[g]);
            counts[g] += 1;
        }
        debug_assert!(counts.iter().zip(&shares.parts).all(|(c, p)| c == p));
        Interleave {
            shares,
            group,
            index,
        }
    }

    pub fn shares(&self) -> &Shares {
        &self.shares
    }

    /// The group of draw `k` and how many draws of that group precede it.
    #[inline]
    pub fn at(&self, k: u64) -> (usize, u64) {
        let whole = u64::from(self.shares.whole);
        let (pass, at) = (k / whole, (k % whole) as usize);
        let g = self.group[at] as usize;
        (
            g,
            pass * u64::from(self.shares.parts[g]) + u64::from(self.index[at]),
        )
    }

    /// Each group's draws among the first `k`.
    pub fn counts(&self, k: u64) -> Vec<u64> {
        let whole = u64::from(self.shares.whole);
        let pass = k / whole;
        let mut counts: Vec<u64> = self
            .shares
            .parts
            .iter()
            .map(|&p| pass * u64::from(p))
            .collect();
        for &g in &self.group[..(k % whole) as usize] {
            counts[g as usize] += 1;
        }
        counts
    }
}

/// One group's rows (positions in the snapshot, in row order) and the
/// sampler over them: the group's `i`-th draw is `rows[sampler.row(i)]`.
#[derive(Debug, Clone)]
pub struct Group {
    pub rows: Arc<[u32]>,
    pub sampler: EpochSampler,
}

/// The draws of one epoch from a mixture: draw `k` is the
/// [`Interleave`]'s group of `k`, and that group's draw at its count so far.
#[derive(Debug, Clone)]
pub struct MixtureDraws {
    interleave: Arc<Interleave>,
    /// By group, as the shares list them (`None`: a group of share 0).
    groups: Arc<Vec<Option<Group>>>,
    /// Each group's draws before draw 0 (an epoch's earlier mixtures'),
    /// where its own sequence continues; empty: none.
    base: Vec<u64>,
}

impl MixtureDraws {
    /// Every group of positive share must have its rows.
    pub fn new(interleave: Arc<Interleave>, groups: Vec<Option<Group>>) -> Result<MixtureDraws> {
        let parts = interleave.shares().parts();
        if groups.len() != parts.len() {
            return Err(Error::invalid(format!(
                "a mixture of {} shares was given {} groups",
                parts.len(),
                groups.len()
            )));
        }
        if let Some(g) = (0..parts.len()).find(|&g| parts[g] > 0 && groups[g].is_none()) {
            return Err(Error::invalid(format!(
                "mixture group {g} has a positive share and no rows"
            )));
        }
        Ok(MixtureDraws {
            interleave,
            groups: Arc::new(groups),
            base: Vec::new(),
        })
    }

    /// The same draws, each group continuing its own sequence after
    /// `base[g]` draws (by group, as the shares list them).
    pub fn continued(&self, base: Vec<u64>) -> MixtureDraws {
        MixtureDraws {
            base,
            ..self.clone()
        }
    }

    pub fn interleave(&self) -> &Interleave {
        &self.interleave
    }

    /// The group and the snapshot row of draw `k`.
    pub fn draw(&self, k: u64) -> Result<(usize, u64)> {
        let (g, i) = self.interleave.at(k);
        let group = self.groups[g].as_ref().expect("checked in new");
        let at = group
            .sampler
            .row(self.base.get(g).copied().unwrap_or(0) + i)?;
        Ok((g, u64::from(group.rows[at as usize])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::rng::{draw_bits, unit_f64};
    use crate::sample::Sampling;

    fn prefix_is_within_one(shares: &Shares) {
        let il = Interleave::new(shares.clone());
        let n = shares.parts().len();
        let mut counts = vec![0u64; n];
        let whole = u64::from(shares.whole());
        // two periods and a bit: the second repeats the first
        for k in 0..2 * whole + 7 {
            let (g, i) = il.at(k);
            assert_eq!(i, counts[g], "draw {k}: index within group");
            counts[g] += 1;
            for (h, &c) in counts.iter().enumerate() {
                let target = shares.share(h) * (k + 1) as f64;
                assert!(
                    (c as f64 - target).abs() < 1.0,
                    "{:?}: after {} draws group {h} has {c}, target {target}",
                    shares.parts(),
                    k + 1
                );
            }
            if k % 97 == 0 {
                assert_eq!(il.counts(k + 1), counts);
            }
        }
    }

    #[test]
    fn every_prefix_meets_the_shares_to_within_one_draw() {
        for parts in [
            vec![6, 3, 1],
            vec![1],
            vec![1, 1],
            vec![0, 5, 0, 2],
            vec![1, 1000],
            vec![7, 31, 48, 28],
        ] {
            prefix_is_within_one(&Shares::new(parts).unwrap());
        }
        // many groups of uneven parts: where smooth weighted round-robin
        // (nginx's) strays by more than one draw
        for seed in 0..40u64 {
            let n = 2 + (draw_bits(seed, 0, 0) % 40) as usize;
            let parts: Vec<u32> = (0..n as u64)
                .map(|i| match draw_bits(seed, 1, i) % 6 {
                    0 => 0,
                    1 | 2 => 1,
                    3 => 3,
                    _ => 1 + (draw_bits(seed, 2, i) % 1000) as u32,
                })
                .collect();
            if parts.iter().any(|&p| p > 0) {
                prefix_is_within_one(&Shares::new(parts).unwrap());
            }
        }
    }

    #[test]
    fn shares_are_kept_exactly_where_decimal_and_to_1_in_65536_otherwise() {
        let s = Shares::from_f64(&[0.6, 0.3, 0.1]).unwrap();
        assert_eq!((s.parts(), s.whole()), (&[6, 3, 1][..], 10));
        let s = Shares::from_f64(&[2.0, 2.0]).unwrap();
        assert_eq!((s.parts(), s.whole()), (&[1, 1][..], 2));
        let s = Shares::from_f64(&[1.0, 1.0, 1.0]).unwrap();
        assert_eq!(s.whole(), SHARE_WHOLE);
        assert_eq!(s.parts(), &[21846, 21845, 21845]);
        let random: Vec<f64> = (0..50).map(|i| unit_f64(draw_bits(3, 0, i))).collect();
        let s = Shares::from_f64(&random).unwrap();
        let sum: f64 = random.iter().sum();
        for (g, w) in random.iter().enumerate() {
            assert!((s.share(g) - w / sum).abs() <= 1.0 / f64::from(SHARE_WHOLE));
        }
        for bad in [
            &[][..],
            &[-1.0, 2.0],
            &[f64::NAN],
            &[0.0, 0.0],
            &[f64::INFINITY],
        ] {
            assert!(Shares::from_f64(bad).is_err(), "{bad:?}");
        }
        assert!(Shares::from_f64(&vec![1.0; MAX_GROUPS + 1]).is_err());
    }

    #[test]
    fn a_group_draws_its_rows_by_its_own_sampler_at_its_own_count() {
        let shares = Shares::new(vec![3, 1]).unwrap();
        let rows: [Arc<[u32]>; 2] = [(0..10).collect(), (100..105).collect()];
        let groups: Vec<Option<Group>> = rows
            .iter()
            .map(|r| {
                let w = vec![1.0; r.len()];
                let sampler = EpochSampler::new(
                    Sampling::Permutation,
                    r.len(),
                    &|| Ok((&w).into()),
                    None,
                    5,
                    0,
                    r.len() as u64,
                )
                .unwrap();
                Some(Group {
                    rows: r.clone(),
                    sampler,
                })
            })
            .collect();
        let draws = MixtureDraws::new(Arc::new(Interleave::new(shares)), groups).unwrap();
        let all: Vec<(usize, u64)> = (0..40).map(|k| draws.draw(k).unwrap()).collect();
        // 30 draws of the first group: every row of it three times; 10 of
        // the second: every row twice
        for (g, rows, times) in [(0, 0..10u64, 3), (1, 100..105, 2)] {
            for r in rows {
                let n = all.iter().filter(|&&(h, row)| h == g && row == r).count();
                assert_eq!(n, times, "row {r}");
            }
        }
        // a permutation within a group: its first pass holds every row once
        let first: Vec<u64> = all
            .iter()
            .filter(|d| d.0 == 0)
            .take(10)
            .map(|d| d.1)
            .collect();
        let mut sorted = first.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        let none = MixtureDraws::new(
            Arc::new(Interleave::new(Shares::new(vec![1, 1]).unwrap())),
            vec![None, None],
        );
        assert!(none.is_err());
    }
}

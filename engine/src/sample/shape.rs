//! Weights from per-row scores, shaped so they cannot collapse onto a few
//! rows: the one rule behind `ScoreLog.reweight` and the SQL window function
//! `drt_shape_weights` (and so every shaped score recipe).
//!
//! For the rows with a score (`NaN` marks a row without one):
//! 1. a raw weight `r >= 0` by [`Shape`]: the score clipped at 0, its
//!    percent rank, or 1 where it is above 0;
//! 2. `q = min(lambda * r, K)` with `lambda` such that `q` has mean 1
//!    (water-filling: the heaviest rows are capped, the rest scaled up),
//!    `K = (cap - floor) / (1 - floor)`. When fewer than `1 / K` of the rows
//!    have `r > 0`, those get `K` and the others share the rest equally;
//!    when none has, `q = 1`;
//! 3. `weight = anneal + (1 - anneal) * (floor + (1 - floor) * q)`.
//!
//! So the weights have mean 1 over the scored rows, each is at least
//! `floor` and at most `cap` times that mean, `anneal = 1` is uniform, and
//! rows with equal scores get equal weights whatever their order. A row
//! without a score gets the mean weight, 1.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

/// How a score becomes a raw weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shape {
    /// `r = max(score, 0)`: proportional to the score.
    Linear,
    /// `r` = the score's percent rank among the scored rows (0 the lowest,
    /// 1 the highest; equal scores share a rank).
    Rank,
    /// `r = 1` where the score is above 0, else 0.
    Threshold,
}

impl FromStr for Shape {
    type Err = Error;

    fn from_str(name: &str) -> Result<Shape> {
        match name {
            "linear" => Ok(Shape::Linear),
            "rank" => Ok(Shape::Rank),
            "threshold" => Ok(Shape::Threshold),
            other => Err(Error::invalid(format!(
                "shape must be 'linear', 'rank' or 'threshold', not {other:?}"
            ))
            .at_column("shape", Some(other.to_string()))),
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Shape::Linear => "linear",
            Shape::Rank => "rank",
            Shape::Threshold => "threshold",
        })
    }
}

/// A shape with its guardrails, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shaping {
    shape: Shape,
    floor: f64,
    cap: f64,
    anneal: f64,
}

impl Shaping {
    /// `floor` (a share of the mean weight) and `anneal` (1: uniform) in
    /// [0, 1], `cap` (a multiple of the mean weight; infinite: no cap) at
    /// least 1.
    pub fn new(shape: Shape, floor: f64, cap: f64, anneal: f64) -> Result<Shaping> {
        let check = |name: &str, value: f64, ok: bool, range: &str| {
            if ok {
                Ok(())
            } else {
                Err(
                    Error::invalid(format!("{name} must be {range}, not {value}"))
                        .at_column(name, Some(value.to_string())),
                )
            }
        };
        check("floor", floor, (0.0..=1.0).contains(&floor), "in [0, 1]")?;
        check("cap", cap, cap >= 1.0, "at least 1 (infinite: no cap)")?;
        check("anneal", anneal, (0.0..=1.0).contains(&anneal), "in [0, 1]")?;
        Ok(Shaping {
            shape,
            floor,
            cap,
            anneal,
        })
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The weight of each row, in order, from its score (`NaN`: none).
    /// Infinite scores are the caller's to refuse. One sort of the scored
    /// rows serves the rank and the water-filling (every shape's raw
    /// weight grows with the score).
    pub fn weights(&self, scores: &[f64]) -> Vec<f64> {
        let sorted = scored_in_order(scores);
        let raw = self.raw(&sorted);
        let q = water_fill(&raw, self.k_cap());
        let (f, a) = (self.floor, self.anneal);
        let mut weights = vec![1.0; scores.len()];
        for (&(_, row), r) in sorted.iter().zip(&raw) {
            weights[row as usize] = a + (1.0 - a) * (f + (1.0 - f) * q(*r));
        }
        weights
    }

    /// The cap on `q`, the share of the weight above the floor.
    fn k_cap(&self) -> f64 {
        if self.floor < 1.0 {
            (self.cap - self.floor) / (1.0 - self.floor)
        } else {
            1.0
        }
    }

    /// The raw weight `r` of each scored row, in the ascending order of
    /// `sorted` (so `r` never falls along it).
    fn raw(&self, sorted: &[(f64, u32)]) -> Vec<f64> {
        match self.shape {
            Shape::Linear => sorted.iter().map(|&(s, _)| s.max(0.0)).collect(),
            Shape::Threshold => sorted
                .iter()
                .map(|&(s, _)| if s > 0.0 { 1.0 } else { 0.0 })
                .collect(),
            Shape::Rank => percent_rank(sorted),
        }
    }
}

/// The rows of `scores` that have one (not NaN) as `(score, row)`, in
/// ascending `total_cmp` order (-0.0 before 0.0), rows of equal scores in
/// row order. Many rows (a loop's population) are first dealt into buckets
/// by where their score lies between the least and the greatest (a
/// monotone map: a bucket's scores all precede the next one's), each then
/// sorted where it fits in cache (10^7 rows: 0.42 s where one comparison
/// sort took 0.75-0.85 s, release build).
fn scored_in_order(scores: &[f64]) -> Vec<(f64, u32)> {
    let by_score = |a: &(f64, u32), b: &(f64, u32)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
    // one pass: how many have a score, and the finite ones' range
    let (scored, low, high) = scores.iter().filter(|s| !s.is_nan()).fold(
        (0usize, f64::MAX, f64::MIN),
        |(n, l, h), &s| match s.is_finite() {
            true => (n + 1, l.min(s), h.max(s)),
            false => (n + 1, l, h),
        },
    );
    if scored < 1 << 16 {
        let mut items: Vec<(f64, u32)> = (0..)
            .zip(scores)
            .filter(|(_, s)| !s.is_nan())
            .map(|(i, &s)| (s, i))
            .collect();
        items.sort_unstable_by(by_score);
        return items;
    }
    let buckets = (scored / 1024).next_power_of_two();
    let last = buckets - 1;
    let scale = match high > low {
        true => buckets as f64 / (high - low),
        false => 0.0,
    };
    // -inf first, +inf last, a finite score by its place in [low, high]
    // (a span past f64::MAX makes `scale` 0, a subnormal span infinite:
    // the map stays monotone, only coarser)
    let bucket = |s: f64| match s {
        f64::NEG_INFINITY => 0,
        f64::INFINITY => last,
        _ => (((s - low) * scale) as usize).min(last),
    };
    let mut starts = vec![0usize; buckets + 1];
    for &s in scores.iter().filter(|s| !s.is_nan()) {
        starts[bucket(s) + 1] += 1;
    }
    for i in 1..=buckets {
        starts[i] += starts[i - 1];
    }
    let mut items = vec![(0.0, 0u32); scored];
    let mut next = starts.clone();
    for (row, &s) in (0..).zip(scores) {
        if !s.is_nan() {
            let b = bucket(s);
            items[next[b]] = (s, row);
            next[b] += 1;
        }
    }
    for window in starts.windows(2) {
        items[window[0]..window[1]].sort_unstable_by(by_score);
    }
    items
}

/// `(rows with a smaller score) / (scored rows - 1)` of each row of
/// `sorted` (ascending; 0 when only one is). Equal scores (-0.0 and 0.0
/// too) share the rank of the first of them.
fn percent_rank(sorted: &[(f64, u32)]) -> Vec<f64> {
    let denominator = sorted.len().saturating_sub(1).max(1) as f64;
    let mut first = 0;
    (0..sorted.len())
        .map(|i| {
            if sorted[i].0 != sorted[first].0 {
                first = i;
            }
            first as f64 / denominator
        })
        .collect()
}

/// `q = min(lambda * r, k)` with mean 1 over the rows, from their raw
/// weights in ascending order; see the module. The function maps a raw
/// weight to its `q`.
fn water_fill(raw: &[f64], k: f64) -> impl Fn(f64) -> f64 {
    let n = raw.len() as f64;
    let positive = raw.iter().filter(|&&r| r > 0.0).count();
    // heavy(j): the j-th heaviest; rest: the sum of r from it down
    let heavy = |j: usize| raw[raw.len() - 1 - j];
    // below[i]: the sum of the i lightest (smallest first: the exact way)
    let mut below = Vec::with_capacity(raw.len() + 1);
    below.push(0.0);
    for r in raw {
        below.push(below.last().copied().unwrap_or(0.0) + r);
    }
    let rest = |j: usize| below[raw.len() - j];
    let mut lambda = None;
    for j in 0..positive {
        // the first j whose row is within the cap when the j heavier ones
        // are capped: its lambda is the one (lambda falls from there on)
        let capped = if j == 0 { 0.0 } else { j as f64 * k };
        let l = (n - capped) / rest(j);
        if heavy(j) * l <= k * (1.0 + 1e-12) {
            lambda = Some(l);
            break;
        }
    }
    move |r: f64| match lambda {
        _ if positive == 0 => 1.0,
        Some(lambda) => (lambda * r).min(k),
        // fewer than n / k rows weigh anything: they get k, the rest share
        None if r > 0.0 => k,
        None => (n - positive as f64 * k) / (n - positive as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shaped(shape: Shape, floor: f64, cap: f64, scores: &[f64]) -> Vec<f64> {
        Shaping::new(shape, floor, cap, 0.0)
            .unwrap()
            .weights(scores)
    }

    #[test]
    fn many_scores_come_in_the_order_a_comparison_sort_gives() {
        // every kind of float, repeated, past the size sorted by bits
        let kinds = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            1e-310,
            -1e-310,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MAX,
            f64::MIN,
            0.5,
            2.5e10,
            f64::NAN,
        ];
        let scores: Vec<f64> = (0..200_000u64)
            .map(|i| {
                let x = crate::sample::rng::mix64(i);
                match i % 3 {
                    0 => kinds[(x % kinds.len() as u64) as usize],
                    _ => f64::from_bits(x) % 1e6,
                }
            })
            .collect();
        let mut want: Vec<(f64, u32)> = (0..)
            .zip(&scores)
            .filter(|(_, s)| !s.is_nan())
            .map(|(i, &s)| (s, i))
            .collect();
        want.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let got = scored_in_order(&scores);
        let bits = |v: &[(f64, u32)]| v.iter().map(|(s, r)| (s.to_bits(), *r)).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
    }

    fn mean(w: &[f64]) -> f64 {
        w.iter().sum::<f64>() / w.len() as f64
    }

    #[test]
    fn linear_weights_are_proportional_until_the_cap() {
        let w = shaped(Shape::Linear, 0.0, 100.0, &[1.0, 2.0, 3.0, -1.0]);
        assert_eq!(w, vec![2.0 / 3.0, 4.0 / 3.0, 2.0, 0.0]);
        // cap 1.5: the heaviest capped, the others scaled up to mean 1
        let w = shaped(Shape::Linear, 0.0, 1.5, &[1.0, 2.0, 3.0, 0.0]);
        assert!((mean(&w) - 1.0).abs() < 1e-12, "{w:?}");
        assert!(w.iter().all(|&x| x <= 1.5 + 1e-12), "{w:?}");
        assert!(
            (w[2] - 1.5).abs() < 1e-12 && (w[1] - 1.5).abs() < 1e-12,
            "{w:?}"
        );
    }

    #[test]
    fn the_floor_and_the_cap_bound_every_weight() {
        let scores: Vec<f64> = (0..1000)
            .map(|i| ((i * 7919) % 1000) as f64 - 300.0)
            .collect();
        for shape in [Shape::Linear, Shape::Rank, Shape::Threshold] {
            let w = shaped(shape, 0.1, 2.0, &scores);
            assert!((mean(&w) - 1.0).abs() < 1e-9, "{shape}: {}", mean(&w));
            let (lo, hi) = w
                .iter()
                .fold((f64::MAX, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
            assert!(lo >= 0.1 - 1e-12 && hi <= 2.0 + 1e-12, "{shape}: {lo} {hi}");
        }
    }

    #[test]
    fn few_positive_rows_take_the_cap_and_the_rest_share() {
        // 1 of 10 rows above 0, cap 2: it gets 2, the nine share 8
        let mut scores = vec![-1.0; 10];
        scores[3] = 5.0;
        let w = shaped(Shape::Threshold, 0.0, 2.0, &scores);
        assert_eq!(w[3], 2.0);
        assert!(w
            .iter()
            .enumerate()
            .all(|(i, &x)| i == 3 || (x - 8.0 / 9.0).abs() < 1e-12));
    }

    #[test]
    fn rows_without_a_score_weigh_the_mean_and_ties_weigh_alike() {
        let w = shaped(Shape::Rank, 0.0, 1.2, &[f64::NAN, 3.0, 1.0, 3.0, 2.0]);
        assert_eq!(w[0], 1.0);
        assert_eq!(w[1], w[3]);
        assert!((mean(&w[1..]) - 1.0).abs() < 1e-12);
        // no positive raw weight, or anneal 1: uniform
        assert_eq!(
            shaped(Shape::Threshold, 0.2, 3.0, &[-1.0, -2.0]),
            vec![1.0, 1.0]
        );
        let annealed = Shaping::new(Shape::Linear, 0.0, 9.0, 1.0).unwrap();
        assert_eq!(annealed.weights(&[0.0, 5.0]), vec![1.0, 1.0]);
    }

    #[test]
    fn percent_rank_counts_smaller_scores() {
        let scores = [3.0, f64::NAN, 1.0, 3.0, -0.0, 0.0];
        let w = Shaping::new(Shape::Rank, 0.0, f64::INFINITY, 0.0)
            .unwrap()
            .weights(&scores);
        // ranks 3/4, -, 2/4, 3/4, 0, 0 (-0.0 and 0.0 tie): weights in their ratio
        assert!(w[1] == 1.0 && w[4] == 0.0 && w[5] == 0.0, "{w:?}");
        assert_eq!(w[0], w[3]);
        assert!((w[0] / w[2] - 1.5).abs() < 1e-12, "{w:?}");
    }

    #[test]
    fn bad_guardrails_are_refused_by_name() {
        for (floor, cap, anneal, name) in [
            (-0.1, 2.0, 0.0, "floor"),
            (1.5, 2.0, 0.0, "floor"),
            (f64::NAN, 2.0, 0.0, "floor"),
            (0.1, 0.5, 0.0, "cap"),
            (0.1, f64::NAN, 0.0, "cap"),
            (0.1, 2.0, 2.0, "anneal"),
        ] {
            let err = Shaping::new(Shape::Rank, floor, cap, anneal).unwrap_err();
            assert!(err.to_string().starts_with(name), "{err}");
        }
        assert!("ranked".parse::<Shape>().is_err());
        assert!(Shaping::new(Shape::Rank, 0.0, f64::INFINITY, 0.0).is_ok());
    }
}

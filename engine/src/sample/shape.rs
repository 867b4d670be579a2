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
    /// Infinite scores are the caller's to refuse.
    pub fn weights(&self, scores: &[f64]) -> Vec<f64> {
        let raw = self.raw(scores);
        let q = water_fill(&raw, self.k_cap());
        let (f, a) = (self.floor, self.anneal);
        raw.iter()
            .zip(q)
            .map(|(r, q)| {
                if r.is_nan() {
                    1.0
                } else {
                    a + (1.0 - a) * (f + (1.0 - f) * q)
                }
            })
            .collect()
    }

    /// The cap on `q`, the share of the weight above the floor.
    fn k_cap(&self) -> f64 {
        if self.floor < 1.0 {
            (self.cap - self.floor) / (1.0 - self.floor)
        } else {
            1.0
        }
    }

    /// The raw weight `r` of each row (`NaN`: no score).
    fn raw(&self, scores: &[f64]) -> Vec<f64> {
        match self.shape {
            Shape::Linear => scores
                .iter()
                .map(|&s| if s.is_nan() { s } else { s.max(0.0) })
                .collect(),
            Shape::Threshold => scores
                .iter()
                .map(|&s| match s {
                    s if s.is_nan() => f64::NAN,
                    s if s > 0.0 => 1.0,
                    _ => 0.0,
                })
                .collect(),
            Shape::Rank => percent_rank(scores),
        }
    }
}

/// `(rows with a smaller score) / (scored rows - 1)` for each scored row
/// (0 when only one is), `NaN` for the others.
fn percent_rank(scores: &[f64]) -> Vec<f64> {
    let mut sorted: Vec<f64> = scores.iter().copied().filter(|s| !s.is_nan()).collect();
    sorted.sort_unstable_by(f64::total_cmp);
    let denominator = sorted.len().saturating_sub(1).max(1) as f64;
    scores
        .iter()
        .map(|&s| {
            if s.is_nan() {
                f64::NAN
            } else {
                // -0.0 and 0.0 are one score: compare as numbers
                sorted.partition_point(|&x| x < s) as f64 / denominator
            }
        })
        .collect()
}

/// `q = min(lambda * r, k)` with mean 1 over the rows whose `r` is not
/// `NaN` (the others get 1, unused); see the module.
fn water_fill(raw: &[f64], k: f64) -> Vec<f64> {
    let mut heavy: Vec<f64> = raw.iter().copied().filter(|r| !r.is_nan()).collect();
    let n = heavy.len() as f64;
    heavy.sort_unstable_by(|a, b| b.total_cmp(a));
    let positive = heavy.iter().take_while(|&&r| r > 0.0).count();
    if positive == 0 {
        return vec![1.0; raw.len()];
    }
    // rest[j]: the sum of r from the j-th heaviest on
    let mut rest = vec![0.0; positive + 1];
    for j in (0..positive).rev() {
        rest[j] = rest[j + 1] + heavy[j];
    }
    // the first j whose row is within the cap when the j heavier ones are
    // capped: its lambda is the one (lambda falls from there on)
    let lambda = (0..positive).find_map(|j| {
        let capped = if j == 0 { 0.0 } else { j as f64 * k };
        let lambda = (n - capped) / rest[j];
        (heavy[j] * lambda <= k * (1.0 + 1e-12)).then_some(lambda)
    });
    raw.iter()
        .map(|&r| match lambda {
            _ if r.is_nan() => 1.0,
            Some(lambda) => (lambda * r).min(k),
            // fewer than n / k rows weigh anything: they get k, the rest share
            None if r > 0.0 => k,
            None => (n - positive as f64 * k) / (n - positive as f64),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shaped(shape: Shape, floor: f64, cap: f64, scores: &[f64]) -> Vec<f64> {
        Shaping::new(shape, floor, cap, 0.0)
            .unwrap()
            .weights(scores)
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
        let r = percent_rank(&[3.0, f64::NAN, 1.0, 3.0, -0.0, 0.0]);
        assert_eq!(r[2], 2.0 / 4.0);
        assert_eq!((r[0], r[3]), (0.75, 0.75));
        assert_eq!((r[4], r[5]), (0.0, 0.0));
        assert!(r[1].is_nan());
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

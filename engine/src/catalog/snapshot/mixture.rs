//! A snapshot's mixture as stored: target shares of the groups of rows that
//! one column's values make, written in the manifest with the population
//! (so it is versioned, named by the fingerprint and in every state). The
//! groups' rows are found when an epoch is drawn (`groups`).

use std::fmt::Write as _;

use xxhash_rust::xxh3::Xxh3;

use super::escape::{escape, unescape};
use crate::sample::Shares;
use crate::{Error, Result};

/// A mixture as stored: the grouping column, each group's value (as text:
/// the column's values cast to strings) and the shares, in one order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mixture {
    column: String,
    values: Vec<String>,
    shares: Shares,
}

/// The columns a mixture may not group by: they name or weigh each row.
const NOT_GROUPS: [&str; 3] = ["cache_id", "sample_id", "weight"];

impl Mixture {
    /// `shares` by value of `column` (see [`Shares::from_f64`]); values
    /// must be distinct.
    pub fn new(column: &str, shares: &[(String, f64)]) -> Result<Mixture> {
        if NOT_GROUPS.contains(&column) {
            return Err(Error::invalid(format!(
                "a mixture groups rows by a column of their own, not {column:?}"
            )));
        }
        let mut values: Vec<String> = shares.iter().map(|(v, _)| v.clone()).collect();
        values.sort();
        if let Some(twice) = values.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::invalid(format!(
                "the mixture names group {:?} twice",
                twice[0]
            )));
        }
        let numbers: Vec<f64> = shares.iter().map(|(_, s)| *s).collect();
        Ok(Mixture {
            column: column.to_string(),
            values: shares.iter().map(|(v, _)| v.clone()).collect(),
            shares: Shares::from_f64(&numbers)?,
        })
    }

    pub fn column(&self) -> &str {
        &self.column
    }

    /// The groups' values, in the shares' order.
    pub fn values(&self) -> &[String] {
        &self.values
    }

    pub fn shares(&self) -> &Shares {
        &self.shares
    }

    /// The manifest's lines: `mixture=<column>`, then `group=<part> <value>`
    /// per group (names escaped).
    pub(super) fn write_lines(&self, body: &mut String) {
        let _ = writeln!(body, "mixture={}", escape(&self.column));
        for (value, part) in self.values.iter().zip(self.shares.parts()) {
            let _ = writeln!(body, "group={part} {}", escape(value));
        }
    }

    /// Fold this mixture into a population's fingerprint: a population with
    /// another mixture draws another sequence.
    pub(super) fn fingerprint(&self, population: &str) -> String {
        let mut h = Xxh3::new();
        h.update(population.as_bytes());
        let mut lines = String::new();
        self.write_lines(&mut lines);
        h.update(b"\0mixture\0");
        h.update(lines.as_bytes());
        format!("{:032x}", h.digest128())
    }
}

/// A manifest's mixture as its lines are read (see [`Mixture::write_lines`]).
#[derive(Debug, Default)]
pub(super) struct MixtureLines {
    column: Option<String>,
    groups: Vec<(String, u32)>,
}

impl MixtureLines {
    /// Take a `mixture` or `group` line; the error says what is wrong.
    pub(super) fn line(&mut self, key: &str, value: &str) -> std::result::Result<(), String> {
        let bad = || format!("bad {key} line {key}={value}");
        match key {
            "mixture" => self.column = Some(unescape(value).ok_or_else(bad)?),
            _ => {
                let (part, name) = value.split_once(' ').ok_or_else(bad)?;
                let part = part.parse().map_err(|_| bad())?;
                self.groups.push((unescape(name).ok_or_else(bad)?, part));
            }
        }
        Ok(())
    }

    pub(super) fn finish(self) -> std::result::Result<Option<Mixture>, String> {
        let Some(column) = self.column else {
            return match self.groups.is_empty() {
                true => Ok(None),
                false => Err("group lines without a mixture line".into()),
            };
        };
        let (values, parts): (Vec<String>, Vec<u32>) = self.groups.into_iter().unzip();
        let shares = Shares::new(parts.clone()).map_err(|e| e.to_string())?;
        if shares.parts() != parts {
            return Err(format!(
                "the mixture's parts {parts:?} are not in lowest terms"
            ));
        }
        Ok(Some(Mixture {
            column,
            values,
            shares,
        }))
    }
}

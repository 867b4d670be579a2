//! What every loader of a host will read next.
//!
//! A loader's draws are a pure function of its plan (seed, epoch, sampling,
//! rank, worker, ...) and the snapshot, so its whole future is described by a
//! few numbers: the plan, the snapshot's fingerprint, and how many draws it
//! has delivered. Each remote loader that evicts publishes that description
//! as a small file in a directory its host shares (`<cache_dir>/<url
//! hash>-evicting/readers/`), and keeps the position in it current; an
//! evicting process reads them all, rebuilds each reader's draws, and evicts
//! the record needed latest by anyone (`load::prefetch`).
//!
//! A reader file: the line `consumed=<20 digits>` (rewritten in place as the
//! reader moves), then `key=value` lines of the plan. Files of processes that
//! are gone are removed by whoever reads the directory. Everything here is a
//! hint: a missing, torn or stale file only makes eviction less exact.

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sample::{DrawPlan, Sampling};
use crate::store::fs as sfs;
use crate::Result;

const CONSUMED: &str = "consumed=";
const DIGITS: usize = 20;
const SUFFIX: &str = ".reader";

/// This process's published future; the file goes when this is dropped.
#[derive(Debug)]
pub struct Published {
    path: PathBuf,
    file: File,
    key: String,
}

impl Published {
    /// Publish `plan` over the snapshot with `fingerprint` in `dir`.
    pub fn new(dir: &Path, fingerprint: &str, plan: &DrawPlan) -> Result<Published> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        fs::create_dir_all(dir).map_err(crate::Error::io(dir))?;
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{}-{n}{SUFFIX}", std::process::id()));
        let key = describe(fingerprint, plan);
        let text = format!("{CONSUMED}{:0DIGITS$}\n{key}", 0);
        sfs::write_atomic(&path, text.as_bytes())?;
        let file = fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(crate::Error::io(&path))?;
        Ok(Published { path, file, key })
    }

    /// The key other processes read this reader under ([`Reader::key`]).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The reader has delivered `consumed` draws of its plan.
    pub fn advance(&self, consumed: u64) {
        let digits = format!("{consumed:0DIGITS$}");
        let _ = self
            .file
            .write_all_at(digits.as_bytes(), CONSUMED.len() as u64);
    }
}

impl Drop for Published {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// One published reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reader {
    /// The snapshot's fingerprint and the plan, as published: equal keys are
    /// equal futures.
    pub key: String,
    pub fingerprint: String,
    pub plan: DrawPlan,
    pub consumed: u64,
}

/// The readers published in `dir` by live processes of this host; files of
/// processes that are gone are removed.
pub fn readers(dir: &Path) -> Vec<Reader> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_suffix(SUFFIX)
            .and_then(|n| n.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !sfs::alive(pid) {
            let _ = fs::remove_file(entry.path());
            continue;
        }
        if let Some(reader) = fs::read_to_string(entry.path())
            .ok()
            .and_then(|t| parse(&t))
        {
            out.push(reader);
        }
    }
    out
}

fn describe(fingerprint: &str, p: &DrawPlan) -> String {
    format!(
        "fingerprint={fingerprint}\nsampling={}\nseed={}\nepoch={}\nepoch_len={}\n\
         batch_size={}\nstart_block={}\ndrop_last={}\nrank={}\nworld_size={}\nworker={}\n\
         num_workers={}\n",
        p.sampling.name(),
        p.seed,
        p.epoch,
        p.epoch_len,
        p.batch_size,
        p.start_block,
        u8::from(p.drop_last),
        p.rank,
        p.world_size,
        p.worker,
        p.num_workers,
    )
}

fn parse(text: &str) -> Option<Reader> {
    let (first, key) = text.split_once('\n')?;
    let consumed = first.strip_prefix(CONSUMED)?.parse().ok()?;
    let field = |name: &str| {
        key.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
    };
    let num = |name: &str| field(name)?.parse::<u64>().ok();
    let plan = DrawPlan {
        sampling: Sampling::parse(field("sampling")?).ok()?,
        seed: num("seed")?,
        epoch: num("epoch")?,
        epoch_len: num("epoch_len")?,
        batch_size: usize::try_from(num("batch_size")?).ok()?,
        start_block: num("start_block")?,
        drop_last: num("drop_last")? != 0,
        rank: u32::try_from(num("rank")?).ok()?,
        world_size: u32::try_from(num("world_size")?).ok()?,
        worker: u32::try_from(num("worker")?).ok()?,
        num_workers: u32::try_from(num("num_workers")?).ok()?,
        // what the reader draws until its run's schedule changes
        run: None,
    };
    plan.validate().ok()?;
    Some(Reader {
        fingerprint: field("fingerprint")?.to_string(),
        key: key.to_string(),
        plan,
        consumed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(worker: u32) -> DrawPlan {
        DrawPlan {
            sampling: Sampling::Permutation,
            seed: 7,
            epoch: 2,
            epoch_len: 1000,
            batch_size: 16,
            start_block: 3,
            drop_last: false,
            rank: 1,
            world_size: 2,
            worker,
            num_workers: 4,
            run: None,
        }
    }

    #[test]
    fn a_published_reader_is_read_back_with_its_position_and_goes_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let a = Published::new(dir.path(), "fp", &plan(0)).unwrap();
        let b = Published::new(dir.path(), "fp", &plan(3)).unwrap();
        a.advance(96);
        let mut got = readers(dir.path());
        got.sort_by_key(|r| r.plan.worker);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].plan.clone(), got[0].consumed), (plan(0), 96));
        assert_eq!((got[1].plan.clone(), got[1].consumed), (plan(3), 0));
        assert_eq!(got[0].fingerprint, "fp");
        assert_ne!(got[0].key, got[1].key);
        drop(a);
        let got = readers(dir.path());
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].plan.worker, 3);
        drop(b);
        assert!(readers(dir.path()).is_empty());
    }

    #[test]
    fn files_of_dead_processes_and_damaged_files_are_not_readers() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!("{CONSUMED}{:020}\n{}", 5, describe("fp", &plan(1)));
        // a pid above the kernel's limit is never alive
        let dead = dir.path().join(format!("4194399-0{SUFFIX}"));
        fs::write(&dead, &text).unwrap();
        let torn = dir
            .path()
            .join(format!("{}-99{SUFFIX}", std::process::id()));
        fs::write(&torn, &text[..text.len() / 2]).unwrap();
        assert!(readers(dir.path()).is_empty());
        assert!(!dead.exists(), "a dead process's file is removed");
    }
}

//! Writing score logs: per-sample values (a loss, a gradient norm) that the
//! processes of a training run record for the samples they drew, kept beside
//! the dataset's snapshots as immutable Arrow IPC *segments*:
//!
//! ```text
//! <snapshot dir>/_scores/<log>/<run>/<written_ns>-<seq>-r<rank>-w<worker>-p<pid>-c<crc>.arrow
//! ```
//!
//! Each process writes its own files, so ranks and workers never coordinate.
//! A segment's columns are `epoch`, `position` (UInt64), `cache_id`,
//! `sample_id` (Int64), `value` (Float64) and `rank` (UInt32); its name
//! starts with the time it was written (20 digits, so names sort by it) and
//! the writer's segment number. Readers keep, per `(epoch, position)`, the
//! row of the last name (and within one segment the last row), so a step
//! replayed after a resume replaces its rows ([`read_run`], in `read.rs`).
//! A segment is sealed by its name: `<crc>` is the CRC-32C of the whole
//! file, checked before a row is read. [`ScoreState`] (`state.rs`) folds a
//! run's segments into one row per sample (count, epochs, last and moving
//! average loss), reading only the segments it has not folded yet.
//!
//! A [`ScoreWriter`] buffers appended rows; once `flush_rows` are buffered
//! it hands them to a background thread that writes the segment (temporary
//! name, fsync, rename, fsync of the folder), so an append never waits for
//! the disk. [`ScoreWriter::flush`] writes everything handed over in the
//! calling thread and returns once it is durable: call it before saving a
//! checkpoint. A segment that cannot be written keeps its rows queued; the
//! error is returned by the next `append` or `flush`, and the next flush
//! tries again.

use std::collections::VecDeque;
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, UInt32Array, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::store::{fs as sfs, ipc};
use crate::Unpoison;
use crate::{Error, Result};

mod read;
mod reweight;
mod state;
pub use read::{read_run, read_segment, segments};
pub use reweight::reweighted;
pub use state::{state_schema, ScoreState};

/// Folder of the score logs inside a dataset's snapshot directory.
pub const SCORES_DIR: &str = "_scores";

/// The columns of a segment.
pub static SEGMENT_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("epoch", DataType::UInt64, false),
        Field::new("position", DataType::UInt64, false),
        Field::new("cache_id", DataType::Int64, false),
        Field::new("sample_id", DataType::Int64, false),
        Field::new("value", DataType::Float64, false),
        Field::new("rank", DataType::UInt32, false),
    ]))
});

/// The draw positions of appended rows.
#[derive(Debug, Clone, Copy)]
pub enum Positions<'a> {
    /// Consecutive positions from this one.
    From(u64),
    /// One position per row.
    Each(&'a [u64]),
}

/// Rows buffered for one segment, column by column.
#[derive(Debug, Default)]
struct Rows {
    epoch: Vec<u64>,
    position: Vec<u64>,
    cache_id: Vec<i64>,
    sample_id: Vec<i64>,
    value: Vec<f64>,
}

impl Rows {
    fn len(&self) -> usize {
        self.value.len()
    }

    fn batch(&self, rank: u32) -> Result<RecordBatch> {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from(self.epoch.clone())),
            Arc::new(UInt64Array::from(self.position.clone())),
            Arc::new(Int64Array::from(self.cache_id.clone())),
            Arc::new(Int64Array::from(self.sample_id.clone())),
            Arc::new(Float64Array::from(self.value.clone())),
            Arc::new(UInt32Array::from(vec![rank; self.len()])),
        ];
        Ok(RecordBatch::try_new(SEGMENT_SCHEMA.clone(), columns)?)
    }
}

/// Who writes: the parts of a segment's name, fixed for a writer.
#[derive(Debug)]
struct Writer {
    directory: PathBuf,
    rank: u32,
    worker: String,
    pid: u32,
}

/// The segments handed to the writing thread, and what it did with them.
#[derive(Debug, Default)]
struct Queue {
    segments: VecDeque<Rows>,
    /// A thread (background or a flushing caller) is writing the queue.
    writing: bool,
    /// Why the last write failed; its rows are still at the queue's head.
    error: Option<Error>,
    /// The next segment's number, and the last segment's `written_ns`.
    seq: u64,
    last_ns: u64,
    /// The run's folder exists and its dead temporary files are gone.
    prepared: bool,
}

#[derive(Debug)]
struct Shared {
    writer: Writer,
    queue: Mutex<Queue>,
    done: Condvar,
    /// `queue.error` is set (read by every append without the lock).
    failed: AtomicBool,
}

/// Buffers the rows one process appends to one run of one score log, and
/// writes them as segments; see the module.
#[derive(Debug)]
pub struct ScoreWriter {
    flush_rows: usize,
    rows: Mutex<Rows>,
    shared: Arc<Shared>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unpoisoned()
}

impl ScoreWriter {
    /// A writer of segments into `directory` (`<snapshot dir>/_scores/<log>/<run>`,
    /// made on the first write), named for `rank` and `worker` (a DataLoader
    /// worker's id or `main`) and this process; rows are handed to the
    /// background writer once `flush_rows` are buffered.
    pub fn new(directory: PathBuf, rank: u32, worker: &str, flush_rows: usize) -> Result<Self> {
        if worker.is_empty() || !worker.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(Error::invalid(format!(
                "a score log's worker name must be ASCII letters and digits, got {worker:?}"
            )));
        }
        if flush_rows == 0 {
            return Err(Error::invalid("flush_rows must be at least 1"));
        }
        Ok(ScoreWriter {
            flush_rows,
            rows: Mutex::default(),
            shared: Arc::new(Shared {
                writer: Writer {
                    directory,
                    rank,
                    worker: worker.to_string(),
                    pid: std::process::id(),
                },
                queue: Mutex::default(),
                done: Condvar::new(),
                failed: AtomicBool::new(false),
            }),
        })
    }

    /// Rows appended and not yet durable (buffered, queued or being written).
    pub fn pending(&self) -> usize {
        let buffered = lock(&self.rows).len();
        buffered
            + lock(&self.shared.queue)
                .segments
                .iter()
                .map(Rows::len)
                .sum::<usize>()
    }

    /// Buffer one row per sample of `epoch`: `(position) -> (cache_id,
    /// sample_id, value)`. The slices are equally long and every value is
    /// finite; otherwise nothing is buffered and the error names the culprit.
    /// A background write that failed since the last call is reported here
    /// (and nothing is buffered); its rows stay queued for the next flush.
    pub fn append(
        &self,
        epoch: u64,
        positions: Positions<'_>,
        cache_id: &[i64],
        sample_id: &[i64],
        values: &[f64],
    ) -> Result<()> {
        let n = values.len();
        if cache_id.len() != n || sample_id.len() != n {
            return Err(Error::invalid(format!(
                "cache_id, sample_id and values must be equally long, got {}, {} and {n}",
                cache_id.len(),
                sample_id.len()
            )));
        }
        match positions {
            Positions::Each(p) if p.len() != n => {
                return Err(Error::invalid(format!(
                    "position must be an int or one position per row ({n} rows), got {} positions",
                    p.len()
                ))
                .at_column("position", None));
            }
            Positions::From(first) if first.checked_add(n.saturating_sub(1) as u64).is_none() => {
                return Err(Error::invalid(format!(
                    "position {first} + {n} rows passes the largest position, 2**64 - 1"
                ))
                .at_column("position", Some(first.to_string())));
            }
            _ => {}
        }
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(
                Error::invalid(format!("values[{i}] = {} is not finite", values[i]))
                    .at_column("values", Some(values[i].to_string()))
                    .at_row(i),
            );
        }
        if n == 0 {
            return Ok(());
        }
        if self.shared.failed.load(Ordering::Acquire) {
            if let Some(err) = self.shared.take_error() {
                return Err(err);
            }
        }
        let mut rows = lock(&self.rows);
        rows.epoch.extend(std::iter::repeat_n(epoch, n));
        match positions {
            Positions::From(first) => rows.position.extend(first..=first + (n as u64 - 1)),
            Positions::Each(p) => rows.position.extend_from_slice(p),
        }
        rows.cache_id.extend_from_slice(cache_id);
        rows.sample_id.extend_from_slice(sample_id);
        rows.value.extend_from_slice(values);
        if rows.len() >= self.flush_rows {
            let full = std::mem::take(&mut *rows);
            drop(rows);
            let mut queue = lock(&self.shared.queue);
            queue.segments.push_back(full);
            if !queue.writing {
                queue.writing = true;
                let shared = Arc::clone(&self.shared);
                drop(queue);
                let spawned = std::thread::Builder::new()
                    .name("datasetrt-scores".into())
                    .spawn(move || shared.write_queue());
                if let Err(e) = spawned {
                    // no thread: the rows stay queued for the next flush
                    lock(&self.shared.queue).writing = false;
                    self.shared.done.notify_all();
                    return Err(Error::internal(format!(
                        "cannot start the score log writer: {e}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Write every row appended so far (in this thread, after any segment the
    /// background thread is writing) and return how many rows became durable.
    /// On an error the rows stay queued and the next flush tries again.
    pub fn flush(&self) -> Result<usize> {
        let rows = std::mem::take(&mut *lock(&self.rows));
        let mut queue = lock(&self.shared.queue);
        if rows.len() > 0 {
            queue.segments.push_back(rows);
        }
        // everything queued now is durable when this returns Ok
        let pending: usize = queue.segments.iter().map(Rows::len).sum();
        while queue.writing {
            queue = self.shared.done.wait(queue).unpoisoned();
        }
        queue.error = None; // what failed is tried again now
        self.shared.failed.store(false, Ordering::Release);
        if queue.segments.is_empty() {
            return Ok(pending);
        }
        queue.writing = true;
        drop(queue);
        self.shared.write_queue();
        match self.shared.take_error() {
            Some(err) => Err(err),
            None => Ok(pending),
        }
    }
}

impl Shared {
    fn take_error(&self) -> Option<Error> {
        let mut queue = lock(&self.queue);
        self.failed.store(false, Ordering::Release);
        queue.error.take()
    }

    /// Write the queued segments in order until none is left or one fails.
    fn write_queue(&self) {
        loop {
            let mut queue = lock(&self.queue);
            let Some(rows) = queue.segments.pop_front() else {
                queue.writing = false;
                self.done.notify_all();
                return;
            };
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            // a later segment of this process sorts later even if the clock steps back
            let stamp = now.max(queue.last_ns + 1);
            let (seq, prepared) = (queue.seq, queue.prepared);
            drop(queue);
            let written = self.write_segment(&rows, stamp, seq, prepared);
            let mut queue = lock(&self.queue);
            match written {
                Ok(()) => {
                    queue.seq += 1;
                    queue.last_ns = stamp;
                    queue.prepared = true;
                }
                Err(err) => {
                    queue.segments.push_front(rows);
                    queue.error = Some(err);
                    self.failed.store(true, Ordering::Release);
                    queue.writing = false;
                    self.done.notify_all();
                    return;
                }
            }
        }
    }

    /// Publish `rows` as one segment: temporary name, fsync, rename, fsync
    /// the folder (and, the first time, the folders made for it).
    fn write_segment(&self, rows: &Rows, stamp: u64, seq: u64, prepared: bool) -> Result<()> {
        let w = &self.writer;
        let dir = &w.directory;
        if !prepared {
            fs::create_dir_all(dir).map_err(Error::io(dir))?;
            // <run>, <log> and _scores may be new entries of their parents
            for made in dir.ancestors().skip(1).take(3) {
                sfs::sync_dir(made)?;
            }
            sfs::remove_stale_temps(dir);
        }
        // sealed by its name: the CRC-32C of the whole file, which the
        // reader checks before a logged value can become a weight
        let base = format!("{stamp:020}-{seq:06}-r{}-w{}-p{}", w.rank, w.worker, w.pid);
        let temp = ipc::write_temp(
            &dir.join(format!("{base}.arrow")),
            &SEGMENT_SCHEMA,
            &[rows.batch(w.rank)?],
        )?;
        let path = dir.join(format!("{base}-c{:08x}.arrow", temp.crc));
        if let Err(e) = fs::rename(&temp.path, &path) {
            let _ = fs::remove_file(&temp.path);
            return Err(Error::io(&path)(e));
        }
        sfs::sync_dir(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::AsArray;
    use arrow::datatypes::{Float64Type, UInt64Type};
    use std::path::Path;

    fn segments(dir: &Path) -> Vec<PathBuf> {
        let mut names: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "arrow"))
            .collect();
        names.sort();
        names
    }

    fn read(path: &Path) -> RecordBatch {
        let (_, batches) = ipc::read_mapped(path, "score segment").unwrap();
        assert_eq!(batches.len(), 1);
        batches[0].clone()
    }

    #[test]
    fn full_buffers_are_written_in_the_background_in_order() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("_scores/loss/run");
        let w = ScoreWriter::new(dir.clone(), 3, "main", 4).unwrap();
        for step in 0..5u64 {
            let values = [step as f64; 2];
            w.append(step, Positions::From(10 * step), &[0, 0], &[1, 2], &values)
                .unwrap();
        }
        // the rows handed to the background writer are written by now, or by this flush
        let flushed = w.flush().unwrap();
        assert!((2..=10).contains(&flushed), "{flushed}");
        assert_eq!(w.pending(), 0);
        let files = segments(&dir);
        assert_eq!(files.len(), 3, "two full buffers and the flushed rest");
        let positions: Vec<u64> = files
            .iter()
            .flat_map(|f| {
                let b = read(f);
                b.column(1).as_primitive::<UInt64Type>().values().to_vec()
            })
            .collect();
        assert_eq!(positions, [0, 1, 10, 11, 20, 21, 30, 31, 40, 41]);
        let last = read(&files[2]);
        assert_eq!(
            last.column(4).as_primitive::<Float64Type>().values(),
            &[4.0, 4.0]
        );
        assert!(files[0]
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .contains("-r3-wmain-p"));
        assert_eq!(w.flush().unwrap(), 0, "nothing left");
    }

    #[test]
    fn a_rejected_append_buffers_nothing() {
        let root = tempfile::tempdir().unwrap();
        let w = ScoreWriter::new(root.path().join("r"), 0, "main", 100).unwrap();
        let err = w
            .append(0, Positions::From(0), &[0, 0], &[1, 2], &[1.0, f64::NAN])
            .unwrap_err();
        assert!(err.to_string().contains("values[1]"), "{err}");
        let err = w
            .append(0, Positions::Each(&[1]), &[0, 0], &[1, 2], &[1.0, 2.0])
            .unwrap_err();
        assert!(err.to_string().contains("one position per row"), "{err}");
        let err = w
            .append(0, Positions::From(u64::MAX), &[0, 0], &[1, 2], &[1.0, 2.0])
            .unwrap_err();
        assert!(err.to_string().contains("largest position"), "{err}");
        assert_eq!(w.pending(), 0);
        assert_eq!(w.flush().unwrap(), 0);
    }

    #[test]
    fn a_failed_write_keeps_its_rows_for_the_next_flush() {
        let root = tempfile::tempdir().unwrap();
        // a file where the run's folder should be: every write fails
        let dir = root.path().join("blocked");
        fs::write(&dir, b"not a folder").unwrap();
        let w = ScoreWriter::new(dir.join("run"), 0, "7", 2).unwrap();
        w.append(0, Positions::From(0), &[0, 0], &[1, 2], &[0.5, 0.25])
            .unwrap(); // handed to the background writer, which fails
        assert!(matches!(w.flush(), Err(Error::Io { .. })));
        assert_eq!(w.pending(), 2, "the rows are kept");
        fs::remove_file(&dir).unwrap();
        assert_eq!(w.flush().unwrap(), 2);
        assert_eq!(segments(&dir.join("run")).len(), 1);
    }
}

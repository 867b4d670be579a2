//! One process-wide tokio runtime, rebuilt after `fork()`, and the helpers
//! through which blocking calls release the GIL and then check for Ctrl-C:
//! `detach` for plain work, `wait` for a future. Four callers call
//! `py.detach` themselves, each polling with its own Ctrl-C check or inside
//! a buffer Python lends: `Dataset.verify`'s progress, `Loader`'s poll, a
//! SQL worker's `stop`, and `decompress` into a new `bytes`.

use std::future::Future;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use tokio::runtime::Runtime;

static RUNTIME: datasetrt::ProcessRuntime = datasetrt::ProcessRuntime::new();

/// The runtime of this process (a new one after `fork()`).
///
/// Built as `datasetrt_distributed` (feature `distributed`), the runtime's
/// tokio parks its threads with `parking_lot` (datafusion-distributed turns
/// it on): a process forked from one whose runtime had started inherits
/// `parking_lot`'s table of parked threads, pointing into stacks its own new
/// threads reuse, and would crash. There the runtime is refused instead
/// (`datasetrt._native`, which DataLoader workers use, has no `parking_lot`
/// in tokio and is not touched by this).
pub fn runtime() -> PyResult<Arc<Runtime>> {
    if cfg!(feature = "distributed") && RUNTIME.inherited() {
        return Err(crate::error::to_py(datasetrt::Error::invalid(
            "distributed SQL cannot run in a process forked from one that ran it \
             (its thread bookkeeping does not survive fork()): run it in the parent, \
             or start this process with the \"spawn\" method",
        )));
    }
    RUNTIME
        .get(|| {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder
                .worker_threads(datasetrt::threads())
                .thread_name("datasetrt")
                .thread_stack_size(datasetrt::THREAD_STACK)
                .enable_time();
            #[cfg(feature = "distributed")]
            builder.enable_io(); // the workers' connections
            builder.build()
        })
        .map_err(|e| {
            crate::error::to_py(datasetrt::Error::internal(format!(
                "cannot start the runtime: {e}"
            )))
        })
}

/// Run blocking work without the GIL, then check for Ctrl-C.
pub fn detach<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> PyResult<T> {
    let out = py.detach(f);
    py.check_signals()?;
    Ok(out)
}

/// Drive `fut` on the runtime without the GIL, checking for Ctrl-C every
/// 50 ms; an interrupt aborts the work.
///
/// The wait is on a plain channel, not on a tokio timer: when every worker is
/// busy in a long computation nobody drives the runtime's timers, and a timer
/// here would never fire (the query could not be interrupted).
pub fn wait<T, F>(py: Python<'_>, fut: F) -> PyResult<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let rt = runtime()?;
    let (done, mut result) = mpsc::sync_channel(1);
    let handle = rt.spawn(async move {
        test_panic("task");
        // the receiver is gone only after an interrupt; nothing to deliver then
        let _ = done.send(fut.await);
    });
    loop {
        // a Receiver is Send but not Sync: lend it to the detached closure
        let (received, back) = py.detach(move || {
            let received = result.recv_timeout(Duration::from_millis(50));
            (received, result)
        });
        result = back;
        match received {
            Ok(value) => return Ok(value),
            Err(RecvTimeoutError::Timeout) => {
                if let Err(interrupt) = py.check_signals() {
                    handle.abort();
                    return Err(interrupt);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                // the task ended without a value: it panicked
                let why = match py.detach(|| rt.block_on(handle)) {
                    Err(join) => join.to_string(),
                    Ok(()) => "no result".to_string(),
                };
                return Err(crate::error::to_py(datasetrt::Error::internal(format!(
                    "native task failed: {why}"
                ))));
            }
        }
    }
}

/// Panic here when `$DATASETRT_TEST_PANIC` names `place`: how the tests
/// reach the paths that turn a panicked thread or task into `InternalError`.
pub fn test_panic(place: &str) {
    if std::env::var("DATASETRT_TEST_PANIC").is_ok_and(|p| p == place) {
        panic!("a panic injected by DATASETRT_TEST_PANIC={place}");
    }
}

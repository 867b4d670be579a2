//! One process-wide tokio runtime, rebuilt after `fork()`, and the one helper
//! through which every blocking call releases the GIL.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use tokio::runtime::Runtime;

static RUNTIME: Mutex<Option<(u32, Arc<Runtime>)>> = Mutex::new(None);

fn threads() -> usize {
    std::env::var("DATASETRT_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
}

/// The runtime of this process. A child created by `fork()` inherits the
/// parent's runtime object but none of its threads: it gets a new one, and the
/// inherited one is leaked (dropping it would wait for threads that do not exist).
pub fn runtime() -> PyResult<Arc<Runtime>> {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((owner, rt)) = slot.as_ref() {
        if *owner == pid {
            return Ok(rt.clone());
        }
    }
    if let Some((_, stale)) = slot.take() {
        std::mem::forget(stale);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads())
        .thread_name("datasetrt")
        .enable_time()
        .build()
        .map_err(|e| {
            pyo3::exceptions::PyRuntimeError::new_err(format!("cannot start the runtime: {e}"))
        })?;
    let rt = Arc::new(rt);
    *slot = Some((pid, rt.clone()));
    Ok(rt)
}

/// Run blocking work without the GIL, then check for Ctrl-C.
pub fn detach<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> PyResult<T> {
    let out = py.detach(f);
    py.check_signals()?;
    Ok(out)
}

/// Drive `fut` on the runtime without the GIL, polling for Ctrl-C; an
/// interrupt cancels the work.
pub fn wait<T, F>(py: Python<'_>, fut: F) -> PyResult<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let rt = runtime()?;
    let mut handle = rt.spawn(fut);
    loop {
        let polled = py.detach(|| {
            rt.block_on(async {
                tokio::time::timeout(Duration::from_millis(50), &mut handle).await
            })
        });
        match polled {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(join)) => {
                return Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                    "native task failed: {join}"
                )))
            }
            Err(_elapsed) => {
                if let Err(interrupt) = py.check_signals() {
                    handle.abort();
                    return Err(interrupt);
                }
            }
        }
    }
}

//! A worker of distributed SQL (`datasetrt_distributed` only), served on
//! this process's runtime until it is stopped (or the process ends).

use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::error::IntoPyResult;
use crate::runtime::runtime;
use datasetrt::Unpoison;

#[pyclass(name = "Worker", module = "datasetrt_distributed._native")]
pub struct PyWorker {
    url: String,
    /// The server, and what tells it to stop.
    task: Mutex<Option<(JoinHandle<()>, oneshot::Sender<()>)>>,
}

/// How long `stop` waits for the requests in flight before it drops them.
const STOP_WAIT: Duration = Duration::from_secs(5);

#[pymethods]
impl PyWorker {
    /// Listen on `host:port` (port 0: one the system picks) and serve.
    #[new]
    #[pyo3(signature = (host="127.0.0.1".to_string(), port=0))]
    fn new(host: String, port: u16) -> PyResult<Self> {
        let listener = std::net::TcpListener::bind((host.as_str(), port))
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| {
                datasetrt::Error::invalid(format!("a worker cannot listen on {host}:{port}: {e}"))
            })
            .py()?;
        let addr = listener.local_addr().map_err(|e| {
            crate::error::to_py(datasetrt::Error::internal(format!(
                "the worker's address: {e}"
            )))
        })?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = runtime()?.spawn(async move {
            let serve = async move {
                let listener = tokio::net::TcpListener::from_std(listener)
                    .map_err(|e| datasetrt::Error::internal(format!("the worker's socket: {e}")))?;
                let stopped = async move {
                    let _ = stopped.await;
                };
                datasetrt::query::distributed::serve_until(listener, stopped).await
            };
            if let Err(e) = serve.await {
                eprintln!("datasetrt worker on {addr} stopped: {e}");
            }
        });
        Ok(PyWorker {
            url: format!("http://{addr}"),
            task: Mutex::new(Some((task, stop))),
        })
    }

    /// Where coordinators reach it: `http://<host>:<port>`.
    #[getter]
    fn url(&self) -> String {
        self.url.clone()
    }

    /// Whether it still serves.
    #[getter]
    fn running(&self) -> bool {
        let task = self.task.lock().unpoisoned();
        task.as_ref().is_some_and(|(t, _)| !t.is_finished())
    }

    /// Stop serving: no new connection, connected coordinators are told to
    /// go away, and the requests in flight get a few seconds to end (then
    /// they are dropped and their coordinators see an error). Idempotent.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self.task.lock().unpoisoned().take();
        let Some((task, stop)) = taken else {
            return Ok(());
        };
        let _ = stop.send(());
        let rt = runtime()?;
        py.detach(|| {
            rt.block_on(async {
                let abort = task.abort_handle();
                if tokio::time::timeout(STOP_WAIT, task).await.is_err() {
                    abort.abort();
                }
            })
        });
        Ok(())
    }
}

impl Drop for PyWorker {
    fn drop(&mut self) {
        let taken = self.task.lock().unpoisoned().take();
        if let Some((task, stop)) = taken {
            let _ = stop.send(());
            task.abort();
        }
    }
}

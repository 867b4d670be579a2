"""Execute a notebook (default: examples/explore.ipynb) the way the tests do,
and keep what it showed.

    python examples/run_notebook.py [NOTEBOOK] [--executed OUT.ipynb] [--png OUT.png]

``--png`` writes the first image the notebook drew (the README's population
plot, docs/population.png, is made this way). Needs nbclient, nbformat and
ipykernel (``pip install 'datasetrt[dev]'``).
"""

from __future__ import annotations

import argparse
import base64
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def execute(path: Path, timeout: int = 120) -> nbformat.NotebookNode:
    """Run every cell in a fresh kernel, in the notebook's directory; a cell
    that fails or runs longer than ``timeout`` seconds raises."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    return nb


def first_png(nb: nbformat.NotebookNode) -> bytes | None:
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" in data:
                return base64.b64decode(data["image/png"])
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("notebook", nargs="?", default=HERE / "explore.ipynb", type=Path)
    parser.add_argument("--executed", type=Path, help="write the executed notebook here")
    parser.add_argument("--png", type=Path, help="write its first image here")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per cell")
    args = parser.parse_args()
    t0 = time.perf_counter()
    nb = execute(args.notebook, args.timeout)
    print(f"executed {args.notebook} in {time.perf_counter() - t0:.1f}s")
    if args.executed:
        nbformat.write(nb, args.executed)
    if args.png:
        png = first_png(nb)
        if png is None:
            raise SystemExit(f"{args.notebook} drew no image")
        args.png.write_bytes(png)


if __name__ == "__main__":
    main()

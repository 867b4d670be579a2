"""The ``%drt_sql`` IPython magic: ``%load_ext datasetrt``, then

- ``%drt_sql ds SELECT label, count(*) FROM metadata GROUP BY label`` (a line), or
- ``%%drt_sql ds -o counts`` with the query in the cell,

runs the query on the dataset named ``ds`` in the notebook and shows the
result (a polars DataFrame); ``-o name`` also stores it as ``name``. A failed
query shows its message, not a traceback through IPython.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from .exceptions import DatasetRTError

USAGE = "usage: %drt_sql DATASET [-o NAME] SELECT ...  or  %%drt_sql DATASET [-o NAME] + a cell"


def parse(line: str) -> tuple[str, str | None, str]:
    """``(dataset, output name or None, rest of the line)``.

    >>> parse("ds -o counts SELECT 1 AS x")
    ('ds', 'counts', 'SELECT 1 AS x')
    """
    words = line.split(None, 1)
    if not words:
        raise UsageError(USAGE)
    name, rest = words[0], words[1] if len(words) > 1 else ""
    output = None
    head = rest.split(None, 2)
    if head and head[0] in ("-o", "--output"):
        if len(head) < 2 or not head[1].isidentifier():
            raise UsageError(f"-o needs a Python name to store the result in; {USAGE}")
        output, rest = head[1], head[2] if len(head) > 2 else ""
    return name, output, rest


@magics_class
class SqlMagics(Magics):
    @line_cell_magic
    def drt_sql(self, line: str, cell: str | None = None) -> Any:
        """Run SQL on a dataset of the notebook: ``%drt_sql ds SELECT ...`` or
        ``%%drt_sql ds [-o name]`` with the query in the cell."""
        name, output, query = parse(line)
        if cell is not None:
            query = f"{query}\n{cell}" if query.strip() else cell
        if not query.strip():
            raise UsageError(f"no query; {USAGE}")
        head, *attributes = name.split(".")
        dataset = self.shell.user_ns.get(head)
        for attribute in attributes:  # `%drt_sql runs.train ...`
            dataset = getattr(dataset, attribute, None)
        if not callable(getattr(dataset, "sql", None)):
            raise UsageError(f"{name!r} is not a datasetrt Dataset of this notebook; {USAGE}")
        try:
            result = dataset.sql(query)
        except DatasetRTError as exc:
            # The message says what is wrong; a traceback through IPython does not.
            raise UsageError(f"{type(exc).__name__}: {exc}") from None
        if output is not None:
            self.shell.user_ns[output] = result
        return result


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(SqlMagics)

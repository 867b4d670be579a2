"""``python -m datasetrt ...``: the ``datasetrt`` command (see :mod:`datasetrt.cli`)."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())

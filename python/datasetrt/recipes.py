"""Named SQL recipes with ``:name`` parameters (see ``sql/README.md``)."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._state import check_text, printable
from .exceptions import DatasetRTError, InvalidInputError

if TYPE_CHECKING:
    from .dataset import Dataset

_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_NAME = re.compile(r"^[A-Za-z0-9_]+$")
#: A recipe that reads table ``scores`` (outside its comments).
_READS_SCORES = re.compile(r"\b(?:FROM|JOIN)\s+scores\b", re.IGNORECASE)


#: The shipped recipes: package data ``datasetrt/sql/``, their one copy. The
#: project's top-level ``sql/`` is a link to this folder, because maturin
#: packs the files of the package folder but does not follow links into it.
SHIPPED = Path(__file__).parent / "sql"


def search_path() -> list[Path]:
    """Folders searched for recipe names: ``$DATASETRT_SQL_PATH``, then the
    recipes shipped inside the package."""
    dirs = [Path(p) for p in os.environ.get("DATASETRT_SQL_PATH", "").split(os.pathsep) if p]
    dirs.append(SHIPPED)
    return dirs


def load(name_or_path: str | os.PathLike[str]) -> tuple[str, str]:
    """(label, SQL text) of a recipe given by file path or by name."""
    path = Path(name_or_path)
    if path.suffix == ".sql" and path.is_file():
        return str(path), _read(path)
    name = str(name_or_path)
    if _NAME.match(name):
        for folder in search_path():
            candidate = folder / f"{name}.sql"
            if candidate.is_file():
                return name, _read(candidate)
    known = sorted({p.stem for d in search_path() if d.is_dir() for p in d.glob("*.sql")})
    raise InvalidInputError(f"no SQL recipe {name!r} (a .sql path, or one of {known})")


def _read(path: Path) -> str:
    """The text of a recipe file (UTF-8), or :class:`InvalidInputError`."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(
            f"SQL recipe {printable(str(path))} is not UTF-8 text: byte {exc.start} is "
            f"{data[exc.start : exc.start + 1]!r}"
        ) from None


def literal(name: str, value: Any) -> str:
    """A parameter value as a SQL literal."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        check_text(value, f"SQL parameter {name!r}")
        return "'" + value.replace("'", "''") + "'"
    raise InvalidInputError(
        f"parameter {name!r} = {value!r}: use an int, a finite float, a str or a bool"
    )


def render(sql: str, params: dict[str, Any]) -> str:
    """Replace every ``:name`` with its literal; every parameter must be used."""
    wanted = set(_PARAM.findall(sql))
    missing = sorted(wanted - params.keys())
    if missing:
        raise InvalidInputError(f"missing SQL parameter(s) {missing}")
    extra = sorted(params.keys() - wanted)
    if extra:
        raise InvalidInputError(
            f"unexpected SQL parameter(s) {extra}; this recipe takes {sorted(wanted)}"
        )
    return _PARAM.sub(lambda m: literal(m.group(1), params[m.group(1)]), sql)


def unscored(dataset: Dataset, label: str, sql: str) -> InvalidInputError | None:
    """Why recipe ``label`` (its ``sql``) failed, when it reads table
    ``scores`` and that table has no row for the population: an error
    saying so (a recipe then computes its weights from nothing: null, or no
    rows), else ``None`` (the recipe's own error stands).

    Asked only after the recipe failed, so a recipe that works pays nothing.
    """
    code = re.sub(r"--[^\n]*", "", sql)
    if not _READS_SCORES.search(code):
        return None
    try:
        rows = dataset.sql("SELECT count(*) AS n FROM scores")["n"][0]
        matched = dataset.sql(
            "SELECT count(*) AS n FROM (SELECT 1 FROM scores s JOIN metadata m "
            "USING (cache_id, sample_id) LIMIT 1)"
        )["n"][0]
    except DatasetRTError:  # no such table, or one without identities: the recipe's error stands
        return None
    if matched:
        return None
    why = (
        "the table is empty (append values to the score log, then register it again: "
        'log.register("scores") reads the segments flushed until then)'
        if rows == 0
        else f"none of its {rows} rows names a sample (cache_id, sample_id) of the "
        f"population (a log of another dataset, or of samples an update removed?)"
    )
    return InvalidInputError(
        f"SQL recipe {printable(label)!r} weights the population by table `scores`, "
        f"but the score log has no rows for the population: {why}"
    )

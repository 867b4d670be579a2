"""Named SQL recipes with ``:name`` parameters (see ``sql/README.md``)."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from .exceptions import InvalidInputError

_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_NAME = re.compile(r"^[A-Za-z0-9_]+$")


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
        return str(path), path.read_text()
    name = str(name_or_path)
    if _NAME.match(name):
        for folder in search_path():
            candidate = folder / f"{name}.sql"
            if candidate.is_file():
                return name, candidate.read_text()
    known = sorted({p.stem for d in search_path() if d.is_dir() for p in d.glob("*.sql")})
    raise InvalidInputError(f"no SQL recipe {name!r} (a .sql path, or one of {known})")


def literal(name: str, value: Any) -> str:
    """A parameter value as a SQL literal."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
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

"""Random populations and random SQL for the differential test against DuckDB
(tests/test_sql_differential.py). Pure Python, no engine: everything here is
a function of a seed (`random.Random(seed)`), so a seed names a population or
a query for good.

A query is written in the SQL both engines read alike: every ORDER BY term
says NULLS FIRST or LAST, float literals are written `0.5e0` (DuckDB reads
`0.5` as DECIMAL), `/` only divides floats by powers of two, no cast from
float to integer (DuckDB rounds, DataFusion truncates), no arithmetic on the
64-bit `cache_id`, no integer literal as a GROUP BY key (DuckDB reads it as a
column number), and `length` of a payload only as `length(p.data)` (DuckDB
has no `length(BLOB)`: the test reads it as `octet_length` there). Float
data are multiples of 1/8, so sums and averages are exact in any order, and
the values SQL sets apart from Arrow (`SPECIAL_FLOATS`: NaN with and without
its sign bit, -0.0, +/-inf), whose sums are NaN or an infinity in any order
too; they stand in float columns, IN lists, BETWEEN bounds, group and
partition keys and join keys. A value that is not exact (a sum of square
roots...) is never ordered or compared. Subqueries stand in WHERE (see
`subquery_predicate`), and an IN subquery in a select list. Expressions
stay shallow (a few dozen terms at most). A total ORDER BY ends with (or
is) the key of the rows: (cache_id, sample_id) of `metadata` and
`payloads`, the order the engine's scans deliver in part, so a node that
declares an order it does not deliver loses a sort that shows; it may start
with an expression that is no output column (`sqrt(abs(x))`, `ln(abs(x) +
1)`...), and a join with `payloads` may spell its key `p.cache_id,
p.sample_id`.

A query records whether it holds a shape the engine refuses because
DataFusion 55 answers it wrong (`Query.refusable`: `NOT IN (subquery)`, an
`IN (subquery)` anywhere but a conjunct of a WHERE, `EXCEPT ALL`,
`INTERSECT ALL`; the engine refuses them where a side can be NULL, or
always): a refusal of any other query is a failure.
"""

from __future__ import annotations

import math
import random
import struct
from dataclasses import dataclass, field
from typing import Any

# Bump when the populations or queries a seed gives change: saved examples
# keep their query text, but their population comes from the seed again.
GENERATOR_VERSION = 3

# ---------------------------------------------------------------------------
# populations


WORDS = ["a", "b", "ab", "Ab", "B", "abc", "a_c", "x%y", "", " a ", "café", "Z", "ba", "aa"]
FLOATS = [x / 8 for x in range(-24, 25)]  # -3 .. 3 in steps of 1/8: exact sums
# What SQL sets apart from Arrow's IEEE total order: one NaN, greater than
# every number, stored both ways (numpy's NaN, and the one with its sign bit
# set that x86 computes for 0/0, below -inf in Arrow's order), and -0.0,
# equal to 0.0; and the infinities.
NEGATIVE_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8_0000_0000_0000))[0]
SPECIAL_FLOATS = [math.nan, NEGATIVE_NAN, -0.0, math.inf, -math.inf]
# ...all of which `metadata` stores (a float column of a negative NaN and
# no positive one once made its manifest range unreadable:
# `test_a_population_may_hold_a_negative_nan`), as do the registered table
# `d`, the literals and what queries compute.
STORED_FLOATS = SPECIAL_FLOATS
# their literals (a NaN literal negated is the negative NaN, as computed)
SPECIAL_LITERALS = [
    "CAST('NaN' AS DOUBLE)",
    "(-CAST('NaN' AS DOUBLE))",
    "(-0.0e0)",
    "CAST('Infinity' AS DOUBLE)",
    "CAST('-Infinity' AS DOUBLE)",
]
LABELS = 5  # label takes 0..4 (and NULL); d has 0..5


@dataclass
class Population:
    """The rows of a dataset: per cache, its name, metadata rows and
    payloads; the registered tables `r` and `d`; and, for a population that
    an update replaces, the seed of `updated`."""

    caches: list[tuple[str, list[dict[str, Any]], list[bytes]]]
    r_rows: list[dict[str, Any]]  # cache_id given as a cache index (or None/unknown)
    d_rows: list[dict[str, Any]]
    update_seed: int | None


def _maybe(rng: random.Random, value: Any, p_null: float) -> Any:
    return None if rng.random() < p_null else value


def _float(rng: random.Random, specials: list[float]) -> float:
    return rng.choice(specials) if rng.random() < 0.12 else rng.choice(FLOATS)


def population(seed: int, n_caches: int, update: bool) -> Population:
    rng = random.Random(seed)
    caches = []
    for c in range(n_caches):
        n = rng.randint(40, 90) if c == 0 else rng.randint(20, 60)
        rows, payloads = [], []
        for i in range(n):
            row = {
                "rid": c * 1000 + i,  # unique: the key a total ORDER BY ends with
                "label": _maybe(rng, rng.randrange(LABELS), 0.15),
                "grp": rng.randrange(3),
                "score": _maybe(rng, _float(rng, STORED_FLOATS), 0.15),
                "name": _maybe(rng, rng.choice(WORDS), 0.15),
                "flag": _maybe(rng, rng.random() < 0.5, 0.2),
            }
            if c == 1:  # a column only the second cache has: NULL in the first's rows
                row["extra"] = _maybe(rng, rng.randint(-3, 3), 0.3)
            if i == 0:  # no column of only NULLs (stored as type Null)
                row.update({k: 1 for k in ("label", "extra") if k in row})
                row.update(score=0.5, name="a", flag=True)
            rows.append(row)
            payloads.append(f"{c}:{i};".encode() * rng.randrange(4))  # some empty
        caches.append((f"fuzz{c}-v1", rows, payloads))
    r_rows = []
    for k in range(rng.randint(10, 40)):
        c = rng.randrange(n_caches)
        sid = rng.randrange(len(caches[c][1]) + 3)  # some past the end
        cid: Any = c
        if rng.random() < 0.08:
            cid = None
        elif rng.random() < 0.05:
            cid = "unknown"
        r_rows.append(
            {
                "cache_id": cid,
                "sample_id": _maybe(rng, sid, 0.05),
                "rk": k,
                "val": _maybe(rng, rng.randint(-5, 20), 0.2),
                "note": _maybe(rng, rng.choice(WORDS), 0.2),
            }
        )
    d_rows = [
        {"label": lab, "lname": rng.choice(WORDS), "w": _float(rng, SPECIAL_FLOATS)}
        for lab in range(LABELS + 1)
        if lab == 0 or rng.random() < 0.85
    ]
    return Population(caches, r_rows, d_rows, rng.randrange(1 << 30) if update else None)


def updated(frame: Any, seed: int) -> Any:
    """The population an update makes of `frame` (polars): rows dropped,
    repeated and shuffled, new weights, a new column `tag` and a new unique
    `rid` (so rows are no longer in (cache_id, sample_id) order, and those
    pairs are no longer unique)."""
    import polars as pl

    rng = random.Random(seed)
    picks = [i for i in range(frame.height) if rng.random() < 0.8]
    picks += [rng.randrange(frame.height) for _ in range(frame.height // 4)]
    rng.shuffle(picks)
    out = frame[picks]
    n = out.height
    return out.with_columns(
        rid=pl.Series(rng.sample(range(10_000, 10_000 + 3 * n), n), dtype=pl.Int64),
        weight=pl.Series([rng.choice([0.0, 0.5, 1.0, 2.0, 3.5]) for _ in range(n)]),
        tag=pl.Series([_maybe(rng, rng.choice(WORDS), 0.3) for _ in range(n)], dtype=pl.String),
    ).with_columns(weight=pl.when(pl.int_range(n) == 0).then(1.0).otherwise(pl.col("weight")))


# ---------------------------------------------------------------------------
# queries


@dataclass
class Col:
    ref: str  # SQL text: m.label
    kind: str  # int, float, str, bool, bytes, id (no arithmetic)


@dataclass
class Expr:
    sql: str
    kind: str
    exact: bool = True  # its value is the same whatever order rows are summed in


@dataclass
class Source:
    sql: str  # a FROM clause body
    cols: list[Col]
    key: list[str]  # refs (among cols) whose values identify a row; [] if none
    # the key spelled with the payloads' columns (an inner join with
    # `payloads` on the pair), [] if the source has no such spelling
    pkey: list[str] = field(default_factory=list)


@dataclass
class Query:
    sql: str
    ordered: bool = False  # top-level ORDER BY
    total: bool = False  # ORDER BY fixes the whole row sequence (up to equal rows)
    key_cols: list[int] = field(default_factory=list)  # output columns ORDER BY starts with
    limited: bool = False  # top-level LIMIT/OFFSET
    refusable: bool = False  # holds a shape the engine refuses (see the module's doc)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sql": self.sql,
            "ordered": self.ordered,
            "total": self.total,
            "key_cols": self.key_cols,
            "limited": self.limited,
            "refusable": self.refusable,
        }


META_KINDS = {
    "cache_id": "id",
    "sample_id": "int",
    "rid": "int",
    "label": "int",
    "grp": "int",
    "extra": "int",
    "score": "float",
    "weight": "float",
    "name": "str",
    "tag": "str",
    "flag": "bool",
}
R_COLS = [("cache_id", "id"), ("sample_id", "int"), ("rk", "int"), ("val", "int"), ("note", "str")]
D_COLS = [("label", "int"), ("lname", "str"), ("w", "float")]
PATTERNS = ["a%", "%b", "_b%", "%a_c%", "%", "", "A%", "%é", "x%", "_", "__", "%a%"]
ORDERABLE = ("int", "float", "str", "bool", "id")
# IN subqueries by the kind of their column: (query, whether its column can be
# NULL). Some hold NULLs, some NaN and -0.0 (DuckDB and the engine take a NaN
# as equal to a NaN, -0.0 as 0.0), two cannot be NULL (so NOT IN over
# `metadata`'s `sample_id` answers instead of being refused).
IN_SUBQUERIES = {
    "int": [
        ("SELECT d.label FROM d WHERE d.w > 0", True),
        ("SELECT r.val FROM r", True),  # NULLs
        ("SELECT r.sample_id FROM r WHERE r.note IS NOT NULL", True),
        ("SELECT label FROM metadata WHERE flag", True),
        ("SELECT nullif(r.val, 3) FROM r WHERE r.rk < 10", True),
        ("SELECT max(r.val) FROM r WHERE r.val > 100", True),  # one NULL
        ("SELECT sample_id FROM metadata WHERE label = 1", False),
        ("SELECT sample_id FROM payloads WHERE raw_len > 8", False),
    ],
    "float": [
        ("SELECT d.w FROM d", True),
        ("SELECT score FROM metadata WHERE grp = 1", True),
        ("SELECT score * 0.0e0 FROM metadata", True),  # NaN of inf, -0.0 of negatives
    ],
    "str": [
        ("SELECT r.note FROM r", True),
        ("SELECT d.lname FROM d WHERE d.label > 1", True),
        ("SELECT name FROM metadata WHERE flag IS NULL", True),
    ],
    "id": [
        ("SELECT cache_id FROM payloads WHERE raw_len = 0", False),
        ("SELECT r.cache_id FROM r", True),
    ],
}


class Generator:
    """Random queries over tables `metadata` (columns `meta_columns`),
    `payloads`, `r` and `d`. `cache_ids` are the ids literals may name;
    `pair_unique` says no (cache_id, sample_id) is in `metadata` twice."""

    def __init__(
        self, seed: int, meta_columns: list[str], cache_ids: list[int], pair_unique: bool = True
    ):
        self.rng = random.Random(seed)
        self.pair_unique = pair_unique  # no (cache_id, sample_id) twice in metadata
        self.meta = [(c, META_KINDS[c]) for c in meta_columns if c in META_KINDS]
        self.cache_ids = cache_ids
        self.in_where = False  # subqueries only in WHERE (see subquery_predicate)
        # the predicate being written is a conjunct of a WHERE (the one place
        # an IN subquery over NULLs answers right, so the engine allows it)
        self.conjunct = False
        self.refusable = False  # a shape the engine refuses was written

    # -- helpers ---------------------------------------------------------------
    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, items: list[Any]) -> Any:
        return self.rng.choice(items)

    def lit(self, kind: str) -> str:
        r = self.rng
        if kind == "int":
            v = r.choice([0, 1, 2, 3, 4, 5, -1, 7, 10, 20, 50])
            return f"({v})" if v < 0 else str(v)
        if kind == "float":
            if self.chance(0.12):
                return r.choice(SPECIAL_LITERALS)
            v = r.choice(FLOATS)
            return f"({v!r}e0)" if v < 0 else f"{v!r}e0"
        if kind == "str":
            return "'" + r.choice(WORDS).replace("'", "''") + "'"
        if kind == "bool":
            return r.choice(["TRUE", "FALSE"])
        if kind == "id":
            return str(r.choice([*self.cache_ids, 12345]))
        raise ValueError(kind)

    # -- FROM ------------------------------------------------------------------
    def meta_cols(self, alias: str) -> list[Col]:
        return [Col(f"{alias}.{c}", k) for c, k in self.meta]

    def source(self, choice: str | None = None) -> Source:
        """A FROM clause and the columns that identify its rows: for
        `metadata`, (cache_id, sample_id) (and rid where an update repeated
        pairs) or rid."""
        m = self.meta_cols("m")
        pair = ["m.cache_id", "m.sample_id"] + ([] if self.pair_unique else ["m.rid"])
        mkey = pair if self.chance(0.6) else ["m.rid"]
        # an inner join with `payloads` holds the pair twice, as p's too
        pkey = ["p.cache_id", "p.sample_id", *mkey[2:]] if mkey is pair else []
        p = [Col("p.raw_len", "int"), Col("p.data", "bytes")]
        r = [Col(f"r.{c}", k) for c, k in R_COLS]
        d = [Col(f"d.{c}", k) for c, k in D_COLS]
        using = "USING (cache_id, sample_id)"
        choice = (
            choice
            or self.rng.choices(
                ["m", "mp", "mr", "md", "mpd", "rp", "p", "mpr", "mw"],
                [30, 25, 10, 10, 6, 6, 4, 6, 5],
            )[0]
        )
        if choice == "m":
            return Source("metadata m", m, mkey)
        if choice == "mp":
            join = self.pick(["JOIN", "JOIN", "LEFT JOIN"])
            src = Source(f"metadata m {join} payloads p {using}", m + p, mkey)
            src.pkey = pkey if join == "JOIN" else []
            return src
        if choice == "mr":
            join = self.pick(["JOIN", "LEFT JOIN"])
            return Source(f"metadata m {join} r {using}", m + r, [*mkey, "r.rk"])
        if choice == "md":
            join = self.pick(["JOIN", "LEFT JOIN"])
            return Source(f"metadata m {join} d ON m.label = d.label", m + d, mkey)
        if choice == "mpd":
            return Source(
                f"metadata m JOIN payloads p {using} LEFT JOIN d ON m.label = d.label",
                m + p + d,
                mkey,
                pkey,
            )
        if choice == "mpr":
            return Source(
                f"metadata m JOIN payloads p {using} JOIN r ON r.cache_id = m.cache_id "
                "AND r.sample_id = m.sample_id",
                m + p + r,
                [*mkey, "r.rk"],
                [*pkey, "r.rk"] if pkey else [],
            )
        if choice == "mw":  # a join on floats: NaN meets NaN, -0.0 meets 0.0
            join = self.pick(["JOIN", "LEFT JOIN"])
            on = self.pick(["m.score = d.w", "m.score * 0.0e0 = d.w", "m.score = -d.w"])
            return Source(f"metadata m {join} d ON {on}", m + d, [*mkey, "d.label"])
        if choice == "rp":
            join = self.pick(["JOIN", "LEFT JOIN"])
            return Source(f"r {join} payloads p {using}", r + p, ["r.rk"])
        pk = [Col("p.cache_id", "id"), Col("p.sample_id", "int")]
        return Source("payloads p", [*pk, *p], ["p.cache_id", "p.sample_id"])

    # -- scalar expressions ----------------------------------------------------
    def col(self, src: Source, kind: str) -> Expr | None:
        cols = [c for c in src.cols if c.kind == kind]
        return Expr(self.pick(cols).ref, kind) if cols else None

    def expr(self, src: Source, kind: str, depth: int = 2) -> Expr:
        """An expression of `kind` (int, float, str, bool) over `src`."""
        if depth <= 0 or self.chance(0.35):
            c = self.col(src, kind)
            if c is not None and self.chance(0.8):
                return c
            if kind == "bool" and depth > 0:
                return self.predicate(src, depth - 1)
            return Expr(self.lit(kind), kind)
        return getattr(self, f"_{kind}")(src, depth - 1)

    # C901: a flat dispatch on one random pick
    def _int(self, src: Source, d: int) -> Expr:  # noqa: C901
        e = lambda: self.expr(src, "int", d)  # noqa: E731
        pick = self.rng.randrange(10)
        if pick == 0:
            return Expr(f"({e().sql} + {e().sql})", "int")
        if pick == 1:
            return Expr(f"({e().sql} - {e().sql})", "int")
        if pick == 2:
            return Expr(f"({e().sql} * {self.lit('int')})", "int")
        if pick == 3:
            return Expr(f"abs({e().sql})", "int")
        if pick == 4:
            return Expr(f"({e().sql} % {self.rng.randint(2, 5)})", "int")
        if pick == 5:
            data = self.col(src, "bytes")
            if data is not None and self.chance(0.4):
                return self.payload_length(data.sql)
            return Expr(f"length({self.expr(src, 'str', d).sql})", "int")
        if pick == 6:
            return Expr(f"coalesce({e().sql}, {self.lit('int')})", "int")
        if pick == 7:
            b = self.expr(src, "bool", d)
            return Expr(f"CASE WHEN {b.sql} THEN {e().sql} ELSE {e().sql} END", "int")
        if pick == 8:
            return Expr(f"nullif({e().sql}, {self.lit('int')})", "int")
        return Expr(f"strpos({self.expr(src, 'str', d).sql}, 'a')", "int")

    def payload_length(self, data: str) -> Expr:
        """The bytes of a payload: `length` of a BLOB counts bytes (DuckDB
        has only `octet_length`: the test writes `length(p.data)` so there,
        and only that spelling)."""
        fn = self.pick(["length", "octet_length"]) if data == "p.data" else "octet_length"
        return Expr(f"{fn}({data})", "int")

    # C901: a flat dispatch on one random pick
    def _float(self, src: Source, d: int) -> Expr:  # noqa: C901
        f = lambda: self.expr(src, "float", d)  # noqa: E731
        pick = self.rng.randrange(11)
        if pick == 0:
            a, b = f(), f()
            return Expr(f"({a.sql} + {b.sql})", "float", a.exact and b.exact)
        if pick == 1:
            a, b = f(), self.expr(src, "int", d)
            return Expr(f"({a.sql} - {b.sql})", "float", a.exact)
        if pick == 2:
            a = f()
            return Expr(f"({a.sql} * {self.lit('float')})", "float", a.exact)
        if pick == 3:
            a = f()
            return Expr(f"({a.sql} / {self.pick(['2.0e0', '4.0e0', '0.5e0'])})", "float", a.exact)
        if pick == 4:
            a = f()
            return Expr(f"abs({a.sql})", "float", a.exact)
        if pick == 5:
            a = f()
            fn = self.pick(["round", "floor", "ceil"])
            return Expr(f"{fn}({a.sql})", "float", a.exact)
        if pick == 6:
            a = f()
            return Expr(f"round({a.sql}, {self.rng.randint(0, 2)})", "float", False)
        if pick == 7:
            return Expr(f"sqrt(abs({f().sql}))", "float", False)
        if pick == 8:
            return Expr(f"CAST({self.expr(src, 'int', d).sql} AS DOUBLE)", "float")
        if pick == 9:  # nullif(x, -0.0) is NULL at 0.0 too; greatest(NaN, 1) is NaN
            a = f()
            fn = self.pick(["coalesce", "coalesce", "nullif", "greatest", "least"])
            return Expr(f"{fn}({a.sql}, {self.lit('float')})", "float", a.exact)
        a, b = f(), f()
        c = self.expr(src, "bool", d)
        return Expr(
            f"CASE WHEN {c.sql} THEN {a.sql} ELSE {b.sql} END", "float", a.exact and b.exact
        )

    # C901: a flat dispatch on one random pick
    def _str(self, src: Source, d: int) -> Expr:  # noqa: C901
        s = lambda: self.expr(src, "str", d).sql  # noqa: E731
        pick = self.rng.randrange(12)
        if pick == 0:
            return Expr(f"upper({s()})", "str")
        if pick == 1:
            return Expr(f"lower({s()})", "str")
        if pick == 2:
            return Expr(f"({s()} || {s()})", "str")
        if pick == 3:
            return Expr(f"concat({s()}, {s()})", "str")
        if pick == 4:
            start, n = self.rng.randint(1, 3), self.rng.randint(0, 3)
            return Expr(f"substr({s()}, {start}, {n})", "str")
        if pick == 5:
            return Expr(f"replace({s()}, 'a', 'xy')", "str")
        if pick == 6:
            return Expr(f"{self.pick(['trim', 'ltrim', 'rtrim', 'reverse'])}({s()})", "str")
        if pick == 7:
            return Expr(f"{self.pick(['left', 'right'])}({s()}, {self.rng.randint(0, 3)})", "str")
        if pick == 8:
            data = self.col(src, "bytes")
            if data is not None and self.chance(0.5):  # hex text in both engines
                return Expr(f"{self.pick(['md5', 'sha256'])}({data.sql})", "str")
            return Expr(f"CAST({self.expr(src, 'int', d).sql} AS VARCHAR)", "str")
        if pick == 9:
            return Expr(f"coalesce({s()}, {self.lit('str')})", "str")
        if pick == 10:
            b = self.expr(src, "bool", d)
            return Expr(f"CASE WHEN {b.sql} THEN {s()} ELSE {s()} END", "str")
        return Expr(f"CASE {s()} WHEN 'a' THEN 'is a' WHEN 'b' THEN 'is b' END", "str")

    def _bool(self, src: Source, d: int) -> Expr:
        return self.predicate(src, d)

    def comparable(self, src: Source, d: int) -> tuple[Expr, str]:
        kind = self.pick(["int", "int", "float", "str", "id", "bool"])
        if kind == "id":
            c = self.col(src, "id")
            if c is not None:
                return c, "id"
            kind = "int"
        return self.expr(src, kind, d), kind

    # C901: a flat dispatch on one random pick
    def predicate(self, src: Source, d: int = 2) -> Expr:  # noqa: C901
        """A boolean expression: comparisons, IN, BETWEEN, IS NULL, LIKE,
        joined with AND/OR/NOT up to depth `d`."""
        r = self.rng
        conjunct, self.conjunct = self.conjunct, False  # only AND hands it down
        pick = r.randrange((12 if self.in_where else 11) if d > 0 else 8)
        if pick in (0, 1):
            a, kind = self.comparable(src, d - 1)
            op = r.choice(["=", "<>", "<", "<=", ">", ">="])
            other = self.lit(kind) if kind == "id" or self.chance(0.6) else None
            b = other or self.expr(src, kind, d - 1).sql
            return Expr(f"({a.sql} {op} {b})", "bool")
        if pick == 2:
            a, kind = self.comparable(src, d - 1)
            items = [self.lit(kind) for _ in range(r.randint(1, 6))]
            if self.chance(0.1):
                items.append("NULL")
            neg = "NOT " if self.chance(0.3) else ""
            return Expr(f"({a.sql} {neg}IN ({', '.join(items)}))", "bool")
        if pick == 3:  # each pair compared in its own type: 64-bit ids against inf
            kind = self.pick(["int", "float"])
            a = (self.col(src, "id") if self.chance(0.15) else None) or self.expr(src, kind, d - 1)
            bounds = [self.lit(self.pick([kind, kind, "int", "float"])) for _ in range(2)]
            lo, hi = sorted(bounds, key=_number)
            if self.chance(0.08):  # NULL or FALSE, as its other half says
                lo, hi = self.pick([("NULL", hi), (lo, "NULL")])
            neg = "NOT " if self.chance(0.2) else ""
            return Expr(f"({a.sql} {neg}BETWEEN {lo} AND {hi})", "bool")
        if pick == 4 and src.cols:
            c = self.pick(src.cols)
            return Expr(f"({c.ref} IS {'NOT ' if self.chance(0.5) else ''}NULL)", "bool")
        if pick == 5:
            s = self.expr(src, "str", d - 1)
            op = self.pick(["LIKE", "NOT LIKE", "ILIKE"])
            return Expr(f"({s.sql} {op} '{self.pick(PATTERNS)}')", "bool")
        if pick == 6:
            a, kind = self.comparable(src, d - 1)
            b = self.lit(kind) if kind == "id" else self.expr(src, kind, d - 1).sql
            neg = "NOT " if self.chance(0.5) else ""
            return Expr(f"({a.sql} IS {neg}DISTINCT FROM {b})", "bool")
        if pick in (4, 7):
            c = self.col(src, "bool")
            if c is not None:
                return c
            return Expr(f"starts_with({self.expr(src, 'str', d - 1).sql}, 'a')", "bool")
        if pick in (8, 9):
            op = self.pick(["AND", "OR"])
            terms = []
            for _ in range(r.randint(2, 3)):
                self.conjunct = conjunct and op == "AND"
                terms.append(self.predicate(src, d - 1).sql)
            return Expr("(" + f" {op} ".join(terms) + ")", "bool")
        if pick == 10:
            return Expr(f"(NOT {self.predicate(src, d - 1).sql})", "bool")
        return self.subquery_predicate(src, conjunct)

    def subquery_predicate(self, src: Source, conjunct: bool) -> Expr:
        """IN / NOT IN / EXISTS / a scalar subquery over another table, in a
        WHERE (`conjunct`: as one of its conjuncts). Their values hold NULLs
        or none, NaN and -0.0 (`IN_SUBQUERIES`), and a scalar subquery may
        be NULL. A NOT IN, or an IN anywhere but a conjunct (under NOT, OR,
        IS), is refusable: over a side that can be NULL, DataFusion 55
        answers it without SQL's NULL rule, and the engine refuses it.
        DataFusion pushes a filter that names no column (such as `(SELECT
        count(*) FROM d) > 3`) below an aggregate without GROUP BY, which
        then still answers its one row: none is written."""
        r = self.rng
        pick = r.randrange(5)
        if pick in (0, 1):
            kind = self.pick(["int", "int", "float", "str", "id"])
            cols = [c for c in src.cols if c.kind == kind]
            if cols:
                neg = "NOT " if self.chance(0.3) else ""
                inner, _ = self.pick(IN_SUBQUERIES[kind])
                e = f"({self.pick(cols).ref} {neg}IN ({inner}))"
                wrapped = self.chance(0.15)
                if wrapped:  # where NULL and FALSE differ
                    e = f"({e} IS {self.pick(['', 'NOT '])}{self.pick(['TRUE', 'FALSE'])})"
                self.refusable |= bool(neg) or wrapped or not conjunct
                return Expr(e, "bool")
        if pick == 2:
            floats = [c for c in src.cols if c.kind == "float"]
            if floats:
                scalar = self.pick(
                    [
                        f"SELECT {self.pick(['avg', 'min', 'max'])}(score) FROM metadata",
                        "SELECT min(d.w) FROM d WHERE d.label > 10",  # NULL
                    ]
                )
                op = self.pick([">", "<=", "="])
                return Expr(f"({self.pick(floats).ref} {op} ({scalar}))", "bool")
        if pick == 3 and any(c.ref == "m.sample_id" for c in src.cols):
            neg = "NOT " if self.chance(0.3) else ""
            inner = self.pick(
                [
                    "SELECT 1 FROM r WHERE r.cache_id = m.cache_id AND r.sample_id = m.sample_id",
                    "SELECT 1 FROM r WHERE r.val = m.label",  # a NULL label meets none
                    "SELECT 1 FROM d WHERE d.w = m.score",  # NaN meets NaN, -0.0 meets 0.0
                ]
            )
            return Expr(f"({neg}EXISTS ({inner}))", "bool")
        ints = [c for c in src.cols if c.kind == "int"]
        if ints:
            scalar = self.pick(
                ["SELECT count(*) FROM d", "SELECT max(r.val) FROM r WHERE r.val > 100"]
            )
            return Expr(f"({self.pick(ints).ref} < ({scalar}))", "bool")
        return self.predicate(src, 0)

    def in_subquery_item(self, src: Source) -> Expr | None:
        """`x IN (SELECT ...)` as an output column, over a subquery that can
        be NULL: always refused (DataFusion 55 plans none in a select list
        over columns that cannot be NULL either: "Physical plan does not
        support logical expression InSubquery")."""
        kind = self.pick(["int", "float", "str"])
        cols = [c for c in src.cols if c.kind == kind]
        if not cols:
            return None
        inner = self.pick([q for q, nullable in IN_SUBQUERIES[kind] if nullable])
        self.refusable = True
        return Expr(f"({self.pick(cols).ref} IN ({inner}))", "bool")

    # -- select lists ----------------------------------------------------------
    def item(self, src: Source, kinds: tuple[str, ...] = ("int", "float", "str", "bool")) -> Expr:
        if self.chance(0.4):
            cols = [c for c in src.cols if c.kind in (*kinds, "id", "bytes")]
            c = self.pick(cols)
            return Expr(c.ref, c.kind)
        kind = self.pick(list(kinds))
        return self.expr(src, kind, self.rng.randint(1, 3))

    def aggregate(self, src: Source) -> Expr:
        r = self.rng
        pick = r.randrange(8)
        if pick == 0:
            return Expr("count(*)", "int")
        if pick == 1:
            c = self.pick(src.cols).ref
            dist = "DISTINCT " if self.chance(0.3) else ""
            return Expr(f"count({dist}{c})", "int")
        if pick in (2, 3):
            kind = self.pick(["int", "float"])
            e = self.expr(src, kind, 1)
            fn = self.pick(["sum", "avg"])
            dist = "DISTINCT " if self.chance(0.15) else ""
            return Expr(f"{fn}({dist}{e.sql})", "float" if fn == "avg" else kind, e.exact)
        if pick in (4, 5):
            kind = self.pick(["int", "float", "str"])
            e = self.expr(src, kind, 1)
            return Expr(f"{self.pick(['min', 'max'])}({e.sql})", kind)
        if pick == 6:
            e = self.expr(src, "float", 1)
            fn = self.pick(["stddev", "var_samp", "var_pop"])
            return Expr(f"{fn}({e.sql})", "float", False)
        c = self.col(src, "bool")
        if c is None:
            return Expr("count(*)", "int")
        return Expr(f"count(*) FILTER (WHERE {c.sql})", "int")

    def window(self, src: Source) -> Expr:
        """A window function with a deterministic value: row_number and lag
        order by the source's key too; rank and running sums are defined
        under ties (RANGE frames include peers)."""
        # float partitions: one NaN, one zero (each stored two ways)
        part_cols = [c for c in src.cols if c.kind in ("int", "float", "str", "bool", "id")]
        parts = [c.ref for c in self.rng.sample(part_cols, k=min(len(part_cols), 2))]
        parts = parts[: self.rng.randint(0, len(parts))]
        over = f"PARTITION BY {', '.join(parts)} " if parts else ""
        okey = self.expr(src, self.pick(["int", "float", "str"]), 1)
        order = f"{okey.sql} {self.direction()}"
        total = ", ".join(f"{k} {self.direction()}" for k in src.key)
        pick = self.rng.randrange(6)
        if pick == 0:
            return Expr(f"row_number() OVER ({over}ORDER BY {order}, {total})", "int")
        if pick == 1:
            fn = self.pick(["rank", "dense_rank"])
            return Expr(f"{fn}() OVER ({over}ORDER BY {order})", "int")
        if pick == 2:
            e = self.expr(src, "int", 1)
            return Expr(f"sum({e.sql}) OVER ({over}ORDER BY {order})", "int")
        if pick == 3:
            e = self.expr(src, self.pick(["int", "float"]), 1)
            fn = self.pick(["sum", "min", "max", "count"])
            return Expr(f"{fn}({e.sql}) OVER ({over.strip()})", e.kind, e.exact)
        if pick == 4:
            e = self.expr(src, self.pick(["int", "str"]), 1)
            fn = self.pick(["lag", "lead"])
            return Expr(f"{fn}({e.sql}) OVER ({over}ORDER BY {order}, {total})", e.kind)
        return Expr(f"count(*) OVER ({over.strip()})", "int")

    def direction(self) -> str:
        if self.chance(0.4):  # DataFusion's default, the order scans declare
            return "ASC NULLS LAST"
        return f"{self.pick(['ASC', 'DESC'])} NULLS {self.pick(['FIRST', 'LAST'])}"

    # -- whole queries ---------------------------------------------------------
    def query(self) -> Query:
        form = self.rng.choices(
            ["select", "keyorder", "group", "window", "setop", "cte", "derived", "constant"],
            [26, 16, 21, 11, 9, 9, 6, 2],
        )[0]
        self.refusable = False
        q: Query = getattr(self, f"q_{form}")()
        q.refusable = self.refusable
        return q

    def sort_expr(self, src: Source) -> str | None:
        """An ORDER BY term that is no output column, a function of one
        (`sqrt`, `ln`, `abs`, `ascii`: DataFusion's order analysis refused
        such sorts, "does not satisfy order requirements"). Each is monotone
        in |x| (or exact), so its ties are the column's whatever the last
        bit of `ln`, and a sort that closes with the key stays total."""
        nums = [c.ref for c in src.cols if c.kind in ("int", "float")]
        strs = [c.ref for c in src.cols if c.kind == "str"]
        terms = []
        if nums:
            x = self.pick(nums)
            terms += [f"sqrt(abs({x}))", f"ln(abs({x}) + 1)", f"abs({x})"]
        if strs:
            terms += [f"abs(ascii({self.pick(strs)}))", f"length({self.pick(strs)})"]
        if any(c.ref == "p.data" for c in src.cols):
            terms.append("octet_length(p.data)")
        return f"{self.pick(terms)} {self.direction()}" if terms else None

    def led_by_expr(self, terms: list[str], q: Query, src: Source | None, p: float) -> list[str]:
        """ORDER BY `terms`, with chance `p` after a `sort_expr` over `src`
        (if given and it has one): the output columns then no longer lead
        the order (`q.key_cols`)."""
        first = self.sort_expr(src) if src is not None and self.chance(p) else None
        if first is None:
            return terms
        q.key_cols = []
        return [first, *terms]

    def order_limit(
        self,
        items: list[Expr],
        keys: list[int],
        extra_keys: list[str] | None = None,
        may_limit: bool = True,
        src: Source | None = None,
    ) -> tuple[str, Query]:
        """ORDER BY (maybe) over output columns `c0..` and a unique key
        (`keys`, output positions, or `extra_keys`, SQL that need not be
        output), the key first or last, then maybe LIMIT/OFFSET; where
        `src` is given (its columns may be named in ORDER BY), maybe first
        by an expression over it (`sort_expr`). Returns the clause and the
        query's ordering facts (its sql unset)."""
        q = Query("")
        if not self.chance(0.65):
            if may_limit and self.chance(0.1):
                q.limited = True
                return f" LIMIT {self.rng.randint(0, 10)}", q
            return "", q
        orderable = [i for i, e in enumerate(items) if e.kind in ORDERABLE and e.exact]
        keys = keys if all(items[k].exact for k in keys) else []
        if not orderable:
            return "", q
        chosen = self.rng.sample(orderable, k=self.rng.randint(1, min(3, len(orderable))))
        terms = [self.ref(i) for i in chosen]
        q.ordered, q.key_cols = True, list(chosen)
        closing = self.chance(0.6)
        if closing and self.chance(0.5) and (keys or extra_keys):
            # the key alone or first: (cache_id, sample_id) as a scan may deliver it
            if keys:
                terms, q.key_cols = [self.ref(k) for k in keys], list(keys)
            else:
                assert extra_keys is not None
                terms, q.key_cols = [f"{k} {self.direction()}" for k in extra_keys], []
            q.total = True
        elif closing and keys:
            rest = [k for k in keys if k not in chosen]
            terms += [self.ref(k) for k in rest]
            q.key_cols += rest
            q.total = True
        elif closing and extra_keys:
            terms += [f"{k} {self.direction()}" for k in extra_keys]
            q.total = True
        # every output column ordered: only equal rows can trade places
        q.total = q.total or set(q.key_cols) >= set(range(len(items)))
        terms = self.led_by_expr(terms, q, src, 0.25)
        clause = " ORDER BY " + ", ".join(terms)
        if may_limit and self.chance(0.35):
            q.limited = True
            clause += f" LIMIT {self.rng.randint(0, 12)}"
            if self.chance(0.4):
                clause += f" OFFSET {self.rng.randint(0, 8)}"
        return clause, q

    def ref(self, i: int, prefix: str = "c") -> str:
        name = f"{prefix}{i}" if self.chance(0.7) else str(i + 1)
        return f"{name} {self.direction()}"

    def select_list(self, items: list[Expr], prefix: str = "c") -> str:
        return ", ".join(f"{e.sql} AS {prefix}{i}" for i, e in enumerate(items))

    def where(self, src: Source) -> str:
        if not self.chance(0.7):
            return ""
        self.in_where = self.conjunct = True
        try:
            return f" WHERE {self.predicate(src, self.rng.randint(1, 3)).sql}"
        finally:
            self.in_where = self.conjunct = False

    def q_select(self) -> Query:
        src = self.source()
        items = [self.item(src) for _ in range(self.rng.randint(1, 4))]
        if self.chance(0.05):
            items.append(self.in_subquery_item(src) or items[0])
        keys: list[int] = []
        if self.chance(0.5):  # the source's key among the outputs
            for k in src.key:
                keys.append(len(items))
                items.append(Expr(k, "int" if not k.endswith("cache_id") else "id"))
        distinct = self.chance(0.15)
        if distinct:
            keys = list(range(len(items)))
        sql = f"SELECT {'DISTINCT ' if distinct else ''}{self.select_list(items)} FROM {src.sql}"
        sql += self.where(src)
        if distinct:  # ORDER BY may name output columns only
            clause, q = self.order_limit(items, keys)
        else:
            clause, q = self.order_limit(items, keys, src.key, src=src)
        q.sql = sql + clause
        return q

    def q_keyorder(self) -> Query:
        """ORDER BY the key of the rows, (cache_id, sample_id) mostly, which
        the engine's scans deliver in part: where a node declares an order
        it does not deliver, the sort that ORDER BY needs goes missing. A
        join with `payloads` may be sorted by the payloads' columns
        (`p.cache_id DESC, p.sample_id`), after a filter on metadata, and
        any by an expression first (`sort_expr`)."""
        src = self.source("mp" if self.chance(0.5) else None)
        items = [self.item(src) for _ in range(self.rng.randint(0, 3))]
        if self.chance(0.3):  # computed over all rows, before the LIMIT
            items.append(self.window(src))
        shown = self.chance(0.6) or not items
        positions = []
        if shown:
            for k in src.key:
                positions.append(len(items))
                items.append(Expr(k, "id" if k.endswith("cache_id") else "int"))
        used = src.key[:1] if self.chance(0.2) and len(src.key) > 1 else src.key
        direction = "ASC NULLS LAST" if self.chance(0.7) else self.direction()
        directions = [direction if self.chance(0.7) else self.direction() for _ in used]
        if shown and self.chance(0.5):
            names = [self.ref(p).split()[0] for p in positions]
        elif src.pkey and self.chance(0.6):
            names = src.pkey
        else:
            names = src.key
        terms = [f"{k} {d}" for k, d in zip(names, directions, strict=False)]
        q = Query("", ordered=True, total=used == src.key)
        q.key_cols = positions[: len(used)]
        terms = self.led_by_expr(terms, q, src, 0.2)
        sql = f"SELECT {self.select_list(items)} FROM {src.sql}{self.where(src)}"
        sql += " ORDER BY " + ", ".join(terms)
        if self.chance(0.4):
            q.limited = True
            sql += f" LIMIT {self.rng.randint(1, 40)}"
            if self.chance(0.3):
                sql += f" OFFSET {self.rng.randint(1, 30)}"
        q.sql = sql
        return q

    def group_parts(self, src: Source) -> tuple[list[Expr], list[Expr]]:
        gkeys = []
        for _ in range(self.rng.randint(0, 2)):
            if self.chance(0.6):
                cols = [c for c in src.cols if c.kind in ("int", "str", "bool", "id", "float")]
                c = self.pick(cols)
                gkeys.append(Expr(c.ref, c.kind))
            else:
                # a float key computed: x * 0.0 groups -0.0 with 0.0, and NaN of inf
                e = self.expr(src, self.pick(["int", "str", "bool", "float"]), 1)
                if not any(c.ref in e.sql for c in src.cols):  # GROUP BY 4 means column 4
                    continue
                if not e.exact:
                    continue
                gkeys.append(e)
        aggs = [self.aggregate(src) for _ in range(self.rng.randint(1, 3))]
        return gkeys, aggs

    def q_group(self) -> Query:
        src = self.source()
        gkeys, aggs = self.group_parts(src)
        items = gkeys + aggs
        sql = f"SELECT {self.select_list(items)} FROM {src.sql}" + self.where(src)
        if gkeys:
            sql += " GROUP BY " + ", ".join(e.sql for e in gkeys)
        if self.chance(0.3):
            agg = self.aggregate(src)
            if agg.exact and agg.kind in ("int", "float"):
                sql += f" HAVING {agg.sql} > {self.lit(agg.kind)}"
            else:
                sql += " HAVING count(*) > 1"
        keys = list(range(len(gkeys))) if gkeys else [len(items) - 1]  # one row: any order
        clause, q = self.order_limit(items, keys)
        q.sql = sql + clause
        return q

    def q_window(self) -> Query:
        src = self.source()
        items = [self.item(src) for _ in range(self.rng.randint(0, 2))]
        items += [self.window(src) for _ in range(self.rng.randint(1, 2))]
        keys = []
        for k in src.key:
            keys.append(len(items))
            items.append(Expr(k, "int" if not k.endswith("cache_id") else "id"))
        sql = f"SELECT {self.select_list(items)} FROM {src.sql}" + self.where(src)
        clause, q = self.order_limit(items, keys, src=src)
        q.sql = sql + clause
        return q

    def set_operation(self, prefix: str = "c") -> tuple[str, list[str]]:
        """Two or three SELECTs of the same column kinds joined by UNION,
        INTERSECT, EXCEPT, each with or without ALL (the ALLs of INTERSECT
        and EXCEPT are refused: DataFusion 55 gets the copies wrong), over
        floats with NaN and -0.0 too (one value each, as SQL has them).
        Returns the text and the kinds of its columns (`prefix`0...)."""
        kinds = [self.pick(["int", "float", "str", "bool"]) for _ in range(self.rng.randint(1, 3))]
        sql = ""
        for side in range(self.rng.choice([2, 2, 3])):
            src = self.source()
            items = [self.typed_item(src, k) for k in kinds]
            if side:
                op = self.pick(["UNION", "UNION ALL", "INTERSECT", "INTERSECT ALL", "EXCEPT"])
                op = self.pick([op, "UNION ALL", "EXCEPT ALL"])
                self.refusable |= op in ("INTERSECT ALL", "EXCEPT ALL")
                sql += f" {op} "
            sql += f"SELECT {self.select_list(items, prefix)} FROM {src.sql}{self.where(src)}"
        return sql, kinds

    def q_setop(self) -> Query:
        sql, kinds = self.set_operation()
        outs = [Expr(f"c{i}", k) for i, k in enumerate(kinds)]
        # (copies of a row are equal rows: ordering every column is total)
        keys = list(range(len(kinds))) if "UNION ALL" not in sql else []
        clause, q = self.order_limit(outs, keys)
        q.sql = sql + clause
        return q

    def typed_item(self, src: Source, kind: str) -> Expr:
        e = self.expr(src, kind, self.rng.randint(0, 2))
        return e if e.exact else Expr(f"round({e.sql}, 3)", kind, False)

    def inner(self) -> tuple[str, list[Expr], list[int]]:
        """A subquery for WITH or FROM: its text, output kinds (as t.cN) and
        output positions that identify its rows."""
        if self.chance(0.12):
            sql, kinds = self.set_operation("i")
            cols = [Expr(f"t.i{i}", k) for i, k in enumerate(kinds)]
            return sql, cols, list(range(len(kinds)))
        src = self.source()
        if self.chance(0.5):
            gkeys, aggs = self.group_parts(src)
            items = gkeys + aggs
            sql = f"SELECT {self.select_list(items, 'i')} FROM {src.sql}{self.where(src)}"
            if gkeys:
                sql += " GROUP BY " + ", ".join(e.sql for e in gkeys)
            keys = list(range(len(gkeys))) if gkeys else [0]
        else:
            items = [self.item(src) for _ in range(self.rng.randint(1, 3))]
            keys = []
            for k in src.key:
                keys.append(len(items))
                items.append(Expr(k, "int" if not k.endswith("cache_id") else "id"))
            sql = f"SELECT {self.select_list(items, 'i')} FROM {src.sql}{self.where(src)}"
            if self.chance(0.3):  # a LIMIT inside needs a total order to be defined
                terms = self.led_by_expr([self.ref(k, "i") for k in keys], Query(""), src, 0.3)
                sql += " ORDER BY " + ", ".join(terms)
                sql += f" LIMIT {self.rng.randint(1, 30)}"
        cols = [Expr(f"t.i{i}", e.kind, e.exact) for i, e in enumerate(items)]
        return sql, cols, keys

    def outer(self, from_sql: str, cols: list[Expr], keys: list[int]) -> Query:
        src = Source(from_sql, [Col(e.sql, e.kind) for e in cols if e.exact], [])
        if not src.cols:
            src.cols = [Col(cols[0].sql, cols[0].kind)]
        if self.chance(0.3) and any(c.kind in ("int", "str") for c in src.cols):
            gcols = [c for c in src.cols if c.kind in ("int", "str", "bool")]
            g = self.pick(gcols) if gcols else src.cols[0]
            items = [Expr(g.ref, g.kind), self.aggregate(src)]
            sql = f"SELECT {self.select_list(items)} FROM {from_sql}{self.where(src)}"
            sql += f" GROUP BY {g.ref}"
            clause, q = self.order_limit(items, [0])
        else:
            items = [self.item(src) for _ in range(self.rng.randint(1, 3))]
            key_refs = [cols[k].sql for k in keys if cols[k].exact]
            full = len(key_refs) == len(keys) and keys
            sql = f"SELECT {self.select_list(items)} FROM {from_sql}{self.where(src)}"
            clause, q = self.order_limit(items, [], key_refs if full else None, src=src)
        q.sql = sql + clause
        return q

    def q_cte(self) -> Query:
        sql, cols, keys = self.inner()
        q = self.outer("t", cols, keys)
        q.sql = f"WITH t AS ({sql}) {q.sql}"
        return q

    def q_derived(self) -> Query:
        sql, cols, keys = self.inner()
        return self.outer(f"({sql}) t", cols, keys)

    def q_constant(self) -> Query:
        empty = Source("", [], [])
        items = [
            self.expr(empty, self.pick(["int", "float", "str", "bool"]), 2)
            for _ in range(self.rng.randint(1, 3))
        ]
        return Query(f"SELECT {self.select_list(items)}")


def _number(lit: str) -> tuple[bool, float]:
    """A numeric literal's place in SQL's order: NaN above every number."""
    if "NaN" in lit:
        return (True, 0.0)
    text = lit.strip("()")
    if text.startswith("CAST"):  # CAST('-Infinity' AS DOUBLE)
        return (False, float(text.split("'")[1]))
    return (False, float(text.removesuffix("e0")))

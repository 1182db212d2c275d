"""The search statements of the pgvector backend (pure): the scope of a search, nearest memories, full text.

Every statement runs after the owner setting that row-level security checks
(see :mod:`._pgsql`), and names the owner again so that the planner reads one
partition.
"""

from __future__ import annotations

from statekeep.memory._rows import to_us
from statekeep.memory._types import Filters
from statekeep.memory.pgvector._sql import SELECT_COLUMNS, TABLE, TIES, WORDS, literal, vector_expr


def scope_where(now_us: int | None, filters: Filters | None) -> tuple[str, dict[str, object]]:
    """The WHERE clause (after ``owner = :owner``) and its parameters for a scoped search."""
    parts = ["owner = :owner"]
    params: dict[str, object] = {}
    if now_us is not None:
        merged = filters is not None and filters.include_merged
        parts.append("superseded_by IS NULL" if merged else "superseded_by IS NULL AND duplicate_of IS NULL")
        parts.append("(expires_us IS NULL OR expires_us > :now_us)")
        params["now_us"] = now_us
    if filters is not None:
        parts.extend(_filter_parts(filters, params))
    return " AND ".join(parts), params


def _filter_parts(f: Filters, params: dict[str, object]) -> list[str]:
    parts = []
    if f.kinds:
        parts.append("kind = ANY(:kinds)")
        params["kinds"] = list(f.kinds)
    if f.tags:
        parts.append("tags @> CAST(:tags AS text[])")
        params["tags"] = list(f.tags)
    if f.since is not None:
        parts.append("created_us >= :since_us")
        params["since_us"] = to_us(f.since)
    if f.until is not None:
        parts.append("created_us < :until_us")
        params["until_us"] = to_us(f.until)
    if f.sources:
        parts.append("source = ANY(:sources)")
        params["sources"] = list(f.sources)
    if f.min_trust is not None:
        parts.append("trust >= :min_trust")
        params["min_trust"] = f.min_trust
    if f.sessions:
        parts.append("session_id = ANY(:sessions)")
        params["sessions"] = list(f.sessions)
    return parts


def best_sql(dimension: int) -> str:
    """A memory's best cosine with ``:q``: of its whole vector's and its sentences' (:mod:`._sentences`)."""
    vec = f"CAST(:q AS vector({int(dimension)}))"
    sentences = f"(SELECT max(1 - (s <=> {vec})) FROM unnest(sentences) AS s)"
    return f"greatest(1 - ({vector_expr(dimension)} <=> {vec}), {sentences})"


def cosines_sql(model: str, dimension: int) -> str:
    """The best cosine (:func:`best_sql`) of each of the owner's memories ``:ids`` embedded by ``model``."""
    return (
        f"SELECT id, {best_sql(dimension)} AS best FROM {TABLE} "
        f"WHERE owner = :owner AND id = ANY(:ids) AND model = {literal(model)}"
    )


def nearest_sql(model: str, dimension: int, clause: str, *, exact: bool = False, best: bool = False) -> str:
    """Nearest-neighbour search in one model's partial index (the model inlined to match it).

    Through the index (``exact=False``): the ``:k`` nearest, ties at the cut by :data:`TIES`.
    ``exact``: every row of the owner is ranked (never through the index, which may miss some),
    carrying only its id (a top-N sort of narrow rows, not of every column of every row), and
    the whole rows of the ``:k`` nearest are then read by primary key, in no order. Rows tied
    at the cut are cut arbitrarily: the caller asks for one more than it needs, and again for
    more if that one ties (:func:`_ranking.top_k`). ``best``: each row also has its best
    cosine (:func:`best_sql`), for a hybrid search.
    """
    expr, vec = vector_expr(dimension), f"CAST(:q AS vector({int(dimension)}))"
    distance = f"{expr} <=> {vec}" + (f" AS distance, {best_sql(dimension)} AS best" if best else "")
    where = f"{clause} AND model = {literal(model)}"
    if exact:
        # cosine_distance is what <=> computes, but no index can order by a function call: the planner
        # must rank every row, and never pick the approximate HNSW scan for a small owner
        ranked = f"SELECT id FROM {TABLE} WHERE {where} ORDER BY cosine_distance({expr}, {vec}) LIMIT :k"
        return (
            f"SELECT {SELECT_COLUMNS}, {distance}{'' if best else ' AS distance'} FROM {TABLE} "
            f"WHERE owner = :owner AND id = ANY(ARRAY({ranked}))"
        )
    return (
        f"SELECT {SELECT_COLUMNS}, {distance}{'' if best else ' AS distance'} FROM {TABLE} WHERE {where} "
        f"ORDER BY distance, {TIES} LIMIT :k"
    )


def nearest_each_sql(model: str, dimension: int, clause: str) -> str:
    """The nearest current memory to each of many vectors, in one round trip (for duplicate checks)."""
    expr, dim = vector_expr(dimension), int(dimension)
    # materialized, so each query vector is cast once, not once per candidate row
    return (
        f"WITH q AS MATERIALIZED (SELECT i, CAST(v AS vector({dim})) AS v "
        f"FROM unnest(CAST(:vs AS vector[])) WITH ORDINALITY AS u(v, i)) "
        f"SELECT q.i, m.* FROM q CROSS JOIN LATERAL (SELECT {SELECT_COLUMNS}, {expr} <=> q.v AS distance "
        f"FROM {TABLE} WHERE {clause} AND model = {literal(model)} ORDER BY distance, {TIES} LIMIT 1) AS m"
    )


#: Full-text search leaves out a query word found in more than this share of the owner's memories
#: (and in more than ``COMMON_WORD_MIN`` of them: in a handful of memories no word is common).
COMMON_WORD_SHARE = 0.1
COMMON_WORD_MIN = 10
#: A lexeme (text column ``lexeme``) as a quoted ``tsquery`` term: nothing in it is an operator.
_QUOTED_LEXEME = r"'''' || replace(replace(lexeme, '\', '\\'), '''', '''''') || ''''"
#: A kept word's weight: BM25's inverse document frequency over the owner's memories (``n.n`` of them,
#: ``df.c`` holding the word), squared, as in tf-idf's cosine (the query's and the memory's weight).
_IDF = "CAST(power(ln(1 + (n.n - df.c + 0.5) / (df.c + 0.5)), 2) AS double precision)"
#: The first kept words are ranked each by one call in the row's expression; more, by a subquery.
_WORD_SLOTS = 8
#: Only this many memories, the best by the plain ``ts_rank`` of the kept words, are weighted: the rest
#: cost time and change no recall (figures in docs/memory.md, backends).
RERANKED = 200


def _weighted_rank() -> str:
    """Sum over the kept words (``qq.ws``, weights ``qq.idfs``) of weight * ``ts_rank`` of the word alone."""
    each = "qq.idfs[{0}] * ts_rank(tsv, qq.ws[{0}], 1)"
    slots = " + ".join(f"coalesce({each.format(i)}, 0)" for i in range(1, _WORD_SLOTS + 1))
    more = f"qq.ws[{_WORD_SLOTS + 1}:], qq.idfs[{_WORD_SLOTS + 1}:]"
    rest = f"(SELECT sum(u.idf * ts_rank(tsv, u.w, 1)) FROM unnest({more}) AS u(w, idf))"
    return f"{slots} + CASE WHEN cardinality(qq.ws) > {_WORD_SLOTS} THEN {rest} ELSE 0 END"


def text_sql(clause: str, best: tuple[str, int] | None = None) -> str:
    """Full-text search: any distinctive word of the query matches (English stemming, stop words dropped).

    A word of the query found in more than ``COMMON_WORD_SHARE`` of the owner's memories
    and in more than ``COMMON_WORD_MIN`` (a speaker's name in every turn they said, "many"
    in "how many") is left out when the query has a rarer word (when every word is that
    common, all of them are kept): every memory holding it would have to be ranked. Each
    kept word is ranked alone by ``ts_rank`` (its count in the memory, saturating, divided
    by 1 + the log of the memory's length: normalisation 1, which suits memories of very
    different lengths) and weighs :data:`_IDF`, from the owner's counts only: PostgreSQL's
    full-text ranking has no inverse document frequency, and would rank a memory sharing
    only a frequent word of the query as high as one sharing its subject. Only the
    ``RERANKED`` best by the plain ``ts_rank`` of the kept words are weighted. Each word's
    count is one row of ``WORDS`` (migration 5). ``bench/retrieval.py`` chose all of this
    on its development split. ``best`` (a model and its dimension): each row also has its
    best cosine with ``:q`` (:func:`best_sql`) when embedded by that model, for a hybrid search.
    """
    cosine = ""
    if best is not None:
        cosine = f", CASE WHEN model = {literal(best[0])} THEN {best_sql(best[1])} END AS best"
    cap = f"greatest({COMMON_WORD_SHARE} * n.n, {COMMON_WORD_MIN})"
    count = f"coalesce((SELECT memories FROM {WORDS} WHERE owner = :owner AND word = {{}}), 0)"
    # counted up to the share and one more (capped): when every word is common, they are all kept
    capped = f"least(df.c, floor({cap}) + 1)"
    return (
        f"WITH n AS MATERIALIZED (SELECT {count.format(literal(''))} AS n), "
        f"df AS MATERIALIZED (SELECT lexeme, {count.format('lexeme')} AS c "
        "FROM unnest(tsvector_to_array(to_tsvector('english', :query))) AS lexeme), "
        f"kept AS MATERIALIZED (SELECT {_QUOTED_LEXEME} AS w, {_IDF} AS idf FROM df, n WHERE df.c > 0 "
        f"AND {capped} <= greatest({cap}, (SELECT min({capped}) FROM df, n WHERE df.c > 0))), "
        "qq AS MATERIALIZED (SELECT CAST(string_agg(w, ' | ' ORDER BY w) AS tsquery) AS q, "
        "array_agg(CAST(w AS tsquery) ORDER BY w) AS ws, array_agg(idf ORDER BY w) AS idfs FROM kept), "
        # the best by the plain ts_rank (every tie with the last kept), re-ranked on the text vector alone
        # (every tie with the k-th kept); the other columns only for the hits
        f"pool AS (SELECT id, tsv FROM qq, {TABLE} WHERE {clause} AND tsv @@ qq.q "
        f"ORDER BY ts_rank(tsv, qq.q, 1) DESC FETCH FIRST {RERANKED} ROWS WITH TIES), "
        f"top AS (SELECT id, {_weighted_rank()} AS rank FROM qq, pool "
        "ORDER BY rank DESC FETCH FIRST :k ROWS WITH TIES) "
        f"SELECT {SELECT_COLUMNS}, top.rank{cosine} FROM {TABLE} JOIN top USING (id) WHERE owner = :owner "
        f"ORDER BY top.rank DESC, {TIES} LIMIT :k"
    )

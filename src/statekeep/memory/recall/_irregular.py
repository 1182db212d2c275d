"""English irregular forms (past tenses, participles, plurals), read as their base form by full-text search.

The Snowball stemmer that both full-text rankings use folds regular inflections
("visits", "visited", "visiting" -> "visit") but not irregular ones: "When did
Caroline go to the support group?" shared no word with "I went to a LGBTQ support
group yesterday", nor "What did I buy?" with "I bought a coffee table". A past tense
is how people tell what they did, and the question asks with the base form after
"did", so both rankings read each form below as its base:

* LanceDB's ranking (:mod:`._bm25`) reads the word as its base before stemming, in
  memories and queries alike;
* PostgreSQL's text vector (migration 7) holds each form's base besides the word itself,
  and the query is read with its forms replaced by their bases (:func:`base_forms`),
  so that "went" and "go" find each other both ways.

Forms that are also common words of another meaning are left out ("left", "bit",
"rose", "lit", "bound", "lay"); what the table adds to recall is in docs/memory.md
(retrieval quality). PostgreSQL's copy of the table is its function ``irregular_bases``,
created by a migration: a change to this table needs a new migration.
"""

from __future__ import annotations

import re

#: Each group: the base form, then its irregular forms (a form equal to the base is not listed).
_GROUPS = """
arise arose arisen | awake awoke awoken | bear bore borne | beat beaten | become became
begin began begun | bend bent | bite bitten | bleed bled | blow blew blown | break broke broken
breed bred | bring brought | build built | burn burnt | buy bought | catch caught
choose chose chosen | cling clung | come came | creep crept | deal dealt | dig dug | dive dove
draw drew drawn | dream dreamt | drink drank drunk | drive drove driven | eat ate eaten
fall fell fallen | feed fed | feel felt | fight fought | find found | flee fled | fly flew flown
forbid forbade forbidden | forget forgot forgotten | forgive forgave forgiven | freeze froze frozen
get got gotten | give gave given | go went gone | grow grew grown | hang hung | hear heard
hide hid hidden | hold held | keep kept | kneel knelt | know knew known | lead led | leap leapt
learn learnt | lend lent | lose lost | make made | mean meant | meet met
mistake mistook mistaken | overcome overcame | pay paid | prove proven | ride rode ridden
ring rang rung | rise risen | run ran | say said | see saw seen | seek sought | sell sold
send sent | sew sewn | shake shook shaken | shine shone | shrink shrank shrunk | sing sang sung
sink sank sunk | sit sat | sleep slept | slide slid | speak spoke spoken | speed sped
spend spent | spill spilt | spin spun | spring sprang sprung | stand stood | steal stole stolen
stick stuck | sting stung | stink stank stunk | stride strode | strike struck
swear swore sworn | sweep swept | swim swam swum | swing swung | take took taken | teach taught
tear tore torn | tell told | think thought | throw threw thrown | understand understood
undertake undertook undertaken | wake woke woken | wear wore worn | weep wept | win won
withdraw withdrew withdrawn | write wrote written
child children | man men | woman women | foot feet | tooth teeth | mouse mice | goose geese
knife knives | wife wives
"""

#: Each irregular form (lower case) -> its base form.
BASE: dict[str, str] = {
    form: words[0]
    for group in _GROUPS.replace("\n", " | ").split("|")
    if (words := group.split())
    for form in words[1:]
}

#: A word of ASCII letters alone, as PostgreSQL's parser reads one: not a part of a longer word
#: ("sentí", "went2"), of an e-mail address, a URL or a path, or of a hyphenated word.
_WHOLE_WORD = re.compile(r"(?<![\w@./-])[A-Za-z]+(?![\w@]|[-./]\w)")
#: "won't" is "will not", not a past tense of "win" (the tokenizers split it into "won" and "t").
WONT = re.compile(r"\bwon['\u2019]t\b")
_ANY_CASE_WONT = re.compile(WONT.pattern, re.IGNORECASE)


def base_forms(text: str) -> str:
    """``text`` with each irregular form (a whole word, any case) replaced by its base ("went" -> "go")."""
    text = _ANY_CASE_WONT.sub("will not", text)
    return _WHOLE_WORD.sub(lambda m: BASE.get(m.group().lower(), m.group()), text)


def unwont(lowered: str) -> str:
    """``lowered`` (a text in lower case) with "won't" spelled "will not"."""
    return WONT.sub("will not", lowered) if "won" in lowered else lowered


def sql_function(schema: str) -> str:
    """PostgreSQL's copy of :data:`BASE`: ``{schema}.irregular_bases(text)``, the bases of a text's forms.

    The words are PostgreSQL's own (the ``simple`` configuration: its parser, lower case),
    each once, "won't" read as "will not" (:data:`WONT`); the bases come out in the order of
    their words, space separated. Memory migration 7 creates it from this table: a change
    to the table needs a new migration (a test holds the table's digest).
    """
    if not re.fullmatch(r"[a-z_]+", schema) or not all(
        re.fullmatch("[a-z]+", w) for w in (*BASE, *BASE.values())
    ):
        raise ValueError("the schema and every form must be lower-case letters")  # nothing to quote
    pairs = ", ".join(f"('{form}', '{base}')" for form, base in sorted(BASE.items()))
    return (
        f"CREATE FUNCTION {schema}.irregular_bases(t text) RETURNS text "
        "LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $fn$ "
        "SELECT coalesce(pg_catalog.string_agg(b.base, ' ' ORDER BY w.word), '') "
        "FROM pg_catalog.unnest(pg_catalog.tsvector_to_array(pg_catalog.to_tsvector('simple', "
        "pg_catalog.regexp_replace(t, E'\\\\mwon[''\u2019]t\\\\M', 'will not', 'gi')))) AS w(word) "
        f"JOIN (VALUES {pairs}) AS b(form, base) ON b.form = w.word $fn$"
    )

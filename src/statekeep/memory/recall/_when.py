"""The period a query names ("four weeks ago", "last Saturday", "in June"), resolved at the search's time.

A person asks a memory about a time as often as about a thing: "What did I buy four weeks
ago?", "Who gave me a necklace last Saturday?". Neither ranking sees the time: the words
"four weeks ago" are stop words or noise, and the memory that says "I bought a road bike
today" was written four weeks before. So hybrid search reads one English expression of
time from the query (:func:`window`), takes the memories written in that period as
candidates too (a second search with ``since``/``until``), and multiplies their fused
score by ``1 + Fusion.time_weight`` (:func:`._ranking.fuse_scores`).

What is read, at the store's clock ``now`` (days are UTC days):

* "N days / weeks / months / years ago" (N a number, "a", "a couple of", "a few",
  "several"): the day that long before, give or take a quarter of the span (a day at
  least);
* "yesterday"; "today", "tonight", "this morning";
* "last Monday" ... "last Sunday": the most recent such day before today;
* "last weekend", "this past weekend", "the past weekend": the Saturday and Sunday before today;
* "on Valentine's Day", "at Christmas" (and Christmas Eve, New Year's Eve and Day,
  Halloween): the last such day up to today, and the ``MONTH_SLACK`` days after it (what
  was done on a holiday is often told in the days after);
* "last / past / previous (N) days / weeks / months / years": from that long ago (and a
  quarter more) until now;
* "this week / month / year", "so far this year", "since the start (beginning) of the
  year": from the start of that week (Monday), month or year until now;
* "in / during / of / on January" ... "December", with a year or not ("May" only with
  one: "may" is mostly a verb): that month, three days each side, of this year or, for a
  month still to come, the year before.

The first kind found in that order is used; a query without any has no window. Chosen
on the development split of ``bench/retrieval.py`` (figures in docs/memory.md).
"""

from __future__ import annotations

import calendar
import re
from datetime import datetime, timedelta

_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
    "a couple of": 2, "a couple": 2, "couple of": 2, "a few": 3, "few": 3, "several": 3,
}  # fmt: skip
_N = r"(\d{1,4}|" + "|".join(sorted((re.escape(n) for n in _NUMBERS), key=len, reverse=True)) + ")"
_DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
_MONTHS = [m.lower() for m in calendar.month_name[1:]]
#: Days in a unit of time (a month and a year on average).
_UNIT = {"day": 1.0, "week": 7.0, "month": 30.44, "year": 365.25}
#: A period "ago" or "past" is taken this share of its span wider (people round: "a month ago").
SLACK = 0.25
#: Days added each side of a named month (a thing done at its end is often told just after).
MONTH_SLACK = 3

_AGO = re.compile(rf"\b{_N} (day|week|month|year)s? ago\b")
_PAST = re.compile(rf"\b(?:past|last|previous) (?:{_N} )?(day|week|month|year)s?\b")
_LAST_DAY = re.compile(rf"\blast ({'|'.join(_DAYS)})\b")
_LAST_WEEKEND = re.compile(r"\b(?:last|(?:this |the )?past) weekend\b")
#: Holidays on a fixed day of the year: (month, day); the apostrophe may be left out.
_HOLIDAYS = {
    r"new year'?s eve": (12, 31), r"new year'?s day": (1, 1), r"valentine'?s day": (2, 14),
    r"halloween": (10, 31), r"christmas eve": (12, 24), r"christmas(?: day)?": (12, 25),
}  # fmt: skip
_HOLIDAY = [(re.compile(rf"\b{h}\b"), date) for h, date in _HOLIDAYS.items()]
_THIS = re.compile(r"\b(?:this|since the (?:start|beginning) of (?:the|this)) (week|month|year)\b")
_YESTERDAY = re.compile(r"\byesterday\b")
_TODAY = re.compile(r"\b(?:today|tonight|this morning)\b")
_IN_MONTH = re.compile(rf"\b(?:in|during|of|on) ({'|'.join(_MONTHS)})(?:,? (\d{{4}}))?\b")


def _count(word: str | None) -> int:
    if word is None:
        return 1
    return int(word) if word.isdigit() else _NUMBERS[word]


def window(query: str, now: datetime) -> tuple[datetime, datetime] | None:
    """The period ``query`` names, as ``[since, until)`` in ``now``'s time zone, or None (also
    for a period outside the calendar: "9999 years ago").

    Examples:
        >>> from datetime import UTC, datetime
        >>> now = datetime(2023, 4, 1, 15, 0, tzinfo=UTC)  # a Saturday
        >>> since, until = window("What did I buy four weeks ago?", now)
        >>> since.date().isoformat(), until.date().isoformat()
        ('2023-02-25', '2023-03-12')
        >>> [d.date().isoformat() for d in window("Who called me last Wednesday?", now)]
        ['2023-03-29', '2023-03-30']
        >>> window("What did I buy?", now) is None
        True
    """
    try:
        return _window(query.lower().replace("\u2019", "'"), now)
    except (OverflowError, ValueError):  # before year 1 or after 9999
        return None


def _window(text: str, now: datetime) -> tuple[datetime, datetime] | None:
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    day = timedelta(days=1)
    if m := _AGO.search(text):
        days = _count(m.group(1)) * _UNIT[m.group(2)]
        slack = max(1.0, days * SLACK)
        middle = today - timedelta(days=days)
        return middle - timedelta(days=slack), middle + timedelta(days=slack) + day
    if _YESTERDAY.search(text):
        return today - day, today
    if m := _LAST_DAY.search(text):
        back = (today.weekday() - _DAYS.index(m.group(1))) % 7 or 7
        return today - back * day, today - (back - 1) * day
    if _LAST_WEEKEND.search(text):
        back = (today.weekday() - 5) % 7 or 7  # to the Saturday before today
        return today - back * day, today - (back - 2) * day
    if holiday := next((date for pattern, date in _HOLIDAY if pattern.search(text)), None):
        start = today.replace(month=holiday[0], day=holiday[1])
        if start > today:
            start = start.replace(year=today.year - 1)
        return start, start + (MONTH_SLACK + 1) * day
    if m := _PAST.search(text):
        days = _count(m.group(1)) * _UNIT[m.group(2)]
        return today - timedelta(days=days * (1 + SLACK)), today + day
    if m := _THIS.search(text):
        if m.group(1) == "week":
            start = today - today.weekday() * day
        else:
            start = today.replace(day=1) if m.group(1) == "month" else today.replace(month=1, day=1)
        return start, today + day
    if (m := _IN_MONTH.search(text)) and (m.group(1) != "may" or m.group(2)):
        month = _MONTHS.index(m.group(1)) + 1
        year = int(m.group(2)) if m.group(2) else now.year - (month > now.month)
        start = today.replace(year=year, month=month, day=1)
        end = start + calendar.monthrange(year, month)[1] * day
        return start - MONTH_SLACK * day, end + MONTH_SLACK * day
    if _TODAY.search(text):
        return today, today + day
    return None

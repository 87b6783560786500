"""The reading's comparisons, checked against the rows: every "A beats B" (and every "A and B
cannot be told apart") the hand-written reading of the benchmark page makes carries a marker,
an HTML comment the rendered page does not show, that states it in a form a test can check::

    FedDrift beats FedAvg on concept shift. <!-- claim: feddrift beats fedavg; shift concept -->
    IFCA and FedSoft tie there. <!-- claim: ifca ties fedsoft; shift concept -->
    <!-- claim: fedrep beats ifca; score current step; data digits; prior uniform -->

``A beats B`` holds when the pairwise test of the page (:func:`stats.beats`: Wilcoxon over the
scenarios, Holm over every pair of the ranked strategies) separates the two with A the higher;
``A ties B`` when it separates them neither way. The score is one of the page's
(:data:`stats.SCORES`, default the next step); the filters keep the rows whose field has the
value (``data``, ``shift``, ``pattern``, ``prior``, or ``group``: a scenario's group of the
per-shift tests, its shift or "no drift"), so a claim about one kind of shift is tested on
those scenarios alone, with Holm over that subset's pairs."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fedcluster_app.bench import stats as S
from fedcluster_app.core.user_text import suggest

MARKER = re.compile(r"<!--\s*claim:(.*?)-->", re.S)
VERBS = ("beats", "ties")
FILTERS = ("data", "shift", "pattern", "prior", "group")


@dataclass(frozen=True)
class Claim:
    a: str
    verb: str
    b: str
    score: str = "next step"
    where: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return "; ".join([f"{self.a} {self.verb} {self.b}", f"score {self.score}",
                          *(f"{k} {v}" for k, v in self.where)])


def parse(text: str) -> list[Claim]:
    """The claims of a page's text, in order; ValueError naming a malformed one."""
    return [_claim(m.group(1).strip()) for m in MARKER.finditer(text)]


def _claim(body: str) -> Claim:
    head, *clauses = [c.strip() for c in body.split(";")]
    words = head.split()
    if len(words) != 3 or words[1] not in VERBS:
        raise ValueError(f"claim {body!r}: it starts 'A beats B' or 'A ties B'")
    score, where = "next step", []
    for clause in filter(None, clauses):
        key, _, value = clause.partition(" ")
        value = value.strip()
        if key == "score":
            if value not in S.SCORES:
                raise ValueError(f"claim {body!r}: unknown score {value!r}"
                                 f"{suggest(value, S.SCORES)}; the scores: "
                                 f"{', '.join(S.SCORES)}")
            score = value
        elif key in FILTERS and value:
            where.append((key, value))
        else:
            raise ValueError(f"claim {body!r}: unknown clause {clause!r}; a clause is 'score "
                             f"S' or a filter ({', '.join(FILTERS)}) and its value"
                             f"{suggest(key, FILTERS)}")
    return Claim(words[0], words[1], words[2], score, tuple(where))


def rows_of(claim: Claim, rows: list[dict]) -> list[dict]:
    """The rows a claim is tested on."""
    def value(r: dict, key: str) -> str | None:
        return S.block_group(r) if key == "group" else r.get(key)

    kept = [r for r in rows if all(value(r, k) == v for k, v in claim.where)]
    if not kept:
        raise ValueError(f"claim '{claim}': no row has "
                         + " and ".join(f"{k} {v!r}" for k, v in claim.where))
    return kept


def check(claim: Claim, rows: list[dict]) -> str | None:
    """None when the claim holds on the rows, else what the test found instead."""
    subset = rows_of(claim, rows)
    key = S.SCORES[claim.score]
    winner, p, blocks = S.pair_winner(subset, claim.a, claim.b, key=key)
    if winner == (claim.a if claim.verb == "beats" else None):
        return None
    found = (f"{winner} beats {({claim.a, claim.b} - {winner}).pop()}" if winner
             else "the test does not separate them")
    return f"claim '{claim}' does not hold: {found} (Holm's p {p:.3g} over {blocks} scenarios)"


def check_all(text: str, rows: list[dict]) -> list[str]:
    """What fails among the text's claims (empty when every one holds)."""
    return [why for claim in parse(text) if (why := check(claim, rows))]

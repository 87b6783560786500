"""The reading's "A beats B" markers: parsed, checked against the rows by the page's pairwise
test, and every one in docs/benchmark/reading.md holding on the committed rows."""

from __future__ import annotations

import pytest

from fedcluster_app.bench import claims as C
from fedcluster_app.bench import report as R
from tests.bench.test_stats import _paired_rows, _rows
from tests.support import ROOT


def test_a_claim_holds_only_where_the_paired_test_separates_the_two():
    rows = _paired_rows()                  # a is 5 points above b in each of 12 scenarios; c = b
    text = ("a leads <!-- claim: a beats b --> and b, c tie <!--claim: b ties c; score next step-->")
    assert [str(c) for c in C.parse(text)] == ["a beats b; score next step",
                                              "b ties c; score next step"]
    assert C.check_all(text, rows) == []
    assert C.check_all("<!-- claim: b beats a -->", rows) == [
        "claim 'b beats a; score next step' does not hold: a beats b (Holm's p 0.00146 over 12 "
        "scenarios)"]
    assert "the test does not separate them" in C.check_all("<!-- claim: c beats b -->", rows)[0]
    assert "does not hold: a beats b" in C.check_all("<!-- claim: a ties b -->", rows)[0]
    # three scenarios cannot separate even a difference in every one of them
    assert C.check_all("<!-- claim: a beats b -->", _paired_rows(3)) != []


def test_a_filter_tests_the_claim_on_those_scenarios_alone():
    # a is above b on concept shift, below it on label shift: overall no test separates them
    up = {f"c{i}": {"a": [.8 + i / 100], "b": [.7 + i / 100]} for i in range(8)}
    down = {f"l{i}": {"a": [.7 + i / 100], "b": [.8 + i / 100]} for i in range(8)}
    rows = _rows(up, shift="concept") + _rows(down, shift="label")
    assert C.check_all("<!-- claim: a ties b -->", rows) == []
    assert C.check_all("<!-- claim: a beats b; shift concept -->", rows) == []
    assert C.check_all("<!-- claim: b beats a; group label -->", rows) == []
    assert C.check_all("<!-- claim: a beats b; shift label -->", rows) != []


def test_a_malformed_claim_is_refused_with_what_is_wrong():
    rows = _paired_rows()
    with pytest.raises(ValueError, match="it starts 'A beats B' or 'A ties B'"):
        C.parse("<!-- claim: a outperforms b -->")
    with pytest.raises(ValueError, match=r"unknown score 'next stp' \(did you mean 'next step'"):
        C.parse("<!-- claim: a beats b; score next stp -->")
    with pytest.raises(ValueError, match=r"unknown clause 'shfit concept'.*did you mean 'shift'"):
        C.parse("<!-- claim: a beats b; shfit concept -->")
    with pytest.raises(ValueError, match="no row has shift 'feature'"):
        C.check_all("<!-- claim: a beats b; shift feature -->", rows)
    with pytest.raises(ValueError, match=r"unknown strategy 'bb'.*did you mean 'b'"):
        C.check_all("<!-- claim: a beats bb -->", rows)
    with pytest.raises(ValueError, match="'oracle' is a reference"):
        C.check_all("<!-- claim: oracle beats a -->", rows)


@pytest.mark.parametrize(("folder", "markers"), [("", 40), ("scale", 8)])
def test_every_claim_of_the_benchmark_reading_holds_on_the_committed_rows(folder, markers):
    """The headline page's reading and the scale tier's (100 clients, 20% a round), each on
    its own rows."""
    page = ROOT / "docs" / "benchmark" / folder
    reading = (page / "reading.md").read_text()
    assert len(C.parse(reading)) >= markers  # the reading's comparisons carry their markers
    failures = C.check_all(reading, R.read_rows(page / "runs.jsonl"))
    assert failures == [], "\n".join(failures)

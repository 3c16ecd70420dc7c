"""The run summary's schema (degnn/metrics/summary.py) and docs/design.md's list of its keys agree,
every pipeline's own keys are a dataclass that repeats no shared key, and a byte category must be
declared before it is counted."""
from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from degnn.metrics import ByteCounter
from degnn.metrics.summary import RunSummary, summary_keys, to_dict

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"


def documented(tag: str) -> set:
    text = DESIGN.read_text()
    block = re.search(rf"<!-- summary-keys:{tag} -->(.*?)<!-- /summary-keys -->", text, re.S).group(1)
    return set(re.findall(r"`([a-z_0-9]+)`", re.sub(r"\([^)]*\)", "", block)))


def test_design_lists_exactly_the_shared_keys():
    assert documented("shared") == {f.name for f in fields(RunSummary)}


def test_pipeline_keys_are_their_own():
    from degnn.pipelines.tma import TMASummary

    shared = set(summary_keys())
    assert not shared & {f.name for f in fields(TMASummary)}


def test_a_key_defined_twice_is_refused():
    from dataclasses import dataclass

    @dataclass
    class Clash:
        status: str = "x"

    s = RunSummary(pipeline="p", variant="v", dataset="d", task="node", metric="acc", model="sage",
                   layers=2, hidden=8, fanouts=[1, 1], machines=1, trainers=1)
    assert "error" not in to_dict(s)  # only a failed run has one
    with pytest.raises(ValueError, match="status"):
        to_dict(s, Clash())


def test_an_undeclared_byte_category_fails_at_once():
    c = ByteCounter()
    c.add("features", 10)
    with pytest.raises(KeyError, match="featurs"):
        c.add("featurs", 10)
    c.declare(["lamp_request"])
    c.add("lamp_request", 3)
    assert c.as_dict() == {"features": 10, "lamp_request": 3}


def test_a_phase_timed_inside_another_counts_for_itself_only():
    import time

    from degnn.metrics import PhaseTimer

    t = PhaseTimer()
    with t("sampling"):  # the loop's next(batches)
        time.sleep(0.02)
        with t("owner_wait"):  # a pipeline waiting for its answers inside it
            time.sleep(0.05)
    assert 0.015 < t.total["sampling"] < 0.045 and t.total["owner_wait"] >= 0.05

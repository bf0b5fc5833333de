"""lab/api.py's `at_rest`: when the lab's fault tests and bench/lab may inject a fault without
racing a plan C4P is about to apply or whose connections are still reconnecting."""
from __future__ import annotations

from typing import Any

from c4.lab.api import SETTLE_S, at_rest

NOW = 1000.0


def view(auto: bool = True, known: bool = True, gains: bool = False,
         last: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"auto_apply": auto, "last_plan": last,
            "proposal": {"current_max_util": 0.8 if known else None, "gains": gains}}


def plan(age: float, waiting: list[str] | None = None) -> dict[str, Any]:
    return {"created": NOW - age, "waiting": waiting or []}


def test_applying_on_its_own_it_rests_once_it_knows_the_links_and_would_not_move_the_job() -> None:
    assert at_rest(view(), NOW)
    assert not at_rest(view(known=False), NOW)  # what the links carry not measured yet
    assert not at_rest(view(gains=True), NOW)  # the next periodic plan would be applied
    assert not at_rest({"auto_apply": True, "proposal": None, "last_plan": None}, NOW)


def test_the_last_plan_must_have_reconnected_and_settled() -> None:
    assert not at_rest(view(last=plan(SETTLE_S - 1)), NOW)
    assert not at_rest(view(last=plan(SETTLE_S + 5, ["r1c0"])), NOW)
    assert at_rest(view(last=plan(SETTLE_S)), NOW)


def test_with_auto_apply_off_nothing_moves_the_job() -> None:
    assert at_rest(view(auto=False, known=False, gains=True, last=plan(1, ["x"])), NOW)

"""The budget's one check, which both lanes call: may work whose worst case is `worst` be spent now? What the budget
counts as spent (`budget_spent`: committed usage, unpriced models at the dearest, lost real-time calls at their worst)
and what is in flight (the journal's worst cases) read once here, the rule itself pure (`decide._budget.may_spend`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..._prices import PriceTable
from ...decide._budget import Spend, SpendDecision, may_spend
from ...state._journal import Journal
from ._summary import budget_spent


@dataclass(frozen=True)
class SpendCheck:
    """The decision, with the figures it was taken on (for the events that report it)."""

    decision: SpendDecision
    spent: float
    in_flight: float

    @property
    def action(self) -> Spend:
        return self.decision.action


def check_spend(journal: Journal, prices: PriceTable, budget: float, worst: float, requests: int) -> SpendCheck:
    """Whether work of worst case `worst` (USD, over `requests` requests) fits the budget now: go, wait for what is in
    flight to settle, cut it to what fits, or stop (`Spend`)."""
    spent, in_flight = budget_spent(journal, prices), journal.in_flight_worst()
    return SpendCheck(may_spend(budget=budget, spent=spent, in_flight=in_flight, worst=worst, requests=requests),
                      spent, in_flight)

"""The whole system in simulated time: a seeded swarm of nights that looks for broken promises.

Each seed draws a world (`_world`): the fake's roughness (turnarounds from minutes to past a batch's 24-hour life,
listing lag, 404 windows, damaged downloads, usage as an estimate, errored first attempts, lost create answers,
5xx/429/529, an account refusal later lifted, tokens that expire, real-time limits with acceleration, a disk that
fills) and several jobs on one SQLite ledger (priorities and shares, budgets, deadlines, prompt caching), started,
stopped and killed at drawn moments and points. `_sim` runs the real `submit` of each against the fake served in
process, on trio's mock clock; `_invariants` checks the promises after every world. The same seed replays the same
night exactly::

    python -m gatekeeper.testing.swarm --seeds 200 [--first S] [--hours H] [--jobs J]
"""

from ._run import SeedReport, main, run_seed

__all__ = ["SeedReport", "main", "run_seed"]

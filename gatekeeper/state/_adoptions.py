"""Batches found by listing after a create's answer was lost, and whose they proved to be: the journal's record
of ownership (`decide._ownership` weighs the evidence; this keeps what was decided)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._db import Db
from ._journal_base import JournalBase
from ._records import BatchRow, BatchState


class Adoptions:
    """Which batches are ours, and how each adopted one was proven."""

    def __init__(self, core: JournalBase) -> None:
        self.core = core
        self.db = core.db

    def known_batch_ids(self) -> set[str]:
        """Batches that are not a candidate for an unknown create: ours, those found not to be (`not_ours`), and
        those kept apart beside an unproven adoption (`apart`)."""
        ours = {r[0] for r in self.db.execute("SELECT batch_id FROM batches WHERE batch_id IS NOT NULL")}
        apart = {b for ids in (self.core.get_meta("kept_apart") or {}).values() for b in ids}
        return ours | set(self.core.get_meta("not_ours") or []) | apart

    def keep_apart(self, db: Db, idx: int, batch_ids: Iterable[str]) -> None:
        """Candidates the evidence could not tell from batch `idx`'s unproven adoption: collected with it, each
        answer kept apart (never joined, never resent)."""
        ids = sorted(batch_ids)
        self.core.put_meta(db, "kept_apart", {**(self.core.get_meta("kept_apart") or {}), str(idx): ids})
        self.core.note(db, "kept_apart", idx, ids=ids)

    def apart(self, idx: int) -> list[str]:
        """The candidates kept apart beside batch `idx`'s adoption (`keep_apart`)."""
        return list((self.core.get_meta("kept_apart") or {}).get(str(idx)) or [])

    def all_apart(self) -> list[str]:
        return sorted(b for ids in (self.core.get_meta("kept_apart") or {}).values() for b in ids)

    def _unkeep(self, db: Db, idx: int) -> None:
        kept = self.core.get_meta("kept_apart") or {}
        if str(idx) in kept:
            self.core.put_meta(db, "kept_apart", {k: v for k, v in kept.items() if k != str(idx)})

    def not_ours(self, idx: int, batch_id: str, why: str = "foreign custom_ids") -> None:
        """A batch adopted from the listing whose results prove it another job's: the create's outcome is
        unknown again (ours may exist, not listed then), and that batch is never a candidate again."""
        with self.core.transaction() as db:
            self.core.put_meta(db, "not_ours", sorted({*(self.core.get_meta("not_ours") or []), batch_id}))  # (same connection)
            adopted = {k: v for k, v in (self.core.get_meta("adopted") or {}).items() if k != str(idx)}
            self.core.put_meta(db, "adopted", adopted)
            self._unkeep(db, idx)
            self.core.set_state(db, idx, self._unknown(idx), batch_id=None, created_at=None, ended_at=None, counts=None)
            self.core.note(db, "adoption_undone", idx, id=batch_id, why=why)

    def reopen(self, idx: int, batch_id: str, why: str) -> None:
        """A batch adopted from the listing alone that another listed batch may be ours instead of: the create's
        outcome is unknown again, and both are compared by their results (neither is set aside)."""
        with self.core.transaction() as db:
            adopted = {k: v for k, v in (self.core.get_meta("adopted") or {}).items() if k != str(idx)}
            self.core.put_meta(db, "adopted", adopted)
            self._unkeep(db, idx)
            self.core.set_state(db, idx, self._unknown(idx), batch_id=None, created_at=None, ended_at=None, counts=None)
            self.core.note(db, "adoption_reopened", idx, id=batch_id, why=why)

    def _unknown(self, idx: int) -> BatchState:
        """The state of a create whose outcome is unknown again: `cut` for one the deadline cut (its requests stay
        the real-time lane's), else `intent`."""
        return BatchState.CUT if self.core.batch(idx).cut else BatchState.INTENT

    def foreign(self, batch_ids: Iterable[str]) -> None:
        """Batches whose results proved them another submitter's: never a candidate again."""
        with self.core.transaction() as db:
            self.core.put_meta(db, "not_ours", sorted({*(self.core.get_meta("not_ours") or []), *batch_ids}))

    def of(self, idx: int) -> dict[str, Any] | None:
        """How batch `idx` was found to be ours, when by listing: {"id", "proof"}, proof "listing" (to be checked
        against its results when collected), "results" (they proved it) or "unproven" (they could not tell)."""
        entry = (self.core.get_meta("adopted") or {}).get(str(idx))
        return dict(entry) if entry else None

    def proven_batches(self) -> list[BatchRow]:
        """Batches proven ours because their create was answered (not found by listing), in index order."""
        adopted = {int(k) for k in (self.core.get_meta("adopted") or {})}
        return [r for r in self.core.batches(BatchState.CREATED, BatchState.ENDED, BatchState.COLLECTED)
                if r.batch_id and r.idx not in adopted]

    def set(self, idx: int, batch_id: str, proof: str) -> None:
        with self.core.transaction() as db:
            self.record(db, idx, batch_id, proof)

    def record(self, db: Db, idx: int, batch_id: str, proof: str) -> None:
        adopted = {**(self.core.get_meta("adopted") or {}), str(idx): {"id": batch_id, "proof": proof}}
        self.core.put_meta(db, "adopted", adopted)
        self.core.note(db, "adoption_" + proof, idx, id=batch_id)

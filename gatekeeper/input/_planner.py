"""The dry-run sizing report (`plan`): counts, rejections, and the batches the splitter cuts.

It walks the same `reader.scan` and the same `sizing.Packer` as `iter_batches` (in `_batches`) and `submit`, so
the batches `plan` reports are the batches `submit` sends.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, MutableSequence, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from .._errors import InputError
from .._prices import BYTES_PER_TOKEN_ESTIMATE, PriceTable, estimate_input_tokens
from ._caching import CacheScan
from ._parallel import Segment, parallel_scan, use_parallel
from ._reader import Rejection, ScanStats, request_reader, scan, validate
from ._reasons import too_large
from ._sizing import Limits, Packer, max_item_bytes

if TYPE_CHECKING:
    from ._reader import ModelRules, Source


class BatchPlan(msgspec.Struct, frozen=True):
    """One batch as the splitter cut it: where its lines are and how big its body is. `index` counts from 0 in input
    order; `bytes` is the exact length of the create body; `start_offset` is the byte offset of the first line and
    `end_offset` the one just past the last (-1 for an iterable source)."""

    index: int
    requests: int = 0
    bytes: int = 0
    first_line: int = 0
    last_line: int = 0
    start_offset: int = -1
    end_offset: int = -1
    first_custom_id: str = ""
    last_custom_id: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "requests": self.requests,
            "bytes": self.bytes,
            "first_line": self.first_line,
            "last_line": self.last_line,
            "first_custom_id": self.first_custom_id,
            "last_custom_id": self.last_custom_id,
        }


class PlanReport(msgspec.Struct, kw_only=True):
    """What `plan` found: counts, every rejection (or the first `errors_kept`, the rest counted), and the batches."""

    limits: Limits
    lines: int = 0  # lines read, blank ones included
    requests: int = 0  # valid requests
    errors: list[Rejection] = []
    errors_kept: int | None = None  # None: every rejection kept; else the first so many (a table's plan: flat memory)
    dropped: MutableSequence[int] = msgspec.field(default_factory=lambda: array("I"))  # lines rejected past `errors_kept`
    dropped_by_model: dict[str, int] = {}  # of those, the ones a model's rule refused (`model 'x': ...`), by model
    batches: list[BatchPlan] = []
    largest_bytes: int = 0
    largest_line: int = 0
    largest_custom_id: str = ""
    models: dict[str, int] = {}  # valid requests per model
    model_bytes: dict[str, int] = {}  # request bytes per model
    request_bytes: int = 0  # sum of the valid requests' bytes
    content_hash: str = ""  # sha256 of a file source's bytes, when asked for
    max_tokens_peak: dict[str, int] = {}  # the largest max_tokens per model
    preflight: dict[str, Any] | None = None  # what the Models API said of the input's models (None: not asked)
    calibration: dict[str, Any] | None = None  # tokens per byte measured with count_tokens (None: not measured)
    cache_scan: CacheScan | None = None  # what the reader noted about prompt caching (`caching` reports it)

    @property
    def invalid(self) -> int:
        return len(self.errors) + len(self.dropped)

    @property
    def ok(self) -> bool:
        return not self.invalid

    def reject(self, rejection: Rejection) -> None:
        """Note a rejected line: kept, or past `errors_kept` its number alone, 4 bytes (and its model counted, for the
        preflight's tally)."""
        if self.errors_kept is None or len(self.errors) < self.errors_kept:
            self.errors.append(rejection)
            return
        self.dropped.append(rejection.line)
        head = rejection.reason.partition(": ")[0]
        if head.startswith("model "):
            self.dropped_by_model[head] = self.dropped_by_model.get(head, 0) + 1

    def estimate(self, prices: PriceTable) -> dict[str, Any]:
        """Input tokens and cost before anything is sent (output tokens cannot be known yet).

        Per model: measured tokens per byte when `calibration` has the model (count_tokens on a sample),
        else bytes / 4, and each model's entry says which."""
        measured = (self.calibration or {}).get("models") or {}
        per_model = {}
        total: float | None = 0.0
        for model, nbytes in self.model_bytes.items():
            m = measured.get(model)
            tokens = round(nbytes * m["tokens_per_byte"]) if m else estimate_input_tokens(nbytes)
            cost = prices.cost(model, tokens, 0)
            per_model[model] = {"input_tokens": tokens, "cost_usd": None if cost is None else round(cost, 6),
                                "method": "count_tokens" if m else f"bytes / {BYTES_PER_TOKEN_ESTIMATE:g}",
                                **({"sample": m["sample"], "spread_tokens_per_byte": m["spread"],
                                    "tokens_per_byte": m["tokens_per_byte"]} if m else {})}
            total = None if cost is None or total is None else total + cost
        how = (f"count_tokens on a sample of up to {(self.calibration or {}).get('per_model')} requests per model"
               if measured else f"request bytes / {BYTES_PER_TOKEN_ESTIMATE:g} per token ({self.unmeasured()})")
        return {
            "input_tokens": sum(v["input_tokens"] for v in per_model.values()),
            "input_cost_usd": None if total is None else round(total, 6),
            "models": per_model,
            "method": f"{how}; batch prices as of {prices.as_of}; output not included",
        }

    def unmeasured(self) -> str:
        """Why the tokens were not measured: count_tokens's failure, else the models not checked, else not asked."""
        why = (self.calibration or {}).get("reason") or (self.preflight or {}).get("reason")
        return f"not measured: {why}" if why else "not measured: count_tokens not asked (no key, or preflight off)"

    def caching(self, prices: PriceTable) -> dict[str, Any] | None:
        """The caching report (`_cachereport.caching_report`): None when no line marks or shares a long prefix."""
        from ._cachereport import caching_report

        return caching_report(self, prices)

    def to_json(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "requests": self.requests,
            "invalid": self.invalid,
            "errors": [e.to_json() for e in self.errors],
            "batches": [b.to_json() for b in self.batches],
            "largest_request": (
                {"bytes": self.largest_bytes, "line": self.largest_line, "custom_id": self.largest_custom_id}
                if self.requests
                else None
            ),
            "models": dict(sorted(self.models.items(), key=lambda kv: (-kv[1], kv[0]))),
            "request_bytes": self.request_bytes,
            "preflight": self.preflight or {"checked": False, "reason": "no workspace key: the models were not checked"},
            "limits": {"max_requests": self.limits.max_requests, "max_bytes": self.limits.max_bytes},
        }


def plan(
    source: Source,
    *,
    limits: Limits | None = None,
    hash_content: bool = False,
    workers: int | None = None,
    models: ModelRules | None = None,
    ids_in_memory: int | None = None,
    errors_kept: int | None = None,
) -> PlanReport:
    """Validate and size `source` in one pass; nothing is sent.

    `source` is a path ("-" for stdin) or an iterable of requests (dicts or
    encoded JSON lines). With `workers` (a file only), that many forked processes
    validate it in parallel: do not ask for it from a process that runs threads.
    A file of more than `ids_in_memory` custom_ids (default 1,048,576) sets them
    aside on disk (TMPDIR) to tell repeats, and is read a second time if it has any.
    `errors_kept` keeps only the first so many rejections, counting the rest (memory stays flat however many).
    Example::

        report = gatekeeper.plan("requests.jsonl", limits=Limits(max_requests=50_000))
        print(report.requests, len(report.batches), report.invalid)
    """
    limits = limits or Limits()
    repeats = None
    while True:  # twice only for a file whose repeated ids were told at the end (`_duplicates`)
        report = PlanReport(limits=limits, errors_kept=errors_kept)
        report.cache_scan = CacheScan()
        stats = ScanStats()
        if use_parallel(source, hash_content, workers):
            _plan_segments(os.fspath(source), report, workers or 2, models, stats,  # type: ignore[arg-type]
                           ids_in_memory, repeats)
        else:
            _plan_rows(source, report, hash_content, models, stats, ids_in_memory, repeats)
        if not stats.repeats:
            break
        repeats = stats.repeats
    report.models = {m: c for m, c in report.models.items() if c}
    report.model_bytes = {m: b for m, b in report.model_bytes.items() if m in report.models}
    report.requests = sum(report.models.values())
    if not report.requests and not report.invalid:  # one rule for plan, submit and the library
        name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "the requests given"
        raise InputError(f"{'standard input' if name == '-' else name} holds no requests (it is empty, or only blank "
                         "lines): there is nothing to plan or submit")
    return report


def _plan_rows(source: Source, report: PlanReport, hash_content: bool, rules: ModelRules | None, stats: ScanStats,
               ids_in_memory: int | None, repeats: dict[int, int] | None) -> None:
    """One process, one Python step a request, cut by `Packer` (the one packing rule)."""
    hasher = None
    if hash_content:
        import hashlib  # (only a submit hashes its input: plan starts without it)

        hasher = hashlib.sha256()
    packer = Packer(report.limits)
    batches, models, model_bytes = report.batches, report.models, report.model_bytes
    total = largest = 0
    first = last = (0, 0, "", 0)  # (line, offset, custom_id, bytes) of the open batch's first and last requests
    for line, offset, cid, model, n, _ in scan(
        source, report.reject, item_limit=max_item_bytes(report.limits.max_bytes), stats=stats, hasher=hasher,
        ids_in_memory=ids_in_memory, repeats=repeats, models=rules,
        peaks=report.max_tokens_peak if rules is not None else None, cache=report.cache_scan,
        api_version=report.limits.api_version,
    ):
        if packer.add(n):
            if packer.batches > 1:
                batches.append(_batch_plan(len(batches), *packer.closed, first, last))
            first = (line, offset, cid, n)
        last = (line, offset, cid, n)
        total += n
        models[model] = models.get(model, 0) + 1
        model_bytes[model] = model_bytes.get(model, 0) + n
        if n > largest:
            largest = n
            report.largest_bytes, report.largest_line, report.largest_custom_id = n, line, cid
    if packer.count:
        batches.append(_batch_plan(len(batches), packer.count, packer.size, first, last))
    report.lines = stats.lines
    report.request_bytes = total
    if hasher is not None:
        report.content_hash = hasher.hexdigest()


def _plan_segments(path: str, report: PlanReport, workers: int, rules: ModelRules | None, stats: ScanStats,
                   ids_in_memory: int | None, repeats: dict[int, int] | None) -> None:
    """Several processes: the reader hands over arrays a piece at a time and `Packer.add_many` cuts them.

    custom_ids are read back from the file only for batch edges and the largest request.
    """
    packer = Packer(report.limits)
    batches = report.batches
    fd = os.open(path, os.O_RDONLY)
    try:
        request_at = request_reader(fd)

        def edge(seg: Segment, k: int) -> tuple[int, int, str, int]:
            offset = seg.offsets[k]
            return seg.base + seg.lines[k], offset, request_at(offset)[0], seg.lengths[k]

        first = (0, 0, "", 0)
        last_at: tuple[Segment, int] | None = None  # where the open batch's last request is: read back only if it closes
        total = largest = 0
        largest_at: tuple[Segment, int] | None = None
        for seg in parallel_scan(path, report.reject, item_limit=max_item_bytes(report.limits.max_bytes),
                                 stats=stats, models=report.models, model_bytes=report.model_bytes, workers=workers,
                                 rules=rules, peaks=report.max_tokens_peak, cache=report.cache_scan,
                                 api_version=report.limits.api_version, ids_in_memory=ids_in_memory,
                                 repeats=repeats):
            lengths = seg.lengths
            if not lengths:
                continue
            for k, closed_count, closed_size in packer.add_many(lengths, seg.total):
                if closed_count:
                    closing = (seg, k - 1) if k else last_at
                    assert closing is not None  # a batch closes only after some request joined it
                    batches.append(_batch_plan(len(batches), closed_count, closed_size, first, edge(*closing)))
                first = edge(seg, k)
            last_at = (seg, len(lengths) - 1)
            total += seg.total
            top, at = seg.largest
            if top > largest:
                largest, largest_at = top, (seg, at)
        if packer.count and last_at is not None:
            batches.append(_batch_plan(len(batches), packer.count, packer.size, first, edge(*last_at)))
        if largest_at is not None:
            line, _, cid, n = edge(*largest_at)
            report.largest_bytes, report.largest_line, report.largest_custom_id = n, line, cid
    finally:
        os.close(fd)
    report.lines = stats.lines
    report.request_bytes = total


class SizedPlan:
    """`plan` of a file of valid, unique requests of one model with no caching facts (the probe of `plain_request`
    says so), from each request's size and custom_id, in order, as the caller makes them: cut by the same `Packer`,
    it is the report `plan` gives of that file, without the file being written or read. A request over the batch
    limit is rejected here, as the reader rejects it."""

    def __init__(self, limits: Limits, model: str, errors_kept: int | None = None) -> None:
        self.report = PlanReport(limits=limits, errors_kept=errors_kept)
        self.report.cache_scan = CacheScan()
        self.model, self.packer = model, Packer(limits)
        self.item_limit = max_item_bytes(limits.max_bytes)
        self.lines = self.offset = 0  # lines and bytes written before the next call's
        self.first = self.last = (0, 0, "", 0)  # (line, offset, custom_id, bytes) of the open batch's ends

    def add(self, sizes: list[int], cids: Sequence[str]) -> None:
        at = self._edges(sizes, cids)
        if max(sizes, default=0) > self.item_limit:
            for k in [k for k, n in enumerate(sizes) if n > self.item_limit]:
                self.report.reject(Rejection(self.lines + 1 + k, cids[k], too_large(sizes[k], self.item_limit)))
            kept = [k for k, n in enumerate(sizes) if n <= self.item_limit]
            self._pack([sizes[k] for k in kept], lambda i: at(kept[i]))
        else:
            self._pack(sizes, at)
        self.lines += len(sizes)
        self.offset += sum(sizes) + len(sizes)

    def _edges(self, sizes: list[int], cids: Sequence[str]) -> Callable[[int], tuple[int, int, str, int]]:
        def at(k: int) -> tuple[int, int, str, int]:  # (offsets summed only for the few requests at batch edges)
            return self.lines + 1 + k, self.offset + sum(sizes[:k]) + k, cids[k], sizes[k]

        return at

    def _pack(self, sizes: list[int], at: Callable[[int], tuple[int, int, str, int]]) -> None:
        if not sizes:
            return
        r, total = self.report, sum(sizes)
        for k, closed_count, closed_size in self.packer.add_many(sizes, total):
            if closed_count:
                r.batches.append(_batch_plan(len(r.batches), closed_count, closed_size, self.first,
                                             at(k - 1) if k else self.last))
            self.first = at(k)
        self.last = at(len(sizes) - 1)
        top = max(sizes)
        if top > r.largest_bytes:
            r.largest_line, _, r.largest_custom_id, r.largest_bytes = at(sizes.index(top))
        r.request_bytes += total
        r.models[self.model] = r.models.get(self.model, 0) + len(sizes)
        r.model_bytes[self.model] = r.model_bytes.get(self.model, 0) + total

    def finish(self) -> PlanReport:
        r = self.report
        if self.packer.count:
            r.batches.append(_batch_plan(len(r.batches), self.packer.count, self.packer.size, self.first, self.last))
        r.lines, r.requests = self.lines, sum(r.models.values())
        return r


def plain_request(line: bytes, limits: Limits) -> bool:
    """Whether `plan` takes this request line with nothing to note: valid (under `limits`' API version), and with no
    cache marker, tool list or long system prompt (the caching report's facts). A file of requests that differ
    from it only in their prompts' text can be planned from their sizes (`SizedPlan`)."""
    scan_ = CacheScan()
    refused: list[Rejection] = []
    for _ in validate([line + b"\n"], refused.append, item_limit=max_item_bytes(limits.max_bytes), from_file=False,
                      cache=scan_, api_version=limits.api_version):
        pass
    return not refused and not len(scan_) and not scan_.unmarked


def _batch_plan(
    index: int, count: int, size: int, first: tuple[int, int, str, int], last: tuple[int, int, str, int]
) -> BatchPlan:
    last_line, last_offset, last_cid, last_len = last
    return BatchPlan(
        index=index,
        requests=count,
        bytes=size,
        first_line=first[0],
        last_line=last_line,
        start_offset=first[1],
        end_offset=last_offset + last_len if last_offset >= 0 else -1,
        first_custom_id=first[2],
        last_custom_id=last_cid,
    )

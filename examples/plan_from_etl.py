"""Plan a batch job from an ETL step without writing a file.

Run: python examples/plan_from_etl.py
"""

from __future__ import annotations

import gatekeeper


def rows():
    for i in range(2500):
        yield {
            "custom_id": f"doc-{i:06d}",
            "params": {
                "model": "claude-haiku-4-5-20251001",
                "max_tokens": 256,
                "messages": [{"role": "user", "content": f"Classify document {i} as invoice, receipt or other."}],
            },
        }


report = gatekeeper.plan(rows(), limits=gatekeeper.Limits(max_requests=1000))
print(f"{report.requests} valid, {report.invalid} rejected, {len(report.batches)} batches")
for batch in report.batches:
    print(f"  batch {batch.index}: {batch.requests} requests, {batch.bytes:,} bytes")

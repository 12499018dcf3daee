"""Benchmark: kvadvise against published llama.cpp logs, without pytest.

For every log of tests/data/published (source, build, launcher and the run it implies, see
tests/published_logs.py) prints each buffer the log prints next to kvadvise's figure: KV (exact to
the printed 0.01 MiB) and compute, device and host apart (within 16 MiB or 3 %). Logs kvadvise does
not model are marked xfail with their reason. Exits 1 when a log not marked xfail misses.

    python benchmarks/bench_published.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from published_logs import LOGS, BufferRow, compare, table


def main() -> int:
    rows: list[BufferRow] = []
    for log in LOGS:
        rows.extend(compare(log))
    out = sys.stdout
    out.write(table(rows) + "\n\n")
    clean = [log for log in LOGS if not log.xfail]
    bad = {r.log_id for r in rows if not r.ok}
    ok_rows = [r for r in rows if r.ok and r.log_id in {log.id for log in clean}]
    clean_rows = [r for r in rows if r.log_id in {log.id for log in clean}]
    out.write(
        f"{len(LOGS)} logs ({sum(1 for log in LOGS if log.source_url)} with a URL); "
        f"{len(clean)} modelled, {len(clean_rows)} buffers, {len(ok_rows)} within tolerance; "
        f"{len(LOGS) - len(clean)} marked xfail:\n"
    )
    for log in LOGS:
        if log.xfail:
            out.write(f"  {log.id}: {log.xfail}\n")
    missed = sorted(bad & {log.id for log in clean})
    if missed:
        out.write(f"MISSED (not marked xfail): {', '.join(missed)}\n")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Several runs of one benchmark as one result, the way ``bench/results/h200-e2e.json`` and
``h200-kernels.json`` are kept: a ten-minute device call holds part of a table, so the table is
the runs that measured it, each row carrying its own run's commit, date and file.

A measurement (the row's ``key``) taken in several runs comes from the first run listed that has
it. Runs that differ in what ``shared`` names (the device, the versions) are refused: their
figures are not comparable."""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path

Key = Callable[[dict], Hashable]
# Where every benchmark writes its runs and the merged tables live.
RESULTS = Path(__file__).resolve().parent / "results"


def merged_rows(results: Sequence[dict], key: Key) -> list[dict]:
    """The rows of ``results``, each ``key`` once: from the first result that has it."""
    seen, rows = set(), []
    for result in results:
        for row in result["rows"]:
            if key(row) not in seen:
                seen.add(key(row))
                rows.append(row)
    return rows


def merged_result(
    paths: Sequence[Path],
    shared: Sequence[str],
    key: Key,
    tags: Sequence[str] = (),
    from_run: Callable[[dict, dict], dict] | None = None,
) -> dict:
    """The runs at ``paths`` as one result: what they share, and their rows (``merged_rows``),
    each with its run's ``commit``, ``date``, ``source`` (the file's name), ``tags`` (None where
    a run predates a tag) and what ``from_run(run, row)`` finds for it elsewhere in its run;
    ``commit`` and ``sources`` list the runs the rows came from."""
    results = [json.loads(Path(path).read_text()) for path in paths]
    for name in shared:
        values = {str(r.get(name)) for r in results}
        if len(values) > 1:
            raise ValueError(f"{name}: the runs differ ({', '.join(sorted(values))}); merge runs of one setup")
    tagged = [
        {
            "rows": [
                row
                | {t: r[t] for t in ("commit", "date")}
                | {t: r.get(t) for t in tags}
                | (from_run(r, row) if from_run else {})
                | {"source": Path(path).name}
                for row in r["rows"]
            ]
        }
        for path, r in zip(paths, results, strict=True)
    ]
    rows = merged_rows(tagged, key)
    return {name: results[0].get(name) for name in shared} | {
        "commit": list(dict.fromkeys(row["commit"] for row in rows)),  # the runs a row came from
        "sources": list(dict.fromkeys(row["source"] for row in rows)),
        "rows": rows,
    }

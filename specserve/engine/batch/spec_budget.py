"""Load-aware speculation: how many draft tokens each row of a decode batch may verify this step.

Pure: expected committed tokens per step (1 + the draft's expected accepted length, from each row's
own per-depth acceptance) over the device cost of the padded batch forward (the cost curve). As the
batch grows the forward gets dearer per token, so the chosen cap shrinks, down to 0 (speculation off).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

PRIOR_STEPS = 2.0  # pseudo-steps of prior acceptance 0.5**depth for a row without history


@dataclass(frozen=True)
class RowDraft:
    """One row's uncapped draft: node depths in tree order and what the aux branch adds."""

    depths: tuple[int, ...]  # depth of each tree node, topological order
    aux: int  # aux rows (kept only when they fit after the tree)
    drafted_by_depth: tuple[int, ...] = ()  # the request's history (RequestState counters)
    accepted_by_depth: tuple[int, ...] = ()
    load_aware: bool = True  # False: fixed speculation, never cut


def accept_rate(row: RowDraft, depth: int) -> float:
    """P(accept >= depth | drafted to depth), smoothed toward 0.5**depth.

    Example: drafted (10, 4), accepted (5, 1): depth 1 -> (5 + 1) / (10 + 2) = 0.5,
    depth 2 -> (1 + 0.5) / (4 + 2) = 0.25.
    """
    d = depth - 1
    drafted = row.drafted_by_depth[d] if d < len(row.drafted_by_depth) else 0
    accepted = row.accepted_by_depth[d] if d < len(row.accepted_by_depth) else 0
    return (accepted + PRIOR_STEPS * 0.5**depth) / (drafted + PRIOR_STEPS)


def capped_width(row: RowDraft, cap: int) -> int:
    """Query rows of the draft after `tree.cap_draft(draft, cap)` (without the root)."""
    if not row.load_aware:
        return len(row.depths) + row.aux
    tree = min(len(row.depths), cap)
    return tree + (row.aux if row.aux <= cap - tree else 0)


def expected_tokens(row: RowDraft, cap: int) -> float:
    """Committed tokens expected from one step of this row: the bonus plus the expected accepted
    length, summing acceptance rates down to the capped tree's depth."""
    kept = row.depths if not row.load_aware else row.depths[: max(cap, 0)]
    depth = max(kept, default=0)
    return 1.0 + sum(accept_rate(row, d) for d in range(1, depth + 1))


def choose_cap(rows: list[RowDraft], relative_cost: Callable[[int], float]) -> int | None:
    """The cap maximizing expected committed tokens per unit of forward time, or None (no cut)
    when no row is load-aware. `relative_cost(k)`: cost of a forward of k tokens vs 1 token.

    Example: 16 rows, each with a 4-node chain and rates 0.5 at every depth, a flat curve
    (cost 1 for any k) keeps 4 (or more); a linear one (cost k) picks 0.
    """
    if not any(r.load_aware for r in rows):
        return None
    widest = max(len(r.depths) + r.aux for r in rows)
    best, best_rate = 0, -1.0
    for cap in range(widest + 1):  # every cap: the bumpy CPU curve rewards filling a width
        q = 1 + max(capped_width(r, cap) for r in rows)
        rate = sum(expected_tokens(r, cap) for r in rows) / relative_cost(len(rows) * q)
        if rate > best_rate * 1.0001:  # ties go to the smaller cap
            best, best_rate = cap, rate
    return best

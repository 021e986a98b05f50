"""The fault suite's figures: `Counts` of classified requests, one `FaultReport` per scenario
(counts, time to detect and to recover, figures, notes), the `SuiteReport` written as JSON, and
its text table (`table`) and Markdown table (`markdown`, for docs/reliability.md)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, Field

from specserve.tools.faults.outcome import OUTCOMES, RequestResult


class Counts(BaseModel):
    """Requests per outcome: sent = the sum of the others."""

    sent: int = 0
    completed: int = 0
    failed_with_error: int = 0
    lost: int = 0
    hung: int = 0
    unreachable: int = 0
    malformed: int = 0

    @classmethod
    def of(cls, results: Iterable[RequestResult]) -> Counts:
        results = list(results)
        by_outcome = {o: sum(r.outcome == o for r in results) for o in OUTCOMES}
        return cls(sent=len(results), **by_outcome)

    def __add__(self, other: Counts) -> Counts:
        return Counts(**{k: v + getattr(other, k) for k, v in self.model_dump().items()})


class FaultReport(BaseModel):
    """One scenario: the traffic's `counts` (probes that measure recovery apart, in `probes`);
    `detect_s`/`recover_s` from the fault (None: not seen within the scenario's bounds)."""

    scenario: str
    ok: bool  # the scenario's expectation held (see `expectation`)
    skipped: bool = False  # not run here (see notes)
    expectation: str = ""
    counts: Counts = Counts()
    probes: Counts = Counts()
    detect_s: float | None = None
    detect_by: str = ""
    recover_s: float | None = None
    recover_by: str = ""
    seconds: float = 0.0  # the scenario's wall time
    error_codes: dict[str, int] = Field(default_factory=dict)  # code (or HTTP status) -> count
    figures: dict[str, float | int | str | bool | None] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


class SuiteReport(BaseModel):
    """A whole run: where it ran, with what, and one report per scenario in the order run."""

    url: str
    model: str
    config: str | None = None
    settings: dict = Field(default_factory=dict)
    reports: list[FaultReport] = Field(default_factory=list)


def error_codes(results: Iterable[RequestResult]) -> dict[str, int]:
    """How often each error code (else `HTTP <status>`, else the outcome) ended a request."""
    codes: dict[str, int] = {}
    for r in results:
        if r.outcome != "completed":
            key = r.error_code or (f"HTTP {r.status}" if r.status not in (None, 200) else r.outcome)
            codes[key] = codes.get(key, 0) + 1
    return dict(sorted(codes.items()))


COLUMNS = ("scenario", "ok", "sent", "done", "error", "lost", "hung", "other", "detect", "recover")


def _row(report: FaultReport) -> list[str]:
    c = report.counts

    def secs(value: float | None, by: str) -> str:
        return "-" if value is None else f"{value:.1f} s" + (f" ({by})" if by else "")

    return [
        report.scenario,
        "skipped" if report.skipped else "yes" if report.ok else "NO",
        str(c.sent),
        str(c.completed),
        str(c.failed_with_error),
        str(c.lost),
        str(c.hung),
        str(c.unreachable + c.malformed),
        secs(report.detect_s, report.detect_by),
        secs(report.recover_s, report.recover_by),
    ]


def table(suite: SuiteReport) -> str:
    """A fixed-width text table, one row per scenario, then each scenario's notes."""
    rows = [list(COLUMNS)] + [_row(r) for r in suite.reports]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for report in suite.reports:
        lines += [f"{report.scenario}: {note}" for note in report.notes]
    return "\n".join(lines)


def markdown(suite: SuiteReport) -> str:
    """A Markdown table (columns as `table`'s, `other` = unreachable + malformed), then notes."""
    header = [f"Fault suite against `{suite.model}` at {suite.url}", ""]
    rows = [list(COLUMNS), ["---"] * len(COLUMNS)] + [_row(r) for r in suite.reports]
    lines = header + [
        "| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows
    ]
    notes = [f"- **{r.scenario}**: {note}" for r in suite.reports for note in r.notes]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"

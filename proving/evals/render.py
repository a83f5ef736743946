"""Reports: the terminal table, the Markdown report, and two runs side by side."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from proving.evals.results import (
    REPLY_CHECKS,
    CaseResult,
    ModelViolations,
    Rates,
    RunResult,
    category_counts,
    look_up_counts,
)

#: Short names of the look-up tools in the case tables.
SHORT = {
    "track_shipment": "track",
    "check_return": "return",
    "check_payment_risk": "risk",
    "read_earlier_tickets": "tickets",
}


def _pct(value: float) -> str:
    return f"{value:.1%}"


def _mark(ok: bool | None) -> str:
    return "-" if ok is None else ("✓" if ok else "✗")


def _reply(case: CaseResult) -> str:
    checks = [case.checks[k] for k in REPLY_CHECKS if k in case.checks]
    return f"{sum(checks)}/{len(checks)}" if checks else "-"


def _opt(value: float | None, detail: str) -> str:
    return "-" if value is None else f"{_pct(value)} ({detail})"


def summary_rows(r: RunResult) -> list[tuple[str, str]]:
    t = r.totals
    n = t.cases or 1
    tokens = t.input_tokens + t.output_tokens
    hit, needed, made = look_up_counts(r.cases)
    right, judged = category_counts(r.cases)
    return [
        ("verdict accuracy (pay / ask approval / refuse)", f"{_pct(t.verdict_accuracy)} ({t.verdicts_correct}/{n})"),
        ("category accuracy (claim filed as the true claim)", _opt(t.category_accuracy, f"{right}/{judged}")),
        ("amount exactness", f"{_pct(t.amount_exactness)} ({t.amounts_exact}/{t.cases})"),
        (
            "reply checks (amount, next step, no leak)",
            f"{_pct(t.reply_checks)} ({t.reply_checks_passed}/{t.reply_checks_total})",
        ),
        ("tool recall (needed look-ups made / needed)", _opt(t.tool_recall, f"{hit}/{needed}")),
        ("tool precision (needed look-ups made / made)", _opt(t.tool_precision, f"{hit}/{made}")),
        ("policy violations (must be 0)", str(t.policy_violations)),
        ("proposals above what the order allows / paid", f"{t.overreaching_proposals} / {t.overreaching_paid}"),
        ("agent errors (nothing paid)", str(t.agent_errors)),
        ("model requests", f"{t.requests} ({t.requests / n:.1f} per case)"),
        ("tokens in / out", f"{t.input_tokens} / {t.output_tokens} ({tokens / n:.0f} per case)"),
        ("wall time", f"{t.wall_seconds:.2f} s (cases: {1000 * t.case_seconds / n:.0f} ms each on average)"),
    ]


def _maybe(value: float | None) -> str:
    return "-" if value is None else _pct(value)


CATEGORY_HEADER = [
    "category",
    "cases",
    "verdict",
    "claim category",
    "amount",
    "reply checks",
    "tool recall",
    "tool precision",
    "req/case",
]


def _category_rows(by: dict[str, Rates]) -> list[list[str]]:
    return [
        [
            name,
            str(r.cases),
            _pct(r.verdict_accuracy),
            _maybe(r.category_accuracy),
            _pct(r.amount_exactness),
            _pct(r.reply_checks),
            _maybe(r.tool_recall),
            _maybe(r.tool_precision),
            "-" if r.requests_per_case is None else f"{r.requests_per_case:.1f}",
        ]
        for name, r in by.items()
    ]


TEST_MODEL_HEADER = ["test model", "what it does", "policy violations", "cases", "verdict", "claim category"]


def _test_model_rows(tested: list[ModelViolations]) -> list[list[str]]:
    return [
        [
            m.model,
            m.about,
            str(m.policy_violations),
            str(m.cases),
            _pct(m.verdict_accuracy),
            _pct(m.category_accuracy),
        ]
        for m in tested
    ]


CASE_HEADER = [
    "case", "category", "expected", "got", "verdict", "claim", "filed as", "amount", "reply", "policy", "look-ups",
    "tools", "req", "tokens", "ms",
]  # fmt: skip


def _look_ups(c: CaseResult) -> str:
    return ", ".join(SHORT.get(name, name) for name in c.look_ups) or "-"


def _case_row(c: CaseResult) -> list[str]:
    return [
        c.name,
        c.category,
        c.expected,
        c.got,
        _mark(c.checks.get("verdict")),
        c.claim or "-",
        c.category_read or "-",
        _mark(c.checks.get("amount")),
        _reply(c),
        _mark(c.checks.get("policy")),
        _look_ups(c),
        _mark(c.tools_right),
        str(c.requests),
        str(c.input_tokens + c.output_tokens),
        f"{1000 * c.seconds:.0f}",
    ]


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"

    return [line(header), "|" + "---|" * len(header), *(line(r) for r in rows)]


def _heading(r: RunResult) -> str:
    lim = r.limits
    return (
        f"dataset `{r.dataset}` ({r.totals.cases} cases, sha256 `{r.dataset_sha256[:12]}`), run {r.started_at}; "
        f"limits: auto-approve {lim['auto_approve']}, cap {lim['absolute_cap']}, window {lim['window_days']} days"
    )


def markdown(r: RunResult, *, failures: bool = True) -> str:
    lines = [f"# Refund decision eval: {r.model}", "", _heading(r), ""]
    lines += _md_table(["metric", "value"], [list(row) for row in summary_rows(r)])
    if r.test_models:
        lines += ["", "## Violations per test model (must be 0 for each)", ""]
        lines += _md_table(TEST_MODEL_HEADER, _test_model_rows(r.test_models))
        lines += [""] if any(m.violations for m in r.test_models) else []
        for tested in r.test_models:
            lines += [f"- {tested.model}, {name}: {why}" for name, why in tested.violations.items()]
    lines += ["", "## By category", ""]
    lines += _md_table(CATEGORY_HEADER, _category_rows(r.by_category))
    lines += ["", "## Cases", ""]
    lines += _md_table(CASE_HEADER, [_case_row(c) for c in r.cases])
    failed = [c for c in r.cases if not all(c.checks.values()) or not c.tools_right]
    if failures and failed:
        lines += ["", "## Failed checks", ""]
        for c in failed:
            lines += [f"### {c.name}", "", f"- request: {c.message!r}", f"- expected {c.expected}; got {c.got}"]
            lines += [f"- {name}: {why}" for name, why in c.failed_because.items()]
            if not c.tools_right:
                lines.append(f"- look-ups: needed {c.expected_tools or 'none'}, made {c.look_ups or 'none'}")
            if c.error:
                lines.append(f"- error: {c.error}")
            lines += [f"- tool: `{call}`" for call in c.tool_calls]
            if c.reply is not None:
                lines.append(f"- reply: {c.reply!r}")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def print_terminal(r: RunResult, console: Console | None = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
            console = Console(width=200)
    table = Table(title=f"Refund decisions: {r.model}", title_justify="left")
    for column in CASE_HEADER:
        table.add_column(column, justify="right" if column in ("req", "tokens", "ms") else "left", no_wrap=True)
    for c in r.cases:
        ok = all(c.checks.values()) and c.tools_right
        table.add_row(*_case_row(c), style=None if ok else "yellow")
    console.print(table)
    categories = Table(title="By category", title_justify="left")
    for column in CATEGORY_HEADER:
        categories.add_column(column)
    for row in _category_rows(r.by_category):
        categories.add_row(*row)
    console.print(categories)
    if r.test_models:
        tested = Table(title="Violations per test model (must be 0 for each)", title_justify="left")
        for column in TEST_MODEL_HEADER:
            tested.add_column(column)
        for row in _test_model_rows(r.test_models):
            tested.add_row(*row, style=None if row[2] == "0" else "red")
        console.print(tested)
    summary = Table(title=f"Totals: {r.model}", title_justify="left", show_header=False)
    for name, value in summary_rows(r):
        summary.add_row(name, value)
    console.print(summary)


def compare(a: RunResult, b: RunResult) -> str:
    """Two runs side by side (Markdown): totals, categories, and every case on which they differ."""
    lines = [f"# Refund decision eval: {a.model} vs {b.model}", "", f"- A: {_heading(a)}", f"- B: {_heading(b)}", ""]
    if a.dataset_sha256 != b.dataset_sha256:
        lines += ["**The runs used different datasets: compare with care.**", ""]
    rows = [[name, va, vb] for (name, va), (_, vb) in zip(summary_rows(a), summary_rows(b), strict=True)]
    lines += _md_table(["metric", f"A: {a.model}", f"B: {b.model}"], rows)
    lines += ["", "## By category (verdict / amount / reply checks)", ""]
    cat_rows = []
    for name in dict.fromkeys([*a.by_category, *b.by_category]):
        cells = []
        for run in (a, b):
            r = run.by_category.get(name)
            cells.append(
                "-"
                if r is None
                else f"{_pct(r.verdict_accuracy)} / {_pct(r.amount_exactness)} / {_pct(r.reply_checks)}"
            )
        cat_rows.append([name, *cells])
    lines += _md_table(["category", "A", "B"], cat_rows)
    lines += _common(a, b)
    b_cases = {c.name: c for c in b.cases}
    differ = []
    for ca in a.cases:
        cb = b_cases.get(ca.name)
        shared = set(ca.checks) & set(cb.checks) if cb is not None else set(ca.checks)
        if cb is None or ca.got != cb.got or any(ca.checks[k] != cb.checks[k] for k in shared):
            differ.append([ca.name, ca.expected, _got(ca, shared), _got(cb, shared), _reply(ca), _rb(cb)])
    lines += ["", f"## Cases where the runs differ ({len(differ)})", ""]
    lines += _md_table(["case", "expected", "A got", "B got", "A reply", "B reply"], differ) if differ else ["none"]
    return "\n".join(lines) + "\n"


def _common(a: RunResult, b: RunResult) -> list[str]:
    """Both runs on the cases both ran: what a larger dataset must not make worse."""
    names = {c.name for c in a.cases} & {c.name for c in b.cases}
    rows = []
    for check in ("verdict", "amount"):
        cells = []
        for run in (a, b):
            mine = [c for c in run.cases if c.name in names]
            right = sum(c.checks.get(check, False) for c in mine)
            cells.append(f"{_pct(right / len(mine)) if mine else '-'} ({right}/{len(mine)})")
        rows.append([check, *cells])
    tools = []
    for run in (a, b):
        made = sum(len(c.look_ups) for c in run.cases if c.name in names)
        tools.append(str(made))
    rows.append(["look-ups made", *tools])
    return ["", f"## The {len(names)} cases both runs have", "", *_md_table(["", "A", "B"], rows)]


def _got(c: CaseResult | None, checks: set[str]) -> str:
    """What the run got, marked on the checks both runs made (a newer run's added checks do not count)."""
    return "(not run)" if c is None else f"{c.got} {_mark(all(v for k, v in c.checks.items() if k in checks))}"


def _rb(c: CaseResult | None) -> str:
    return "-" if c is None else _reply(c)

"""Markdown tables and PNG plots from a results document; the README block they replace."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from benchmarks import parked_customers, report_parked
from benchmarks.cost import APPROVAL_PATH, LABELS, RECV_LABELS
from benchmarks.harness import fmt

README = Path(__file__).resolve().parent / "README.md"
BEGIN, END = "<!-- suite-results:begin -->", "<!-- suite-results:end -->"


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**met**" if ok else "**missed**")


def cost_tables(cost: dict[str, Any]) -> list[str]:
    labels = LABELS if cost.get("approval_path") == APPROVAL_PATH else {**LABELS, **RECV_LABELS}
    lines: list[str] = []
    for backend, s in cost["summary"].items():
        pg = backend == "postgres"
        lines += [
            f"**{backend}** (median of {next(iter(s['rows'].values()))['rounds']} rounds; per refund)",
            "",
            "| variant | wall ms | client CPU ms | commits | WAL bytes | failed |" if pg else
            "| variant | wall ms | client CPU ms | commits | failed |",
            "|---|---:|---:|---:|---:|---:|" if pg else "|---|---:|---:|---:|---:|",
        ]  # fmt: skip
        for v, r in s["rows"].items():
            cells = [labels.get(v, v), fmt(r["wall_ms"]), fmt(r["cpu_ms"]), fmt(r.get("commits"))]
            if pg:
                cells.append(fmt(r.get("wal_bytes"), 0))
            cells.append(str(r["failed"]))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += [
        "| durable overhead per refund | postgres | sqlite |",
        "|---|---:|---:|",
    ]
    sm = cost["summary"]

    def row(label: str, key: str, digits: int = 1, suffix: str = "") -> str:
        return f"| {label} | " + " | ".join(fmt(sm[b][key], digits) + suffix for b in ("postgres", "sqlite")) + " |"

    lines += [
        row("DBOS: workflow - same logic without durability, wall ms", "dbos_overhead_ms"),
        row("DBOS: same, client CPU ms", "dbos_overhead_cpu_ms"),
        row("LangGraph: saver - no checkpointer, wall ms", "langgraph_overhead_ms"),
        row("LangGraph: same, client CPU ms", "langgraph_overhead_cpu_ms"),
        row("floor: N x (INSERT + COMMIT), wall ms", "floor_ms", 2),
        row("N = DBOS checkpoints per refund (operation_outputs + workflow_status rows)", "checkpoints_per_refund", 0),
        row("DBOS overhead / LangGraph overhead (target <= 1)", "dbos_overhead_vs_langgraph", 2, "x"),
        row("DBOS overhead / floor (target <= 4)", "dbos_overhead_vs_floor", 1, "x"),
    ]
    lines += [
        "| target met? | "
        + " | ".join(
            f"vs LangGraph {_met(_le(sm[b]['dbos_overhead_vs_langgraph'], 1))}, "
            f"vs floor {_met(_le(sm[b]['dbos_overhead_vs_floor'], 4))}"
            for b in ("postgres", "sqlite")
        )
        + " |",
        "",
    ]
    extra = cost["extra"]
    lines.append(
        "Rows written per refund: "
        + "; ".join(
            f"{b}: DBOS {fmt(extra[b].get('dbos_checkpoints_per_refund'), 0)} checkpoints "
            f"({fmt(extra[b].get('dbos_approval_checkpoints_per_refund'), 0)} on the approval path), LangGraph "
            f"{fmt(extra[b].get('langgraph_rows_per_refund', {}).get('checkpoints'), 0)} checkpoints + "
            f"{fmt(extra[b].get('langgraph_rows_per_refund', {}).get('writes'), 0)} pending writes "
            f"({fmt(extra[b].get('langgraph_approval_rows_per_refund', {}).get('checkpoints'), 0)} + "
            f"{fmt(extra[b].get('langgraph_approval_rows_per_refund', {}).get('writes'), 0)} on the approval path)"
            for b in ("postgres", "sqlite")
            if b in extra
        )
        + "."
    )
    idle = extra.get("postgres", {}).get("commits", {}).get("idle_commits_per_s")
    if idle is not None:
        lines.append(
            f"Postgres commits come from a separate pass ({fmt(idle, 1)} commits/s of idle background work "
            "in the run's databases subtracted)."
        )
    return lines


def _le(value: float | None, bound: float) -> bool | None:
    return None if value is None else value <= bound


def throughput_table(tp: dict[str, Any]) -> list[str]:
    summary = tp["summary"]
    levels = list(next(iter(next(iter(summary.values())).values())).keys())
    lines = [
        "| backend | flow | " + " | ".join(f"C={c}" for c in levels) + " |",
        "|---|---|" + "---:|" * len(levels),
    ]
    for backend, by_variant in summary.items():
        for v, by_level in by_variant.items():
            cells = [
                f"{fmt(x['refunds_per_s'])} /s "
                f"(p50 {fmt(x['latency_p50_ms'], 0)} ms, p99 {fmt(x['latency_p99_ms'], 0)} ms)"
                + (f", {x['errors']} errors" if x["errors"] else "")
                for x in by_level.values()
            ]
            lines.append(f"| {backend} | {LABELS.get(v, v)} | " + " | ".join(cells) + " |")
    return lines


def round_trip_tables(rt: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for backend, summary in rt["summary"].items():
        rows = summary["rows"]
        lines += [
            f"**{backend}** (refunds per variant: {rows['dbos']['refunds']}; model latency {rt['model_latency_s']} s)",
            "",
            "| variant | latency p50 ms | p90 ms | model requests | tokens in / out | checkpoints |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for row in rows.values():
            tokens = f"{fmt(row['input_tokens'], 0)} / {fmt(row['output_tokens'], 0)}"
            cps = fmt(row["checkpoints"], 1) + (f" + {fmt(row['writes'], 0)} writes" if row.get("writes") else "")
            lines.append(
                f"| {row['label']} | {fmt(row['latency_p50_ms'])} | {fmt(row['latency_p90_ms'])} | "
                f"{fmt(row['model_requests'], 1)} | {tokens} | {cps} |"
            )
        t = summary["targets"]
        share = summary["dbos_overhead_share"]
        lines += [
            "",
            f"Durable overhead (median over rounds of DBOS - same path without durability): "
            f"{fmt(summary['dbos_overhead_ms'])} ms, {fmt(None if share is None else share * 100)}% of the p50 "
            f"{_met(t['overhead_under_5pct'])}; LangGraph's (saver - no checkpointer): "
            f"{fmt(summary['langgraph_overhead_ms'])} ms. p50 / (2 x 500 ms) = "
            f"{fmt(summary['dbos_p50_vs_two_requests'], 2)} {_met(t['p50_le_1_15x_of_2x500ms'])}; "
            f"model requests <= 2 {_met(t['model_requests_le_2'])}; checkpoints <= 6 {_met(t['checkpoints_le_6'])}.",
            "",
        ]
        if summary.get("noop_shape_overhead_ms") is not None:
            lines += [
                f"The same five steps doing nothing cost {fmt(summary['noop_shape_overhead_ms'])} ms more as a DBOS "
                f"workflow than as plain calls (median over rounds), against a 5% budget of "
                f"{fmt(summary['overhead_budget_ms'])} ms.",
                "",
            ]
    lines += ["Checkpoints of each path over its whole life (Postgres; timers included):", ""]
    lines += ["| path | checkpoints | workflows: steps |", "|---|---:|---|"]
    for path, found in rt["paths"].items():
        parts = [f"`{w['workflow']}`: {', '.join(w['steps']) or '(no step)'}" for w in found["workflows"]]
        lines.append(f"| {path} | {found['checkpoints']} ({found['steps']} steps) | {'; '.join(parts)} |")
    return lines


def tuning_table(tuning: dict[str, Any]) -> list[str]:
    lines = [
        "| knob | backend | workload | product setting | alternative | product | alternative "
        "| alt / product | correct |",
        "|---|---|---|---|---|---:|---:|---:|---|",
    ]
    for k in tuning["knobs"]:
        unit = k["unit"]
        problems = [f for fs in k["failures"].values() for f in fs]
        correct = "yes" if k["correct"] else "**no**: " + (k["error"] or "; ".join(problems))
        lines.append(
            f"| {k['knob']} | {k['backend']} | {k['workload']} | {k['product']} | {k['alternative']} "
            f"| {fmt(k['product_value'])} {unit} | {fmt(k['alternative_value'])} {unit} "
            f"| {fmt(k['alternative_vs_product'], 2)} | {correct} |"
        )
    return lines


def profile_table(profile: dict[str, Any]) -> list[str]:
    backends = list(profile)
    lines = [
        "| where (cumulative, per refund) | function | " + " | ".join(backends) + " |",
        "|---|---|" + "---:|" * len(backends),
    ]
    for i, row in enumerate(profile[backends[0]]["rows"]):
        cells = [
            f"{fmt(profile[b]['rows'][i]['ms_per_refund'])} ms, "
            f"{fmt(profile[b]['rows'][i]['calls_per_refund'], 1)} calls"
            for b in backends
        ]
        lines.append(f"| {row['what']} | `{row['function']}` | " + " | ".join(cells) + " |")
    lines.append(
        "| wall per refund, profiled (unprofiled) | | "
        + " | ".join(
            f"{fmt(profile[b]['wall_ms_profiled'])} ms ({fmt(profile[b]['wall_ms_unprofiled'])} ms)" for b in backends
        )
        + " |"
    )
    steps = profile[backends[0]].get("steps")
    if steps:
        lines += [
            "",
            f"The {len(steps)} checkpointed operations of one auto-approved refund: "
            + ", ".join(f"`{s}`" for s in steps)
            + ".",
        ]
    return lines


def plots(results: dict[str, Any], out_dir: Path, stamp: str) -> list[str]:
    """PNG files written next to the JSON; returns their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names: list[str] = []

    def save(fig: Any, kind: str) -> str:
        fig.tight_layout()
        name = f"suite-{kind}-{stamp}.png"
        fig.savefig(out_dir / name, dpi=90)
        plt.close(fig)
        return name

    cost = results.get("cost")
    if cost:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, (backend, s) in zip(axes, cost["summary"].items(), strict=False):
            variants = [v for v in s["rows"] if not v.endswith("approval")]
            walls = [s["rows"][v]["wall_ms"] or 0 for v in variants]
            cpus = [s["rows"][v]["cpu_ms"] or 0 for v in variants]
            xs = range(len(variants))
            ax.bar([x - 0.2 for x in xs], walls, width=0.4, label="wall ms")
            ax.bar([x + 0.2 for x in xs], cpus, width=0.4, label="client CPU ms")
            ax.set_xticks(list(xs), [v.replace("_", "\n") for v in variants], fontsize=8)
            ax.set_title(f"per refund, {backend}")
            ax.legend(fontsize=8)
        names.append(save(fig, "cost"))
    tp = results.get("throughput")
    if tp:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for backend, by_variant in tp["summary"].items():
            for v, by_level in by_variant.items():
                levels = [int(c) for c in by_level]
                ax.plot(levels, [x["refunds_per_s"] for x in by_level.values()], marker="o", label=f"{v} / {backend}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent refunds (one process)")
        ax.set_ylabel("refunds/s")
        ax.legend(fontsize=8)
        ax.set_title("throughput")
        names.append(save(fig, "throughput"))
    parked = report_parked.plot(results, save)
    if parked:
        names.append(parked)
    return names


SECTIONS = ("cost", "throughput", "parked", "tuning", "profile", "round_trips", "customer_waits")


def _run_line(meta: dict[str, Any], json_name: str) -> str:
    env = meta["environment"]
    return (
        f"Run {meta['started']} to {meta['finished']} UTC, commit `{env['commit']}`, {env['cpus']} CPUs, "
        + (f"load average {env['load_average_at_start']} at the start, " if "load_average_at_start" in env else "")
        + f"load average {env['load_average']} at the end; command `{meta['command']}`; raw numbers in "
        f"`results/{json_name}`."
    )


def markdown(results: dict[str, Any], json_name: str, png_names: list[str]) -> str:
    lines = [_run_line(results["meta"], json_name), ""]
    return "\n".join(lines + _sections(results, png_names))


def combined_markdown(documents: list[tuple[str, dict[str, Any]]], png_names: list[str]) -> str:
    """One block from several runs' results: each section from the last run that has it, except parked
    approvals, whose runs (one per count of parked refunds) are put together by count from every file
    that measured the same design (the last file's design). Plots come from the files a section came from."""
    merged: dict[str, Any] = {}
    source: dict[str, set[str]] = {}
    for name, results in documents:
        for section in SECTIONS:
            if section not in results:
                continue
            if section == "parked" and "parked" in merged and _same_design(merged["parked"], results["parked"]):
                by_count = {int(r["parked"]): r for r in [*merged["parked"]["runs"], *results["parked"]["runs"]]}
                runs = sorted(by_count.values(), key=lambda r: int(r["parked"]))
                merged["parked"] = {**merged["parked"], **results["parked"], "runs": runs}
                source["parked"].add(name)
                continue
            merged[section], source[section] = results[section], {name}
    lines = []
    for name, results in documents:
        mine = [section for section in SECTIONS if name in source.get(section, set())]
        if mine:
            lines += [f"Sections {', '.join(mine)}: " + _run_line(results["meta"], name), ""]
    stamps = {section: {_stamp(name) for name in names} for section, names in source.items()}
    pngs = [n for n in png_names if n.split("-", 2)[2].removesuffix(".png") in stamps.get(n.split("-")[1], set())]
    return "\n".join(lines + _sections(merged, pngs))


def _same_design(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return report_parked.design(a) == report_parked.design(b)


def _stamp(json_name: str) -> str:
    return json_name.removeprefix("suite-").removesuffix(".json")


def _sections(results: dict[str, Any], png_names: list[str]) -> list[str]:
    lines: list[str] = []
    if "cost" in results:
        lines += ["#### 1. Durability cost per refund", "", *cost_tables(results["cost"]), ""]
        lines += [f"![cost per refund](results/{n})" for n in png_names if "cost" in n] + [""]
    if "throughput" in results:
        lines += ["#### 2. Throughput", "", *throughput_table(results["throughput"]), ""]
        lines += [f"![throughput](results/{n})" for n in png_names if "throughput" in n] + [""]
    if "parked" in results:
        lines += ["#### 3. Parked approvals (Postgres, one worker)", "", *report_parked.tables(results["parked"]), ""]
        lines += [f"![parked approvals](results/{n})" for n in png_names if "parked" in n] + [""]
    if "tuning" in results:
        lines += ["#### 4. Tuning", "", *tuning_table(results["tuning"]), ""]
    if "round_trips" in results:
        lines += ["#### 5. Round trips per refund (a model answering in 500 ms)", ""]
        lines += [*round_trip_tables(results["round_trips"]), ""]
    if "customer_waits" in results:
        lines += ["#### 6. Waiting on customers beside approvers (Postgres, one worker)", ""]
        lines += [*parked_customers.tables(results["customer_waits"]), ""]
    if "profile" in results:
        lines += ["#### Profile of a DBOS refund (cProfile)", "", *profile_table(results["profile"]), ""]
    return lines


def update_readme(block: str, readme: Path = README) -> None:
    text = readme.read_text()
    new = f"{BEGIN}\n{block}\n{END}"
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _m: new, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + new + "\n"
    readme.write_text(text)


def main(argv: list[str] | None = None) -> int:
    """Rebuild the README block from result files of separate runs (later files win per section)."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m benchmarks.report", description=main.__doc__)
    p.add_argument("results", nargs="+", type=Path, help="results/suite-*.json files, oldest first")
    p.add_argument("--no-readme", action="store_true", help="print the block only")
    args = p.parse_args(argv)
    documents = [(path.name, json.loads(path.read_text())) for path in args.results]
    stamps = [path.stem.removeprefix("suite-") for path in args.results]
    pngs = sorted(
        png.name for stamp in stamps for png in args.results[0].parent.glob(f"suite-*-{stamp}.png")
    )  # fmt: skip
    block = combined_markdown(documents, pngs)
    print(block)
    if not args.no_readme:
        update_readme(block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Section 6: round trips per refund: model requests, tokens, checkpoints and latency, with a 500 ms model.

The local OpenAI-compatible model server (``sandbox.model``) answers every request after a fixed
delay, as a hosted model's round trip takes; the product reaches it through Pydantic AI's OpenAI client,
as it would a real one. Per backend and round, each variant runs ``refunds`` auto-approved refunds one
after the other (the variant order rotates from round to round):

- *dbos*: the product's refund workflow (each model request a DBOS step);
- *plain*: the same path line by line outside any workflow, the same model client;
- *langgraph*: the same flow as a LangGraph graph with its saver, ``durability="sync"``;
- *langgraph_plain*: that graph without a checkpointer;
- *dbos_noop*: a DBOS workflow of the auto path's five steps, in its order and kinds, each doing nothing
  (what DBOS's protocol alone costs that shape); *noop_plain*: the same functions, no workflow.

Latency is each refund's own wall time, start to completed. The durable overhead is the median over
rounds of (dbos - plain), each round's two medians measured side by side. Then one refund per path
(auto, refuse, approve, reject, expire) runs in a runtime whose approval timers fall due within
seconds, and every checkpoint each path wrote over its whole life (its timers' included) is listed by
workflow and step name.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from dbos import DBOS
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models import Model

from agent import approvals, runtime
from agent.approval_workflows import decide_here
from agent.domain import RefundRequest
from agent.submit import request_hash
from benchmarks import flows, harness
from benchmarks import langgraph_flow as lg
from benchmarks.harness import APPROVAL_AMOUNT, AUTO_AMOUNT, Databases, median
from benchmarks.identities import BENCH_APPROVER, BENCH_REQUESTER
from sandbox.model import FakeOpenAIServer, ScriptedModel
from steps.refunds import register_request
from steps.store import app_db, refunds

VARIANTS = ("dbos", "plain", "langgraph", "langgraph_plain", "dbos_noop", "noop_plain")
LABELS = {
    "dbos": "DBOS workflow (product)",
    "plain": "same path, no durability",
    "langgraph": "LangGraph + saver, durability=sync",
    "langgraph_plain": "same LangGraph graph, no checkpointer",
    "dbos_noop": "DBOS workflow of the same 5 steps, each doing nothing",
    "noop_plain": "the same 5 no-op functions, no workflow",
}
MODEL_LATENCY_S = 0.5
PATHS = ("auto", "refuse", "approve", "reject", "expire")
#: The path pass: timers fall due within seconds, so every path's whole life is counted.
PATH_TIMERS = {"approval_escalate_after_seconds": 2.0, "approval_timeout_seconds": 4.0}
DISPUTED_ORDER = "ord_1004"  # a demo order under dispute: nothing is refundable, the refund is refused
_MOVING = ("ENQUEUED", "PENDING", "DELAYED")


def _thread_model(settings: Any) -> Callable[[list[ModelMessage]], ModelResponse]:
    """LangGraph's nodes run on worker threads, each with its own event loop: one model client per thread."""
    local = threading.local()

    def request(messages: list[ModelMessage]) -> ModelResponse:
        if not hasattr(local, "ask"):
            model, _ = runtime.select_model(settings.model)
            assert isinstance(model, Model)
            local.ask = lg.model_requester(model)
        response: ModelResponse = local.ask(messages)
        return response

    return request


class Bench:
    def __init__(self, dbs: Databases, rt: runtime.Runtime, graph: Any, graph_plain: Any) -> None:
        self.dbs, self.rt, self.graph, self.graph_plain = dbs, rt, graph, graph_plain
        model, _ = runtime.select_model(rt.settings.model)
        assert isinstance(model, Model)
        self.model = model

    def runner(self, variant: str) -> Callable[[str, RefundRequest], Awaitable[dict[str, Any]]]:
        async def dbos(refund_id: str, request: RefundRequest) -> dict[str, Any]:
            return await flows.dbos_refund(refund_id, request)

        async def plain(refund_id: str, request: RefundRequest) -> dict[str, Any]:
            return await flows.plain_refund(refund_id, request, self.rt, self.model)

        async def langgraph(refund_id: str, request: RefundRequest) -> dict[str, Any]:
            return await harness.off_loop(lg.run_refund, self.graph, refund_id, request)

        async def langgraph_plain(refund_id: str, request: RefundRequest) -> dict[str, Any]:
            return await harness.off_loop(lg.run_refund, self.graph_plain, refund_id, request)

        async def dbos_noop(refund_id: str, _request: RefundRequest) -> dict[str, Any]:
            return await flows.dbos_noop(refund_id)

        async def noop_plain(_refund_id: str, _request: RefundRequest) -> dict[str, Any]:
            return await flows.noop_plain()

        table = {
            "dbos": dbos,
            "plain": plain,
            "langgraph": langgraph,
            "langgraph_plain": langgraph_plain,
            "dbos_noop": dbos_noop,
            "noop_plain": noop_plain,
        }
        return table[variant]


@asynccontextmanager
async def started(
    dbs: Databases, sandbox_url: str, workdir: Path, llm: FakeOpenAIServer, **extra: Any
) -> AsyncIterator[Bench]:
    """The product runtime on the model server, and LangGraph's saver. DBOS is launched and destroyed off
    the event loop (its synchronous set-up refuses to run inside one)."""
    settings = harness.settings_for(
        dbs, sandbox_url, workdir, refund_agent_model="scripted", refund_agent_model_base_url=llm.base_url, **extra
    )
    runtime_cm = harness.started(settings)
    rt = await harness.off_loop(runtime_cm.__enter__)
    try:
        with lg.saver(dbs.backend, dbs.langgraph_url) as saver:
            lg.ctx.limits, lg.ctx.model_label = rt.limits, rt.model_label
            lg.ctx.request = _thread_model(rt.settings)
            try:
                yield Bench(dbs, rt, lg.build_graph(saver), lg.build_graph(None))
            finally:
                lg.ctx.request = lg.offline_request
    finally:
        await harness.off_loop(runtime_cm.__exit__, None, None, None)


def _recorded_usage(ids: list[str]) -> list[dict[str, int]]:
    with app_db().engine.connect() as conn:
        rows = conn.execute(
            sa.select(refunds.c.model_requests, refunds.c.input_tokens, refunds.c.output_tokens).where(
                refunds.c.refund_id.in_(ids)
            )
        ).all()
    return [{"requests": r[0] or 0, "input_tokens": r[1] or 0, "output_tokens": r[2] or 0} for r in rows]


async def _batch(bench: Bench, variant: str, n: int, model: ScriptedModel) -> dict[str, Any]:
    run = bench.runner(variant)
    batch = [harness.new_refund(f"rt-{variant}", AUTO_AMOUNT) for _ in range(n)]
    answered = model.total()
    latencies: list[float] = []
    usages: list[dict[str, int]] = []
    failed = 0
    for refund_id, request in batch:
        t0 = time.perf_counter()
        result = await run(refund_id, request)
        latencies.append((time.perf_counter() - t0) * 1000)
        if result.get("status") != "completed":
            failed += 1
        if isinstance(result.get("usage"), dict):
            usages.append(result["usage"])
    ids = [refund_id for refund_id, _ in batch]
    if variant == "dbos":
        usages = await harness.off_loop(_recorded_usage, ids)
    sample: dict[str, Any] = {
        "refunds": n,
        "failed": failed,
        "latency_ms": latencies,
        "model_requests": (model.total() - answered) / n,
        "recorded_requests": sum(u["requests"] for u in usages) / n if usages else None,
        "input_tokens": sum(u["input_tokens"] for u in usages) / n if usages else None,
        "output_tokens": sum(u["output_tokens"] for u in usages) / n if usages else None,
    }
    if variant in ("dbos", "dbos_noop"):
        counted = flows.dbos_checkpoints(bench.dbs.system_url, ids)
        sample["checkpoints"] = counted["operation_outputs"] + counted["workflow_status"]
        sample["steps"] = counted["operation_outputs"]
    elif variant == "langgraph":
        rows = lg.checkpoints_per_refund(bench.dbs.backend, bench.dbs.langgraph_url, ids)
        sample["checkpoints"], sample["writes"] = rows["checkpoints"], rows["writes"]
    else:
        sample["checkpoints"] = 0
    return sample


# ------------------------------------------------------------------------------------------- paths


def _settled(refund_id: str) -> bool:
    found = DBOS.list_workflows(workflow_ids=approvals.family(refund_id), load_input=False, load_output=False)
    return bool(found) and all(wf.status not in _MOVING for wf in found)


def _steps_of(refund_id: str) -> dict[str, Any]:
    workflows = DBOS.list_workflows(workflow_ids=approvals.family(refund_id), load_input=False, load_output=False)
    listed: list[dict[str, Any]] = []
    for wf in sorted(workflows, key=lambda w: (w.created_at or 0, w.workflow_id)):
        names = [s["function_name"] for s in DBOS.list_workflow_steps(wf.workflow_id, load_output=False)]
        suffix = wf.workflow_id.removeprefix(refund_id) or "(refund)"
        listed.append({"workflow": suffix, "name": wf.name, "status": wf.status, "steps": names})
    steps = sum(len(w["steps"]) for w in listed)
    return {"workflows": listed, "steps": steps, "checkpoints": steps + len(listed)}


def _register_refusal() -> tuple[str, RefundRequest]:
    """A request on the disputed demo order, registered as POST /refunds registers it."""
    refund_id = f"bench-rt-path-refuse-{secrets.token_hex(3)}"
    request = RefundRequest(order_id=DISPUTED_ORDER, message="Please refund this.", currency="USD")
    register_request(refund_id=refund_id, order_id=DISPUTED_ORDER, request_hash=request_hash(request), currency="USD",
                     requested=None, requester=BENCH_REQUESTER)  # fmt: skip
    return refund_id, request


async def _run_path(path: str) -> dict[str, Any]:
    if path == "refuse":
        refund_id, request = await harness.off_loop(_register_refusal)
    else:
        refund_id, request = harness.new_refund(f"rt-path-{path}", AUTO_AMOUNT if path == "auto" else APPROVAL_AMOUNT)
    result = await flows.dbos_refund(refund_id, request)
    expected = {"auto": "completed", "refuse": "rejected"}.get(path, "awaiting_approval")
    if result.get("status") != expected:
        raise RuntimeError(f"path {path}: refund {refund_id} ended {result.get('status')}, not {expected}")
    if path in ("approve", "reject"):
        decision: Any = path

        def decide() -> None:
            approvals.decide_pending(
                decide_here, refund_id=refund_id, decision=decision, approver=BENCH_APPROVER, via="console"
            )

        await harness.off_loop(decide)
    deadline = time.monotonic() + 60
    while not await harness.off_loop(_settled, refund_id):
        if time.monotonic() > deadline:
            raise RuntimeError(f"path {path}: refund {refund_id} still has workflows running after 60 s")
        await asyncio.sleep(0.1)
    listed: dict[str, Any] = await harness.off_loop(_steps_of, refund_id)
    return {"refund_id": refund_id, **listed}


# ----------------------------------------------------------------------------------------- section


async def run_section(*, rounds: int, refunds: int, server: str, sandbox_url: str, workdir: Path) -> dict[str, Any]:
    model = ScriptedModel(latency_s=MODEL_LATENCY_S)
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {b: {v: [] for v in VARIANTS} for b in harness.BACKENDS}
    paths: dict[str, dict[str, Any]] = {}
    with FakeOpenAIServer(model) as llm, ExitStack() as stack:
        all_dbs = {b: stack.enter_context(harness.databases(b, server, workdir)) for b in harness.BACKENDS}
        for r in range(rounds):
            for backend in harness.BACKENDS:
                async with started(all_dbs[backend], sandbox_url, workdir, llm) as bench:
                    for v in VARIANTS:  # warm-up: connections, pools, first-call costs
                        await _batch(bench, v, 1, model)
                    order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
                    for v in order:
                        samples[backend][v].append(await _batch(bench, v, refunds, model))
                print(f"  round trips round {r + 1}/{rounds} {backend}: done", flush=True)
        dbs = stack.enter_context(harness.databases("postgres", server, workdir))
        async with started(dbs, sandbox_url, workdir, llm, **PATH_TIMERS):
            for path in PATHS:
                paths[path] = await _run_path(path)
    return {
        "model_latency_s": MODEL_LATENCY_S,
        "samples": samples,
        "paths": paths,
        "summary": summarize(samples),
    }


def _overhead(durable: list[dict[str, Any]], plain: list[dict[str, Any]]) -> float | None:
    """Median over rounds of the durable variant's median latency less its twin's, from the same round."""
    pairs = [median(a["latency_ms"]) - median(b["latency_ms"]) for a, b in zip(durable, plain, strict=False)]  # type: ignore[operator]
    return median(pairs)


def summarize(samples: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for backend, by_variant in samples.items():
        rows: dict[str, Any] = {}
        for v, ss in by_variant.items():
            if not ss:
                continue
            latencies = [x for s in ss for x in s["latency_ms"]]
            rows[v] = {
                "label": LABELS[v],
                "refunds": sum(s["refunds"] for s in ss),
                "failed": sum(s["failed"] for s in ss),
                "latency_p50_ms": median(latencies),
                "latency_p90_ms": sorted(latencies)[int(0.9 * (len(latencies) - 1))] if latencies else None,
                "model_requests": median([s["model_requests"] for s in ss]),
                "input_tokens": median([s["input_tokens"] for s in ss if s["input_tokens"] is not None]),
                "output_tokens": median([s["output_tokens"] for s in ss if s["output_tokens"] is not None]),
                "checkpoints": median([s["checkpoints"] for s in ss]),
                "writes": median([s["writes"] for s in ss if s.get("writes") is not None]),
            }
        floor_ms = 2 * MODEL_LATENCY_S * 1000

        dbos_over = _overhead(by_variant["dbos"], by_variant["plain"])
        lg_over = _overhead(by_variant["langgraph"], by_variant["langgraph_plain"])
        noop = by_variant.get("dbos_noop")
        noop_over = _overhead(noop, by_variant["noop_plain"]) if noop else None
        p50 = rows.get("dbos", {}).get("latency_p50_ms")
        out[backend] = {
            "rows": rows,
            "dbos_overhead_ms": dbos_over,
            "langgraph_overhead_ms": lg_over,
            # DBOS's protocol alone for the auto path's shape, against the 5% budget of the product's p50.
            "noop_shape_overhead_ms": noop_over,
            "overhead_budget_ms": 0.05 * p50 if p50 else None,
            "dbos_overhead_share": dbos_over / p50 if dbos_over is not None and p50 else None,
            "dbos_p50_vs_two_requests": p50 / floor_ms if p50 else None,
            "targets": {
                "model_requests_le_2": (rows.get("dbos", {}).get("model_requests") or 99) <= 2,
                "checkpoints_le_6": (rows.get("dbos", {}).get("checkpoints") or 99) <= 6,
                "p50_le_1_15x_of_2x500ms": p50 is not None and p50 <= 1.15 * floor_ms,
                "overhead_under_5pct": dbos_over is not None and p50 is not None and dbos_over < 0.05 * p50,
            },
        }
    return out

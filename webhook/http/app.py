"""The aiohttp applications: AdmissionReview endpoints and health; metrics on a port of their own.

``POST /validate`` and ``POST /mutate`` take an ``admission.k8s.io/v1`` AdmissionReview and
answer one, always echoing the request's uid. Hostile input is answered at the edge: a missing
or empty body, a wrong content type, JSON that does not decode (nested past the decoder's depth
included) or is not an AdmissionReview get HTTP 400 with a short reason; a body over 7 MiB gets
413 and is read no further; a body that does not arrive within the deadline gets 408. Past parsing,
every failure is a denial: an unexpected exception (logged with its stack trace and a request
id) and an answer not ready a second before the API server's timeout (fail closed, so the API
server never has to time out on us).

``/metrics`` is served by :func:`create_metrics_app` on a separate port, so a NetworkPolicy can
admit the API server's callers to the admission port and only the scraper to the metrics port.
Metric labels take known values only: a kind no ApplicationDefinition declares is counted as
``other``, so no request can add a label value (or a byte) to what ``/metrics`` returns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from webhook.admission.admit import Admission, internal_error
from webhook.core.admission.decisions import Decision, errored
from webhook.core.admission.fair_queue import FairLimits
from webhook.core.admission.reviews import (
    AdmissionRequest,
    Response,
    ReviewError,
    parse_review,
    review_response,
)
from webhook.core.base.json_codec import decode_json, encode_json, json_values_beyond
from webhook.http.edges import EdgeLog
from webhook.http.fair_metrics import tenant_label
from webhook.http.fairness import FairAdmission, Throttled, peek
from webhook.http.metrics import Metrics
from webhook.settings import MAX_REQUEST_BYTES, Settings

__all__ = [
    "UNKNOWN_KIND_LABEL",
    "Readiness",
    "admission_key",
    "create_app",
    "create_metrics_app",
    "edges_key",
    "fairness_key",
    "metrics_key",
    "readiness_key",
    "settings_key",
]

log = logging.getLogger("webhook.requests")

UNKNOWN_KIND_LABEL = "other"
_LOGGED_CHARS = 253  # a Kubernetes name at most; a longer value is hostile and cut
# JSON values one review may hold, counted before decoding, strings' contents left out: an
# UPDATE of an application at its values bound (20,000 entries) brings it twice, each time with
# managedFields listing every map key it holds as ``"f:key":{}`` (two values more each), some
# 61,000 a version through a real kube-apiserver; 200,000 leaves 78,000 for the rest of two
# objects' metadata. Decoding 200,000 empty lists takes some 50 ms, where 7 MiB of them took
# 1.7 s.
MAX_REVIEW_VALUES: Final = 200_000
# What ``web.json_response`` sent: the answer is encoded once, to bytes, and sent as it is.
_JSON_HEADERS = {"Content-Type": "application/json; charset=utf-8"}


@dataclass
class Readiness:
    """What ``/readyz`` needs besides a synced state: the TLS listener is up; and, for a live
    state, what keeps it from being synced and what only degrades it, one line each."""

    serving: bool = False
    explain: Callable[[], tuple[list[str], list[str]]] | None = None


admission_key = web.AppKey("admission", Admission)
settings_key = web.AppKey("settings", Settings)
metrics_key = web.AppKey("metrics", Metrics)
readiness_key = web.AppKey("readiness", Readiness)
edges_key = web.AppKey("edges", EdgeLog)
fairness_key = web.AppKey("fairness", FairAdmission)


def create_app(admission: Admission, settings: Settings) -> web.Application:
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)
    app[admission_key] = admission
    app[settings_key] = settings
    app[metrics_key] = Metrics(lambda: admission.state)
    if admission.quotas is not None:
        app[metrics_key].watch_guard(lambda: admission.state, admission.quotas)
    app[readiness_key] = Readiness()
    app[edges_key] = EdgeLog()
    app[fairness_key] = _fairness(settings, app[metrics_key], app[edges_key], admission)
    app.router.add_post("/validate", validate)
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    return app


def _fairness(
    settings: Settings, metrics: Metrics, edges: EdgeLog, admission: Admission
) -> FairAdmission:
    """The fair queue every review waits in, reporting to the metrics and the edge log."""
    fair = FairAdmission(
        wait_seconds=settings.fair_wait_seconds,
        limits=FairLimits(queue_length=settings.fair_queue_length),
    )

    def done(flow: str, waited: float, cpu: float) -> None:
        metrics.fair.observe_turn(tenant_label(admission.state, flow), waited, cpu)

    def refused(refusal: Throttled) -> None:
        metrics.fair.count_throttled(tenant_label(admission.state, refusal.flow), refusal.reason)
        edges.rejected("fairness", refusal.flow, f"429 {refusal.flow}: {refusal.reason}")

    fair.on_done = done
    fair.on_refused = refused
    metrics.fair.watch_queue(lambda: float(fair.queue.waiting))
    return fair


def create_metrics_app(registry: Metrics) -> web.Application:
    """The plain-HTTP application serving ``/metrics`` (and nothing that takes a body)."""
    app = web.Application(client_max_size=1024)
    app[metrics_key] = registry
    app.router.add_get("/metrics", metrics)
    return app


async def validate(request: web.Request) -> web.Response:
    admission = request.app[admission_key]
    return await _review(request, "validate", admission.validate)


async def mutate(request: web.Request) -> web.Response:
    admission = request.app[admission_key]
    return await _review(request, "mutate", admission.mutate)


async def livez(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    """Ready when the listener serves and, in enforce mode, the state is synced; the body says
    why not, and what only one kind or one object suffers from.

    In ``warn`` and ``off`` modes readiness does not wait for the applications: a write that
    cannot be decided is allowed with a warning (warn) or not looked at (off), so being ready
    refuses nothing, while being unready would refuse every write (``failurePolicy: Fail``).
    Kinds set to ``enforce`` under a warn default are denied, one by one, while not synced.
    """
    readiness = request.app[readiness_key]
    blocking, degraded = readiness.explain() if readiness.explain is not None else ([], [])
    problems = []
    state_needed = request.app[settings_key].mode == "enforce"
    if not request.app[admission_key].state.synced:
        if state_needed:
            problems.append("state not synced")
        else:
            degraded = [*(f"not synced: {line}" for line in blocking), *degraded]
            blocking = []
    if not readiness.serving:
        problems.append("TLS listener not serving")
    lines = [f"- {line}" for line in (*blocking, *degraded)] if problems else []
    if problems:
        return web.Response(status=503, text="\n".join(["; ".join(problems), *lines]) + "\n")
    return web.Response(text="\n".join(["ok", *(f"- {line}" for line in degraded)]) + "\n")


async def metrics(request: web.Request) -> web.Response:
    body = request.app[metrics_key].expose()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


async def _review(
    request: web.Request,
    endpoint: str,
    decide: Callable[[AdmissionRequest], Awaitable[Decision]],
) -> web.Response:
    started = time.perf_counter()
    settings = request.app[settings_key]
    try:
        if request.content.is_eof():  # the whole body is here: reading it cannot wait
            raw = await _read_body(request)
        else:  # a body trickled in slowly is cut off at the same deadline as a decision
            async with asyncio.timeout(settings.deadline_seconds):
                raw = await _read_body(request)
        peeked = peek(raw)  # who sent it and how large: before anything costly
        work = _decided(raw, decide, settings.deadline_seconds, time.monotonic())
        (review, decision), waited = await request.app[fairness_key].run(
            peeked.flow, len(raw), work
        )
    except TimeoutError:
        request.app[edges_key].rejected(
            "http", str(request.remote or "unknown"), "408 the request body did not arrive in time"
        )
        raise web.HTTPRequestTimeout(text="the request body did not arrive in time\n") from None
    except web.HTTPException as exc:  # 400, 413: logged (rate-limited), then answered
        reason = f"{exc.status} {' '.join((exc.text or exc.reason).split())}"
        request.app[edges_key].rejected("http", str(request.remote or "unknown"), reason)
        raise
    except Throttled as refusal:
        return _throttled(request, endpoint, peeked.uid, refusal, time.perf_counter() - started)
    except _Oversized as refusal:
        return _refused_unread(
            request, endpoint, peeked.uid, refusal, time.perf_counter() - started
        )
    elapsed = time.perf_counter() - started
    try:
        known = request.app[admission_key].state.platform.kind(review.kind) is not None
        _observe(
            request.app[metrics_key],
            endpoint,
            review,
            decision,
            elapsed,
            known=known,
            flow=peeked.flow,
            waited=waited,
        )
    except Exception:  # reporting must never change or lose an answer
        logging.getLogger(__name__).exception("recording a decision failed")
    return _answer(review.uid, decision.response())


async def _decided(
    raw: bytes,
    decide: Callable[[AdmissionRequest], Awaitable[Decision]],
    deadline: float,
    queued: float,
) -> tuple[AdmissionRequest, Decision]:
    """The costly part, run in the flow's turn: decode, parse and decide (fail closed)."""
    if len(raw) > MAX_REVIEW_VALUES:  # a shorter body cannot hold more values than bytes
        values = json_values_beyond(raw, MAX_REVIEW_VALUES)
        if values is not None:
            raise _Oversized(values)
    review = _parse_review(raw)
    try:  # the time waited for the turn is the decision's too (at most a quarter of it)
        async with asyncio.timeout(max(deadline - (time.monotonic() - queued), 0.1)):
            decision = await decide(review)
    except TimeoutError:
        decision = errored(
            500,
            "InternalError",
            "deadline",
            f"tenant reservations: no decision within {deadline:g}s; denied to be safe, try again",
        )
    except Exception:
        decision = internal_error(review)
    return review, decision


class _Oversized(Exception):
    """A body holding more JSON values than any review does: refused before it is decoded."""

    def __init__(self, values: int) -> None:
        super().__init__(
            f"tenant reservations: the review holds more than {MAX_REVIEW_VALUES} JSON values "
            f"(about {values}); refused before decoding it"
        )


def _refused_unread(
    request: web.Request, endpoint: str, uid: str, refusal: _Oversized, elapsed: float
) -> web.Response:
    """The denial of a review too large to decode: 413 with the uid read from its first bytes;
    without one, a bare HTTP 413 (the API server then fails the call: denied all the same)."""
    request.app[metrics_key].observe_latency(endpoint, "denied", elapsed)
    request.app[edges_key].rejected("http", str(request.remote or "unknown"), f"413 {refusal}")
    if not uid:
        raise web.HTTPRequestEntityTooLarge(
            max_size=MAX_REQUEST_BYTES, actual_size=request.content_length or 0, text=f"{refusal}\n"
        )
    decision = errored(413, "RequestEntityTooLarge", "too-large", str(refusal))
    return _answer(uid, decision.response())


def _throttled(
    request: web.Request, endpoint: str, uid: str, refusal: Throttled, elapsed: float
) -> web.Response:
    """The 429 denial of a review refused its turn; without a uid to echo, a bare HTTP 429
    (the API server then fails the call: denied all the same)."""
    metrics = request.app[metrics_key]
    metrics.observe_latency(endpoint, "denied", elapsed)
    if not uid:
        raise web.HTTPTooManyRequests(
            text=refusal.message + "\n", headers={"Retry-After": str(refusal.retry_after)}
        )
    # A denial, never an allow: the review was never decided (fail closed).
    decision = errored(429, "TooManyRequests", f"throttled-{refusal.reason}", refusal.message)
    answer = decision.response()
    answer["status"]["details"] = {"retryAfterSeconds": refusal.retry_after}
    return _answer(uid, answer)


def _answer(uid: str, response: Response) -> web.Response:
    """The AdmissionReview answering ``uid`` with ``response``, encoded once and sent as is."""
    return web.Response(body=encode_json(review_response(uid, response)), headers=_JSON_HEADERS)


async def _read_body(request: web.Request) -> bytes:
    """The body's bytes, or an HTTP error for a body that cannot be a review."""
    if request.content_length is not None and request.content_length > MAX_REQUEST_BYTES:
        raise web.HTTPRequestEntityTooLarge(
            max_size=MAX_REQUEST_BYTES, actual_size=request.content_length
        )
    if request.content_type != "application/json":
        raise web.HTTPBadRequest(
            text=f"content type must be application/json, not {request.content_type or 'missing'}\n"
        )
    raw = await request.read()  # enforces client_max_size for chunked bodies too (413)
    if not raw:
        raise web.HTTPBadRequest(text="empty body\n")
    return raw


def _parse_review(raw: bytes) -> AdmissionRequest:
    """The AdmissionReview's request, or an HTTP error for hostile input."""
    try:
        body = decode_json(raw)
    except RecursionError:  # nesting deeper than the decoder recurses: hostile, not a fault
        raise web.HTTPBadRequest(text="the body is not JSON: nested too deeply\n") from None
    except (ValueError, UnicodeDecodeError):
        raise web.HTTPBadRequest(text="the body is not JSON\n") from None
    try:
        return parse_review(body, len(raw))
    except ReviewError as exc:
        raise web.HTTPBadRequest(text=f"{exc}\n") from None


def _observe(
    metrics: Metrics,
    endpoint: str,
    review: AdmissionRequest,
    decision: Decision,
    elapsed: float,
    *,
    known: bool,
    flow: str,
    waited: float,
) -> None:
    metrics.observe_latency(endpoint, decision.outcome, elapsed)
    if endpoint == "validate":
        kind = review.kind if known else UNKNOWN_KIND_LABEL
        metrics.count_decision(kind, decision.outcome, decision.reason, decision.mode)
    if not log.isEnabledFor(logging.INFO):
        return
    log.info(
        "%s %s",
        endpoint,
        decision.outcome,
        extra={
            "fields": {
                "uid": review.uid,
                "kind": review.kind[:_LOGGED_CHARS],
                "namespace": review.namespace[:_LOGGED_CHARS],
                "name": review.name[:_LOGGED_CHARS],
                "user": review.user,
                "operation": review.operation,
                "dry_run": review.dry_run,
                "endpoint": endpoint,
                "decision": decision.outcome,
                "reason": decision.reason,
                "pool": decision.pool,
                "latency_ms": round(elapsed * 1000, 3),
                "flow": flow[:_LOGGED_CHARS],
                "queued_ms": round(waited * 1000, 3),
            }
        },
    )

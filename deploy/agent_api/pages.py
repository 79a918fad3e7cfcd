"""The pages people open (chat, dashboard, report card, runs, review queue) and the JSON the
dashboard and report card poll (the runs and the queue read `/v1/runs` and `/v1/review`).

The pages are static files shipped in the package (`deploy/agent_api/static/`: HTML, one
small script each, one stylesheet; no CDN, no build step). They ask for an API key once and
keep it in the browser's local storage; every call they make is an ordinary API call with it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse

from deploy.agent_api.dashboard_data import snapshot
from deploy.agent_api.deps import CallerDep, ServicesDep
from deploy.agent_api.schemas import errors

STATIC_DIR = Path(__file__).parent / "static"
router = APIRouter()
PAGES = {
    "/chat": "chat.html",
    "/dashboard": "dashboard.html",
    "/report-card": "report-card.html",
    "/runs": "runs.html",
    "/review": "review.html",
}


@router.get("/", include_in_schema=False)
async def home() -> RedirectResponse:
    return RedirectResponse("/chat")


def _page(name: str):
    async def page() -> FileResponse:
        return FileResponse(STATIC_DIR / name, media_type="text/html")

    return page


for path, file in PAGES.items():
    router.add_api_route(path, _page(file), include_in_schema=False)


@router.get("/v1/dashboard", responses=errors(401, 503))
async def dashboard(services: ServicesDep, caller: CallerDep) -> dict[str, Any]:
    """The loop at a glance: versions (held-out success, the caller's tenant's live traffic,
    gate), rounds, canary, streams, learner, and what each policy server serves; charts as SVG."""
    s, tenant = services.settings, caller.key.tenant
    return await asyncio.to_thread(
        snapshot, services.reader, services.tally, s.canary_share, tenant, s.shards
    )


@router.get("/v1/report-card", responses=errors(401, 503))
async def report_card(services: ServicesDep, caller: CallerDep) -> dict[str, Any]:
    """Per agent and version, over the caller's tenant's runs: goal consistency, error
    recovery, self-reflection use; and the deployment's stress cases (definitions: the
    README's "Agent report card")."""
    await asyncio.to_thread(services.tally.refresh, services.reader)
    return {"agents": services.tally.report_card(caller.key.tenant)}

"""The operator console: pending approvals, refunds, a refund's timeline, admin actions, and sessions."""

from fastapi import APIRouter

from agent.console import oidc_views, session_views, signin, views
from agent.console.pages import setup

router = APIRouter()
router.include_router(signin.router)
router.include_router(oidc_views.router)
router.include_router(views.router)
router.include_router(session_views.router)

__all__ = ["router", "setup"]

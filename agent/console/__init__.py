"""The operator console: pending approvals, refunds, a refund's timeline, admin actions, and sessions."""

from fastapi import APIRouter

from agent.console import audit_view, oidc_views, session_views, signin, views
from agent.console.errors import install_error_pages
from agent.console.pages import setup

router = APIRouter()
router.include_router(signin.router)
router.include_router(oidc_views.router)
router.include_router(views.router)
router.include_router(session_views.router)
router.include_router(audit_view.router)

__all__ = ["install_error_pages", "router", "setup"]

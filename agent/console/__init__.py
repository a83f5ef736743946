"""The operator console: pending approvals, refunds, a refund's timeline, and admin actions."""

from agent.console.pages import setup
from agent.console.views import router

__all__ = ["router", "setup"]

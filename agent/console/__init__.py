"""The operator console: pending approvals, refunds, a refund's timeline, and admin actions."""

from agent.console.views import router, setup

__all__ = ["router", "setup"]

"""The evidence sandbox (carrier, returns, helpdesk) under uvicorn in a thread, with the suite's credentials."""

from __future__ import annotations

from typing import Any

from sandbox.evidence import Credentials, EvidenceSeed, create_app
from steps.seed_evidence import demo_evidence
from tests import web
from tests.servers import ThreadedServer

CREDENTIALS = Credentials(
    carrier_key="ek_carrier_suite",
    returns_token="ek_returns_suite",
    tickets_email="support@suite.example",
    tickets_token="ek_tickets_suite",
    admin_key="ek_admin_suite",
)
_ADMIN = {"Authorization": f"Bearer {CREDENTIALS.admin_key}"}


def demo_seed() -> EvidenceSeed:
    return EvidenceSeed.model_validate(demo_evidence())


class EvidenceServer(ThreadedServer):
    """Serves ``seed`` (the demo's evidence by default) and checks the suite's keys."""

    def __init__(self, seed: EvidenceSeed | None = None) -> None:
        super().__init__(create_app(seed or demo_seed(), credentials=CREDENTIALS))
        self.start()

    def stats(self) -> dict[str, int]:
        response = web.get(self.base_url + "/_sandbox/stats", headers=_ADMIN)
        response.raise_for_status()
        return dict(response.json())

    def set_faults(self, **services: dict[str, Any]) -> None:
        """Replace every service's faults (a service not named gets none)."""
        web.put(self.base_url + "/_sandbox/faults", json=services, headers=_ADMIN).raise_for_status()

    def load(self, seed: EvidenceSeed) -> None:
        web.put(self.base_url + "/_sandbox/data", json=seed.model_dump(mode="json"), headers=_ADMIN).raise_for_status()

    def settings(self) -> dict[str, Any]:
        """Settings values pointing every evidence service at this sandbox."""
        return {
            "carrier_api_base": self.base_url,
            "carrier_api_key": CREDENTIALS.carrier_key,
            "returns_api_base": self.base_url,
            "returns_api_key": CREDENTIALS.returns_token,
            "tickets_api_base": self.base_url,
            "tickets_api_email": CREDENTIALS.tickets_email,
            "tickets_api_token": CREDENTIALS.tickets_token,
        }

    def env_vars(self) -> dict[str, str]:
        """The same as environment variables, for worker subprocesses."""
        return {name.upper(): str(value) for name, value in self.settings().items()}

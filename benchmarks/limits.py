"""Every benchmark judges each refund as its customer's first.

The benchmarks submit hundreds of refunds for a handful of demo customers; what they measure is a refund's
path (checkpoints, round trips, waiting), not the serial-claimant rule, which would park all but the first
three of each customer's refunds and change the path being measured. Results from before the rule compare
like with like.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

#: As environment variables, for the processes a benchmark starts.
SERIAL_RULE_OFF_ENV = {
    "CUSTOMER_MAX_REFUNDS": "1000000000",
    "CUSTOMER_MAX_REFUND_AMOUNT": "1000000000000",
    "ORDER_MAX_OPEN_CLAIMS": "1000000000",
}
#: As settings, for a service a benchmark starts in its own process.
SERIAL_RULE_OFF: dict[str, Any] = {
    "customer_max_refunds": 1_000_000_000,
    "customer_max_refund_amount": Decimal(1_000_000_000_000),
    "order_max_open_claims": 1_000_000_000,
}

"""How the scripted models read a claim: keywords to a category, a category to the look-ups it needs.

Used by the deterministic offline model (agent/offline.py) and the scripted OpenAI-compatible server
(sandbox/model.py): test doubles that pick tools by the claim's category, as the instructions tell a real
model to. A real model reads the claim itself; nothing in the product decides on these keywords.
"""

from __future__ import annotations

import re
import unicodedata

#: First match wins: a charge they do not recognise before "never received", a return before a late parcel.
_CATEGORIES: list[tuple[str, re.Pattern[str]]] = [
    (
        "duplicate_charge",
        re.compile(
            r"charged (?:me )?twice|double[- ]charged|duplicate charge|two charges|charged two times|"
            r"(?:don'?t|do not) recogni[sz]e|unauthori[sz]ed|not authori[sz]ed|my bank (?:says|flagged|disputes?)",
            re.I,
        ),
    ),
    (
        "returned",
        re.compile(
            r"sent (?:it|them|everything|the \w+) back|send (?:it|them) back|shipped (?:it|them) back|"
            r"mailed (?:it|them) back|returned (?:it|them|the|my)|i returned|return(?:ed)? (?:parcel|package)|"
            r"devuelto|zurückgeschickt|renvoyé",
            re.I,
        ),
    ),
    (
        "not_received",
        re.compile(
            r"never (?:arrived|came|showed up|(?:got|received)(?! (?:my |the |a |any )?(?:refund|money)))|"
            r"(?:didn'?t|did not|hasn'?t|has not|have not|haven'?t) "
            r"(?:arrive|arrived|receive|received|got|come|shown up)|not (?:arrived|received|delivered)|"
            r"where is my (?:order|parcel|package)|(?:parcel|package|order) (?:is |was )?(?:lost|missing)|"
            r"still (?:waiting|not here)|no ha llegado|nicht angekommen|pas (?:reçu|arrivé)|jamais reçu|届いていません",
            re.I,
        ),
    ),
    (
        "wrong_item",
        re.compile(r"wrong (?:item|size|colou?r|model|product)|not what i ordered|sent me the wrong", re.I),
    ),
    (
        "damaged",
        re.compile(
            r"broken|damaged|cracked|dent(?:ed)?\b|defective|faulty|stopped working|doesn'?t work|does not work|"
            r"shattered|roto|kaputt|cassé|abîmé",
            re.I,
        ),
    ),
    ("not_as_described", re.compile(r"not as described|(?:doesn'?t|does not) match|misleading|fake|counterfeit", re.I)),
    (
        "changed_mind",
        re.compile(
            r"changed my mind|(?:don'?t|do not) (?:want|need|like) (?:it|them)|no longer (?:want|need)|"
            r"ya no lo quiero|plus besoin",
            re.I,
        ),
    ),
]

#: The look-up a category needs (tool names of agent/brain.py).
TOOLS_FOR: dict[str, tuple[str, ...]] = {
    "not_received": ("track_shipment",),
    "returned": ("check_return",),
    "changed_mind": ("check_return",),
    "duplicate_charge": ("check_payment_risk",),
}
_EARLIER = re.compile(
    r"as i (?:said|told|wrote|mentioned)|last time|earlier (?:ticket|conversation|email|chat)|my (?:previous|last) "
    r"(?:ticket|message|email)|your colleague|(?:agent|support) (?:promised|said|told me)",
    re.I,
)


def _seen(message: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKC", message) if unicodedata.category(c) != "Cf")


def classify(message: str) -> str:
    """The claim's category from the customer's words (``other`` when nothing matches)."""
    text = _seen(message)
    return next((name for name, pattern in _CATEGORIES if pattern.search(text)), "other")


def tools_for(message: str) -> tuple[str, ...]:
    """The look-ups the claim needs: its category's, and the earlier tickets when it refers to them."""
    tools = TOOLS_FOR.get(classify(message), ())
    return (*tools, "read_earlier_tickets") if _EARLIER.search(_seen(message)) else tools

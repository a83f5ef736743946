"""What the customer's words claim, read without the model: phrases to claim categories. Pure; table-tested.

Policy sets this reading beside the model's category (agent/policy.py): the look-ups a claim needs come from
both, and a model whose category is not among the categories the words name hands the refund to a person. So a
customer who steers the model (or a model that misfiles) cannot pick which evidence is read. The reader errs
towards finding more: a message naming two claims ("it never arrived and I was charged twice") reads as both,
and each one's evidence is looked up. Words it does not know read as nothing, and the model's category stands.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Literal

#: The categories this reader can find (agent.domain.ClaimCategory, ``other`` excepted).
Read = Literal[
    "not_received", "damaged", "returned", "wrong_item", "not_as_described", "duplicate_charge", "changed_mind"
]

_NOT_MONEY = r"(?! (?:my |the |a |any |your )?(?:refund|money|reply|answer|email|response))"
_PHRASES: dict[Read, str] = {
    "not_received": (
        rf"never (?:arrived|came|showed up|turned up|(?:got|received)\b{_NOT_MONEY})|"
        rf"(?:didn'?t|did not|hasn'?t|has not|haven'?t|have not|never) (?:arrive|arrived|come|turn(?:ed)? up|"
        rf"show(?:n|ed)? up|(?:receive|received|get|got)\b{_NOT_MONEY})|"
        r"not (?:yet )?(?:arrived|received|delivered)|not (?:yet )?been delivered|"
        r"(?:never|didn'?t|did not|hasn'?t|has not) (?:made|make) it\b|nowhere to be (?:found|seen)|"
        r"where(?:'s| is) my (?:order|parcel|package|delivery|item)|"
        r"(?:parcel|package|order|delivery|shipment|item)s? (?:is |was |got |has been |have been |went )?"
        r"(?:lost|missing|stolen)|lost in (?:the )?(?:post|mail|transit)|still (?:waiting|not here)|no sign of|"
        r"no ha llegado|nicht angekommen|pas (?:reçu|arrivé)|jamais reçu|届いていません"
    ),
    "damaged": (
        r"\b(?:broken|broke\b|damaged|cracked|dent(?:ed|s)?\b|defective|faulty|stopped working|(?:doesn'?t|does not|"
        r"won'?t|will not) (?:work|turn on|switch on|charge)|shattered|smashed|crushed|in pieces|torn|ripped|"
        r"leak(?:s|ing|ed)?\b|roto\b|kaputt|cassé|abîmé)"
    ),
    "returned": (
        r"(?:sent|send|shipped|mailed|posted|brought|took) (?:it|them|everything|(?:the|my|both) \w+(?: \w+)?) back|"
        r"returned (?:it|them|the|my|everything)|i (?:have |already )?returned|return(?:ed)? (?:parcel|package)|"
        r"dropped (?:it|them|the parcel|the package|the return) off|went back to (?:you|your|the)\b|"
        r"(?:with|using) the (?:return )?label you|devuelto|zurückgeschickt|renvoyé"
    ),
    "wrong_item": (
        r"wrong (?:item|size|colou?r|model|product|one|thing|book)s?\b|not what i ordered|sent me the wrong|"
        r"(?:a |the )?different (?:item|product|model) (?:than|from|to) (?:what|the one) i ordered|"
        r"instead of (?:the|my) \w+ i ordered"
    ),
    "not_as_described": (
        r"not as (?:described|advertised|pictured|shown)|(?:doesn'?t|does not|didn'?t|did not) match|misleading|"
        r"\bfake\b|counterfeit|looks nothing like"
    ),
    "duplicate_charge": (
        r"charged (?:me )?(?:twice|two times|double|again)|double[- ]charged|duplicate (?:charge|payment)|"
        r"two (?:charges|payments)|(?:don'?t|do not|didn'?t|did not) recogni[sz]e|unauthori[sz]ed|"
        r"not authori[sz]ed|(?:didn'?t|did not|never) (?:make|authori[sz]e) (?:this|that|the) (?:purchase|payment)|"
        r"my bank (?:says|flagged|disputes?)"
    ),
    "changed_mind": (
        r"changed my mind|(?:don'?t|do not) (?:want|need|like) (?:it|them|this|these)|no longer (?:want|need)|"
        r"not needed any ?more|ya no lo quiero|plus besoin"
    ),
}
_PATTERNS: dict[Read, re.Pattern[str]] = {name: re.compile(text, re.I) for name, text in _PHRASES.items()}
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u02bc": "'"})


def _seen(message: str) -> str:
    """The words as a person sees them: compatibility forms folded, invisible format characters dropped,
    curly apostrophes straightened and runs of spaces made one."""
    folded = unicodedata.normalize("NFKC", message).translate(_QUOTES)
    visible = "".join(c for c in folded if unicodedata.category(c) != "Cf")
    return " ".join(visible.split())


def read_claim(message: str) -> frozenset[Read]:
    """The claim categories the customer's words name (empty: none this reader knows)."""
    text = _seen(message)
    return frozenset(name for name, pattern in _PATTERNS.items() if pattern.search(text))

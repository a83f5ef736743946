"""The deterministic reading of a customer's words: a table of messages, reworded as customers write them, against
the claim categories the reader must find (and must not)."""

from __future__ import annotations

import pytest

from agent.claim_reading import read_claim

READINGS: list[tuple[str, set[str]]] = [
    # never arrived, reworded
    ("My desk lamp never arrived.", {"not_received"}),
    ("I didn't get it.", {"not_received"}),
    ("I didn\u2019t get it", {"not_received"}),
    ("Parcel lost, please refund.", {"not_received"}),
    ("The package was lost in the post.", {"not_received"}),
    ("It has not arrived yet and it's been two weeks.", {"not_received"}),
    ("Where is my order?", {"not_received"}),
    ("Still waiting for the boots.", {"not_received"}),
    ("It never showed up.", {"not_received"}),
    ("Nothing came. My package is missing.", {"not_received"}),
    ("Mi pedido no ha llegado.", {"not_received"}),
    ("Das Paket ist nicht angekommen.", {"not_received"}),
    ("The lamp is nowhere to be found, the box never made it to my door.", {"not_received"}),
    ("My package has not been delivered yet and I would like the money back.", {"not_received"}),
    ("The parcel didn't make it to me.", {"not_received"}),
    # damaged, reworded
    ("It arrived broken.", {"damaged"}),
    ("actually it arrived broken", {"damaged"}),
    ("The screen is cracked.", {"damaged"}),
    ("The mouse stopped working after two days.", {"damaged"}),
    ("The kettle leaks.", {"damaged"}),
    ("The courier smashed the box.", {"damaged"}),
    ("It won't turn on.", {"damaged"}),
    # sent back
    ("I sent it back last week.", {"returned"}),
    ("I returned the yoga mat weeks ago.", {"returned"}),
    ("I shipped them back to you.", {"returned"}),
    ("The mat went back to your warehouse with the label you emailed.", {"returned"}),
    # charged twice
    ("I was charged twice for this band.", {"duplicate_charge"}),
    ("You double-charged me.", {"duplicate_charge"}),
    ("I don't recognise this charge.", {"duplicate_charge"}),
    # the others
    ("You sent me the wrong size.", {"wrong_item"}),
    ("The jacket is not as described.", {"not_as_described"}),
    ("I changed my mind, I don't want it.", {"changed_mind"}),
    # two claims at once: both
    ("It never arrived and I was charged twice.", {"not_received", "duplicate_charge"}),
    ("It arrived broken so I sent it back.", {"damaged", "returned"}),
    # what it must not read
    ("I never got my refund, please send the 42.00 again.", set()),
    ("I haven't received your reply.", set()),
    ("Please refund me.", set()),
    ("An accident with the protocol.", set()),
    ("Wrong order number, I meant ord_6504.", set()),
    ("Arrived fine, thanks.", set()),
]


@pytest.mark.parametrize(("message", "categories"), READINGS, ids=[r[0] for r in READINGS])
def test_the_words_read_as_their_claims(message: str, categories: set[str]) -> None:
    assert read_claim(message) == categories


def test_invisible_characters_and_spacing_do_not_hide_a_claim() -> None:
    assert read_claim("never\u200b arrived") == {"not_received"}
    assert read_claim("NEVER   ARRIVED") == {"not_received"}
    fullwidth = "".join(chr(ord(c) + 0xFEE0) if c != " " else c for c in "never arrived")
    assert read_claim(fullwidth) == {"not_received"}  # fullwidth letters fold (NFKC)

"""Broadcast: one owner emits, handlers receive in order, a failing one never stops the rest."""

from __future__ import annotations

import logging

from etiquette_proxy.events import Broadcast


def test_handlers_receive_every_emit_in_the_order_they_connected():
    event: Broadcast[int] = Broadcast("numbers")
    seen: list[tuple[str, int]] = []
    event.connect(lambda n: seen.append(("first", n)))
    event.connect(lambda n: seen.append(("second", n)))
    event.emit(1)
    event.emit(2)
    assert seen == [("first", 1), ("second", 1), ("first", 2), ("second", 2)]
    assert len(event) == 2


def test_a_failing_handler_is_logged_and_the_next_still_runs(caplog):
    event: Broadcast[str] = Broadcast("audit record")
    seen: list[str] = []

    def broken(value: str) -> None:
        raise RuntimeError("receiver bug")

    event.connect(broken)
    event.connect(seen.append)
    with caplog.at_level(logging.ERROR):
        event.emit("line")
    assert seen == ["line"]
    assert "audit record handler" in caplog.text and "receiver bug" in caplog.text


def test_emit_with_no_handler_does_nothing():
    Broadcast[str]("listening").emit("nobody")

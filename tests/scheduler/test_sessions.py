"""SessionTable: the sticky-session lifecycle, moves, orphaning and the size bound."""

from __future__ import annotations

import pytest

from scheduler.sessions import TRANSITIONS, SessionError, SessionEvent, SessionState, SessionTable, _next


def test_first_placement_is_not_a_move_and_a_second_node_is():
    table = SessionTable()
    assert table.place("s", "d1") is False
    assert table.place("s", "d1") is False
    assert table.place("s", "d2") is True
    assert (table.node_of("s"), table.num_on("d1"), table.num_on("d2")) == ("d2", 0, 1)


def test_a_departed_nodes_sessions_are_orphaned_until_placed_again():
    table = SessionTable()
    table.place("a", "d1")
    table.place("b", "d1")
    table.place("c", "d2")
    assert table.node_left("d1") == 2
    assert table.node_of("a") is None and table.get("a").state is SessionState.ORPHANED
    assert table.node_of("c") == "d2"
    assert table.place("a", "d2") is True and table.get("a").state is SessionState.PLACED


def test_the_least_recently_placed_session_is_forgotten_beyond_the_bound():
    table = SessionTable(max_sessions=2)
    table.place("a", "d1")
    table.place("b", "d1")
    table.place("a", "d1")      # a is now the most recent
    table.place("c", "d2")
    assert (table.get("a") is not None, table.get("b"), len(table)) == (True, None, 2)
    assert table.num_on("d1") == 1


def test_an_orphan_cannot_be_orphaned_again():
    with pytest.raises(SessionError):
        _next(SessionState.ORPHANED, SessionEvent.NODE_LEFT)
    with pytest.raises(SessionError):
        _next(None, SessionEvent.NODE_LEFT)
    assert set(TRANSITIONS.values()) == set(SessionState)


def test_a_table_needs_room_for_one_session():
    with pytest.raises(ValueError):
        SessionTable(0)

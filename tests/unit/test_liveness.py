"""Who is alive, from heartbeats and disconnect events."""

from __future__ import annotations

from shared.liveness import Liveness


def test_a_peer_is_alive_within_its_timeout_and_epoch() -> None:
    view = Liveness(timeout_s=3.0, started_at=0.0)
    view.beat("p0", "prefill", "e1", now=10.0)
    assert view.alive("p0", 12.9) and view.alive("p0", 12.9, "e1")
    assert not view.alive("p0", 13.1)
    assert not view.alive("p0", 11.0, "e0")  # a restarted node is another process
    view.beat("p0", "prefill", "e1", now=20.0, healthy=False)
    assert not view.alive("p0", 20.5)  # a stuck engine serves nobody


def test_a_disconnect_kills_until_the_next_heartbeat() -> None:
    view = Liveness(timeout_s=3.0)
    view.beat("d0", "decode", "e", now=10.0)
    assert view.disconnected("d0", 10.5) == "d0"
    assert not view.alive("d0", 10.6)
    assert view.disconnected("unknown", 10.5) is None
    assert view.disconnected("decode", 10.5) is None  # a role-wide user names no node
    view.beat("d0", "decode", "e2", now=11.0)
    assert view.alive("d0", 11.5)


def test_unknown_peers_are_given_one_timeout_and_our_outages_prove_nothing() -> None:
    view = Liveness(timeout_s=3.0, started_at=100.0)
    assert view.alive("new", 102.0) and not view.alive("new", 104.0)
    view.beat("p0", "prefill", "e", now=100.0)
    view.reconnected(now=110.0)  # we could not hear anyone for a while
    assert view.alive("p0", 112.0)


def test_serving_lists_live_peers_that_take_work() -> None:
    view = Liveness(timeout_s=3.0)
    view.beat("p0", "prefill", "e", now=1.0)
    view.beat("p1", "prefill", "e", now=1.0, draining=True)
    view.beat("d0", "decode", "e", now=1.0)
    assert view.serving("prefill", 2.0) == ["p0"] and view.serving("decode", 5.0) == []
    view.forget_old(40.0)
    assert view.peers == {}


def test_an_epoch_not_heard_yet_is_given_a_timeout_and_a_restart_is_death() -> None:
    view = Liveness(timeout_s=3.0)
    view.beat("p0", "prefill", "old", now=10.0)
    # The scheduler heard p0's new epoch first and placed a request there at 10.5.
    assert view.alive("p0", 11.0, "new", since=10.5)
    assert not view.alive("p0", 14.0, "new", since=10.5)  # and it never spoke in it
    view.beat("p0", "prefill", "new", now=11.0)
    assert view.alive("p0", 11.5, "new", since=10.5)
    # A request owned in "new" since 12, and then p0 restarts once more: it is gone.
    view.beat("p0", "prefill", "newer", now=13.0)
    assert not view.alive("p0", 13.5, "new", since=12.0)

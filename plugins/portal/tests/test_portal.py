"""The Portal directory: wired in, names nothing, calls nobody."""

from __future__ import annotations

import asyncio
import logging
import socket
from types import SimpleNamespace

import pluggy
import pytest
from hubpool_portal import PortalDirectory

from hubpool_core import hookspecs


@pytest.fixture
def no_network(monkeypatch):
    """Any socket connection fails the test."""
    attempts = []

    def refuse(self, *args, **kwargs):
        attempts.append(args)
        raise AssertionError(f"the portal directory opened a connection to {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: refuse(None, *a))
    yield attempts
    assert attempts == []


def test_unconfigured_without_a_portal_url(no_network):
    for env in (SimpleNamespace(), SimpleNamespace(portal_url=None), SimpleNamespace(portal_url=" ")):
        d = PortalDirectory(env)
        assert d.name == "portal"
        assert not d.configured()
        assert asyncio.run(d.candidates()) == []
        assert asyncio.run(d.members()) is None
        assert asyncio.run(d.tailnet_status()) is None


def test_configured_portal_still_names_nothing_and_says_why(no_network, caplog):
    d = PortalDirectory(SimpleNamespace(portal_url="http://127.0.0.1:9"))
    assert d.configured()
    with caplog.at_level(logging.DEBUG, logger="hubpool_portal"):
        assert asyncio.run(d.candidates()) == []
    assert "names no pool peers yet" in caplog.text
    assert asyncio.run(d.members()) is None


def test_registers_through_the_hook():
    import hubpool_portal

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(hubpool_portal)
    got: list[type] = []
    pm.hook.hubpool_register_directories(register=got.append)
    assert got == [PortalDirectory]

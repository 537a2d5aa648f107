"""Builders shared by the stage tests (the ``build`` fixture): candidates, contexts and a node,
without a server."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hubpool_core.placement import JUDGED_ROUTES, Candidate, Load, PlacementContext

ROUTE_CLASS = {"/v1/chat/completions": "chat", "/api/chat": "chat", "/v1/completions": "completion",
               "/api/generate": "completion", "/v1/embeddings": "embeddings", "/api/embed": "embeddings"}


def settings(limit=0, margin=0, head_start=1, cap=None):
    return SimpleNamespace(poolPrefixAffinityMaxInFlight=limit, poolPrefixAffinityMargin=margin,
                           poolLocalAffinity=head_start, maxNumCtx=cap)


def node(local_in_flight=0, work=None):
    load = Load()
    load.local = local_in_flight
    for kind, entries in (work or {}).items():
        load.local_work[kind] = dict(entries)
    return SimpleNamespace(load=load)


def local(kind="ollama", *, windowed=True, residency=True, models=("m",), window=None, in_flight=0, pressure=0):
    engine = SimpleNamespace(kind=kind, renders_own_template=windowed, has_residency=residency)
    result = SimpleNamespace(models=[SimpleNamespace(id=m, context_window=window) for m in models])
    backend = SimpleNamespace(engine=engine, snapshot=SimpleNamespace(result=result))
    return Candidate("local", kind, local=backend, score=in_flight + pressure, in_flight=in_flight)


def peer(name, backend="ollama", *, in_flight=0, head_start=1, tier=0):
    return Candidate(name, backend, peer=SimpleNamespace(id="id-" + name, node_fqdn=name),
                     score=in_flight + head_start, tier_rank=tier, in_flight=in_flight)


def context(route="/api/chat", body=None, *, model="m", cfg=None, session=None, num_ctx=None):
    body = body if body is not None else {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return PlacementContext(route=route, route_class=ROUTE_CLASS[route], model=model, body=body,
                            estimated_tokens=1, settings=cfg or settings(), num_ctx=num_ctx,
                            session_header=session, judged=route in JUDGED_ROUTES)


def nodes(ranking):
    return [(c.node, c.backend) for c in ranking]


@pytest.fixture(scope="session")
def build():
    """The builders above, as one namespace (session-scoped, so hypothesis may share it)."""
    return SimpleNamespace(settings=settings, node=node, local=local, peer=peer, context=context, nodes=nodes)

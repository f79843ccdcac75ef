"""openapi.py: the API document lists exactly the routes the relay serves (routes.py), each with
its methods."""

from __future__ import annotations

from palmyra_serve.sidecar.core.routes import RELAYED


def test_the_api_document_lists_exactly_the_relayed_routes():
    from palmyra_serve.sidecar.openapi import PROXIED_PATHS

    assert set(PROXIED_PATHS) == set(RELAYED)
    for path, route in RELAYED.items():
        assert {m.upper() for m in PROXIED_PATHS[path]} == set(route.methods)

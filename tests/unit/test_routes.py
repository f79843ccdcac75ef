"""routes.py: the relayed routes are exact paths, each with upper-case methods, apart from the
control app's paths; paths it does not relay (/v1/responses, /invocations, ...) are in neither."""

from __future__ import annotations

from palmyra_serve.sidecar.core.routes import CONTROL_PATHS, RELAYED


def test_relayed_routes_are_exact_paths_apart_from_the_control_app():
    for path, route in RELAYED.items():
        assert route.target == path.encode() and path not in CONTROL_PATHS
        assert route.methods and all(m.isupper() for m in route.methods)
    for path in ("/v1/chat/completions/batch", "/v1/responses/resp_1", "/v1/messages/count_tokens", "/invocations"):
        assert path not in RELAYED and path not in CONTROL_PATHS

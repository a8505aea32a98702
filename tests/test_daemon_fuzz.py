"""OpenAPI fuzzing (schemathesis) of every route on a real loopback server: no 5xx, responses
match the document, and every error is a clear JSON body. Bounded to stay fast."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)
from support.daemon import Daemon, auth, running_daemon

from thoughtgate.server.openapi import build_openapi
from thoughtgate.server.routes import all_endpoints
from thoughtgate.server.routes.meta import package_version


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon() as d:
        yield d


# The document the daemon serves at /openapi.json (checked to be identical below).
DOCUMENT = build_openapi(all_endpoints(), version=package_version())
# A body over server.max_body_bytes is rejected with 413 before it is parsed: also a rejection.
CONFIG = schemathesis.Config.from_dict(
    {
        "checks": {
            "negative_data_rejection": {
                "expected-statuses": [400, 401, 403, 404, 405, 409, 413, 415, 422]
            }
        }
    }
)
schema = schemathesis.openapi.from_dict(DOCUMENT, config=CONFIG)


def test_the_fuzzed_document_is_the_served_one(daemon: Daemon) -> None:
    assert daemon.get("/openapi.json").json() == DOCUMENT


def _clear_json_error(response: Any) -> None:
    if response.status_code < 400:
        return
    assert response.headers.get("content-type", [""])[0].startswith("application/json")
    body = response.json()
    assert isinstance(body["error"]["code"], str) and body["error"]["code"]
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


@schema.parametrize()
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_every_route_answers_without_5xx_and_errors_are_json(case: Any, daemon: Daemon) -> None:
    response = case.call(base_url=daemon.base_url, headers=auth(daemon.keys["owner"]), timeout=10)
    case.validate_response(
        response,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
            negative_data_rejection,
            ignored_auth,
        ],
        transport_kwargs={"base_url": daemon.base_url, "headers": auth(daemon.keys["owner"])},
    )
    _clear_json_error(response)

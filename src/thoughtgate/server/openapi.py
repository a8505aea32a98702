"""The OpenAPI 3.1 document, assembled from the endpoint declarations and the pydantic models."""

from __future__ import annotations

import re
from typing import Any

from pydantic import TypeAdapter

from thoughtgate.events.catalogue import READER_NOTE, catalogue_schema, reader_schema
from thoughtgate.server.api import MAX_INT, Endpoint
from thoughtgate.server.models import REQUEST_MODELS, RESPONSE_MODELS

__all__ = ["build_openapi"]

_REF = "#/components/schemas/{model}"
_STATUS_TEXT = {
    200: "OK",
    201: "Created",
    202: "Accepted: the run executes in the background",
    204: "No Content",
    400: "Bad request (invalid JSON, unknown model, unknown tool, ...)",
    401: "Missing or invalid API key or ticket",
    403: "Your role does not allow this (the body names no data)",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict with the run's state",
    413: "Request body larger than server.max_body_bytes",
    422: "The request does not match the schema",
    500: "Internal error",
    503: "Shutting down, or the event store is unavailable",
}


def _ref(model: type) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json_content(model: type | None) -> dict[str, Any]:
    schema: dict[str, Any] = _ref(model) if model is not None else {"type": "object"}
    return {"application/json": {"schema": schema}}


def _parameters(endpoint: Endpoint) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"{(\w+)}", endpoint.path)
    ]
    for p in endpoint.params:
        schema: dict[str, Any] = {"type": p.type}
        if p.minimum is not None:
            schema["minimum"] = p.minimum
        if p.maximum is not None:
            schema["maximum"] = p.maximum
        elif p.type == "integer":
            schema["maximum"] = MAX_INT
        params.append(
            {
                "name": p.name,
                "in": p.location,
                "required": p.required,
                "description": p.description,
                "schema": schema,
            }
        )
    return params


def _responses(endpoint: Endpoint, error: dict[str, Any]) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": _STATUS_TEXT.get(endpoint.status, "OK")}
    if endpoint.media_type == "text/event-stream":
        ok["content"] = {
            "text/event-stream": {
                "schema": {"type": "string", "description": "id: <seq>\\ndata: <event JSON>"}
            }
        }
    else:
        ok["content"] = _json_content(endpoint.response)
    responses: dict[str, Any] = {str(endpoint.status): ok}
    for code in endpoint.answers:
        described = _STATUS_TEXT.get(code, "Answered")
        responses[str(code)] = {"description": described, "content": ok["content"]}
    codes = set(endpoint.errors)
    if endpoint.auth != "none":
        codes |= {401, 403}
    for code in sorted(codes):
        if code == 204:
            responses["204"] = {"description": _STATUS_TEXT[204]}
        else:
            responses[str(code)] = {"description": _STATUS_TEXT.get(code, "Error"), **error}
    responses["default"] = {"description": "Any other error", **error}
    return responses


def _operation(endpoint: Endpoint, error: dict[str, Any]) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": endpoint.operation_id,
        "summary": endpoint.summary,
        "parameters": _parameters(endpoint),
        "responses": _responses(endpoint, error),
    }
    if endpoint.description:
        op["description"] = endpoint.description
    if endpoint.auth == "bearer":
        role = endpoint.role.label if endpoint.role else "viewer"
        op["security"] = [{"bearer": []}]
        op["description"] = f"Requires role {role} or above. {op.get('description', '')}".strip()
    else:
        op["security"] = []
    if endpoint.body is not None:
        op["requestBody"] = {"required": True, "content": _json_content(endpoint.body)}
    return op


def build_openapi(endpoints: tuple[Endpoint, ...], *, version: str) -> dict[str, Any]:
    """Every endpoint, every request and response model, the event catalogue, the bearer scheme.

    Responses are described as readers receive them (``reader_schema``): a field whose class a
    reader may not see is not required, a carrier is a presence marker.
    """
    inputs: list[tuple[type, Any, TypeAdapter[Any]]] = [
        (m, "validation", TypeAdapter(m)) for m in REQUEST_MODELS
    ] + [(m, "serialization", TypeAdapter(m)) for m in RESPONSE_MODELS]
    _, defs = TypeAdapter.json_schemas(inputs, ref_template=_REF)
    schemas: dict[str, Any] = dict(defs.get("$defs", {}))
    events = catalogue_schema(ref_template=_REF)
    schemas.update(events.pop("$defs"))
    schemas["Event"] = events
    error = {"content": _json_content(RESPONSE_MODELS[0])}
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(endpoint, error)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "thoughtgate daemon",
            "version": version,
            "description": "Runs LLM agent work and governs who may see the model's reasoning. "
            f"Roles: viewer < member < developer < admin < owner. {READER_NOTE}",
        },
        "paths": paths,
        "components": {
            "schemas": reader_schema(schemas),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "an API key"}
            },
        },
    }

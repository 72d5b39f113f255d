"""The OpenAPI 3.0 description of Serval's REST routes, served at GET /v2/openapi.json."""

from __future__ import annotations

from typing import Any

from serval import __version__
from serval.protocol.dtypes import V2_DATATYPES

_ERROR = {"$ref": "#/components/schemas/Error"}
_MODEL = {"name": "model", "in": "path", "required": True,
          "schema": {"type": "string", "minLength": 1}}
_VERSION = {"name": "version", "in": "path", "required": True,
            "schema": {"type": "string", "pattern": "^[0-9]+$"}}


def openapi_document() -> dict[str, Any]:
    """The whole description; every path here is a route of server/http/app.py."""
    paths: dict[str, Any] = {
        "/v2": {"get": _get("Server metadata", "ServerMetadata", [])},
        "/v2/health/live": {"get": _probe("Liveness")},
        "/v2/health/ready": {"get": _readiness()},
        "/v2/models/stats": {"get": _get("Statistics of every model", "Statistics", [])},
        "/v2/repository/index": {"post": _repository_index()},
        "/v2/repository/models/{model}/load": {"post": _repository_action("Load or reload")},
        "/v2/repository/models/{model}/unload": {"post": _repository_action("Unload")},
        "/v2/openapi.json": {"get": _get("This description", "Object", [])},
        "/v2/logging": _settings("Log settings (Triton's logging extension)", "LogSettings",
                                 []),
        "/v2/trace/setting": _settings("Trace settings (Triton's trace extension)",
                                       "TraceSettings", []),
        "/v2/models/{model}/trace/setting": _settings(
            "A model's trace settings (a POST without settings clears them)", "TraceSettings",
            [_MODEL]),
        "/metrics": {"get": _metrics()},
    }
    for prefix, params in (("/v2/models/{model}", [_MODEL]),
                           ("/v2/models/{model}/versions/{version}", [_MODEL, _VERSION])):
        paths[prefix] = {"get": _get("Model metadata", "ModelMetadata", params)}
        paths[prefix + "/ready"] = {"get": _model_readiness(params)}
        paths[prefix + "/config"] = {"get": _get("Model configuration", "Object", params)}
        paths[prefix + "/stats"] = {"get": _get("Model statistics", "Statistics", params)}
        paths[prefix + "/infer"] = {"post": _infer(params)}
        paths[prefix + "/generate"] = {"post": _generate(params, stream=False)}
        paths[prefix + "/generate_stream"] = {"post": _generate(params, stream=True)}
    return {
        "openapi": "3.0.3",
        "info": {"title": "Serval KServe v2 REST API", "version": __version__,
                 "description": "The Open Inference Protocol (KServe v2) with Triton's "
                                "statistics, configuration, repository, logging, trace and "
                                "generate extensions."},
        "paths": paths,
        "components": {"schemas": _schemas(),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def _errors(*statuses: int) -> dict[str, Any]:
    words = {400: "Invalid request", 401: "Missing or unknown token", 403: "Not allowed",
             404: "No such model or route", 405: "Method not allowed", 413: "Body too large",
             429: "Overloaded: retry after Retry-After seconds",
             500: "The engine failed (request id in the message)",
             503: "Model not ready or server shutting down",
             504: "Deadline passed before compute"}
    return {str(s): {"description": words[s],
                     "content": {"application/json": {"schema": _ERROR}}} for s in statuses}


def _json_response(schema: str, description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}


def _get(summary: str, schema: str, params: list[dict[str, Any]],
         *extra_ok: int) -> dict[str, Any]:
    responses = {"200": _json_response(schema)}
    for status in extra_ok:
        responses[str(status)] = _json_response(schema, "Not ready")
    if params:
        responses.update(_errors(400, 401, 403, 404, 503))
    else:
        responses.update(_errors(401, 403))
    return {"summary": summary, "parameters": params, "responses": responses,
            "security": [{"bearer": []}, {}]}


def _probe(summary: str) -> dict[str, Any]:
    empty = {"content": {"text/plain": {"schema": {"type": "string", "maxLength": 0}}}}
    return {"summary": summary, "responses": {"200": {"description": "yes", **empty},
                                              "503": {"description": "no", **empty}}}


def _readiness() -> dict[str, Any]:
    """Strict readiness (the default): 503, with why, while a model that should serve does not."""
    probe = _probe("Readiness: 200 while started and (strict readiness) every model that "
                   "should serve is READY")
    probe["responses"]["503"] = {"description": "no: starting, draining, or models that "
                                 "should serve do not", "content": {
                                     "application/json": {"schema": _ERROR}}}
    return probe


def _model_readiness(params: list[dict[str, Any]]) -> dict[str, Any]:
    """200 ready, 400 not ready (Triton's status, a 4xx as KServe asks), unknown ones too."""
    operation = _get("Model readiness", "ModelReady", params)
    operation["responses"]["400"] = _json_response("ModelReady", "Not ready, or not known")
    return operation


def _metrics() -> dict[str, Any]:
    text = {"text/plain": {"schema": {"type": "string"}}}
    return {"summary": "Prometheus metrics", "security": [{"bearer": []}, {}],
            "responses": {"200": {"description": "Prometheus text", "content": text},
                          **_errors(401, 403)}}


def _infer(params: list[dict[str, Any]]) -> dict[str, Any]:
    headers = [
        {"name": "Serval-Timeout-Ms", "in": "header", "required": False,
         "schema": {"type": "number", "exclusiveMinimum": True, "minimum": 0}},
    ]
    return {
        "summary": "Inference (JSON; binary tensors with Inference-Header-Content-Length)",
        "parameters": [*params, *headers], "security": [{"bearer": []}, {}],
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/InferRequest"}}}},
        "responses": {"200": _json_response("InferResponse"),
                      **_errors(400, 401, 403, 404, 413, 429, 500, 503, 504)},
    }


def _repository_index() -> dict[str, Any]:
    body = {"type": "object", "properties": {"ready": {"type": "boolean"}}}
    return {"summary": "Every model version with its state", "security": [{"bearer": []}, {}],
            "requestBody": {"required": False,
                            "content": {"application/json": {"schema": body}}},
            "responses": {"200": _json_response("RepositoryIndex"), **_errors(400, 401, 403)}}


def _repository_action(verb: str) -> dict[str, Any]:
    body = {"type": "object", "properties": {"parameters": {
        "type": "object", "properties": {"config": {
            "type": "string", "description": "config.yaml settings as a JSON object"}}}}}
    return {"summary": f"{verb} a model (admin; off unless the repository API is enabled)",
            "parameters": [_MODEL], "security": [{"bearer": []}, {}],
            "requestBody": {"required": False,
                            "content": {"application/json": {"schema": body}}},
            "responses": {"200": {"description": "Done",
                                  "content": {"text/plain": {"schema": {"type": "string"}}}},
                          **_errors(400, 401, 403, 404, 503)}}


def _generate(params: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    """Triton's generate extension: input fields in, output fields out (or as events)."""
    fields = {"type": "object", "properties": {"text_input": {"type": "string"},
                                               "parameters": {"type": "object"}}}
    answer: dict[str, Any] = {"description": "OK", "content": {
        "text/event-stream": {"schema": {"type": "string"}}}} if stream else _json_response(
            "Object")
    return {"summary": "Generate: one event per response (SSE)" if stream else
            "Generate: the outputs as fields", "parameters": params,
            "security": [{"bearer": []}, {}],
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": fields}}},
            "responses": {"200": answer, **_errors(400, 401, 403, 404, 413, 429, 500, 503, 504)}}


def _settings(summary: str, schema: str, params: list[dict[str, Any]]) -> dict[str, Any]:
    """GET reads the settings; POST changes those it names (admin) and answers them all."""
    errors = (400, 401, 403, 404) if params else (400, 401, 403)
    body = {"$ref": f"#/components/schemas/{schema}"}
    return {"get": {"summary": summary, "parameters": params,
                    "security": [{"bearer": []}, {}],
                    "responses": {"200": _json_response(schema), **_errors(*errors)}},
            "post": {"summary": f"Change: {summary}", "parameters": params,
                     "security": [{"bearer": []}, {}],
                     "requestBody": {"required": False,
                                     "content": {"application/json": {"schema": body}}},
                     "responses": {"200": _json_response(schema), **_errors(*errors)}}}


def _schemas() -> dict[str, Any]:
    string_list = {"type": "array", "items": {"type": "string"}}
    tensor_properties: dict[str, Any] = {
        "name": {"type": "string"}, "datatype": {"type": "string", "enum": list(V2_DATATYPES)},
        "shape": {"type": "array", "items": {"type": "integer"}}}
    tensor_meta = {"type": "object", "required": ["name", "datatype", "shape"], "properties": {
        "name": {"type": "string"}, "datatype": {"type": "string", "enum": list(V2_DATATYPES)},
        "shape": {"type": "array", "items": {"type": "integer"}}}}
    data = {"type": "array", "items": {}}
    return {
        "Error": {"type": "object", "required": ["error"],
                  "properties": {"error": {"type": "string"}}},
        "Object": {"type": "object"},
        "LogSettings": {"type": "object", "properties": {
            "log_file": {"type": "string"}, "log_info": {"type": "boolean"},
            "log_warnings": {"type": "boolean"}, "log_errors": {"type": "boolean"},
            "log_verbose_level": {"type": "integer", "minimum": 0, "maximum": 2**32 - 1},
            "log_format": {"type": "string", "enum": ["default", "ISO8601"]}}},
        "TraceSettings": {"type": "object", "additionalProperties": {
            "oneOf": [{"type": "string"}, string_list]}, "properties": {
            "trace_level": {"type": "array",
                            "items": {"type": "string", "enum": ["OFF", "TIMESTAMPS"]}},
            "trace_rate": {"type": "string"}, "trace_count": {"type": "string"},
            "log_frequency": {"type": "string"}, "trace_file": {"type": "string"},
            "trace_mode": {"type": "string", "enum": ["triton"]}}},
        "ServerMetadata": {"type": "object", "required": ["name", "version", "extensions"],
                           "properties": {"name": {"type": "string"},
                                          "version": {"type": "string"},
                                          "extensions": string_list}},
        "ModelMetadata": {"type": "object", "required": ["name", "platform", "inputs", "outputs"],
                          "properties": {"name": {"type": "string"}, "versions": string_list,
                                         "platform": {"type": "string"},
                                         "inputs": {"type": "array", "items": tensor_meta},
                                         "outputs": {"type": "array", "items": tensor_meta}}},
        "ModelReady": {"type": "object", "required": ["name", "ready"],
                       "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}}},
        "Statistics": {"type": "object", "required": ["model_stats"],
                       "properties": {"model_stats": {"type": "array",
                                                      "items": {"type": "object"}}}},
        "RepositoryIndex": {"type": "array", "items": {
            "type": "object", "required": ["name", "version", "state"],
            "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                           "state": {"type": "string"}, "reason": {"type": "string"}}}},
        "InferRequest": {"type": "object", "required": ["inputs"], "properties": {
            "id": {"type": "string"}, "parameters": {"type": "object"},
            "inputs": {"type": "array", "items": {
                "type": "object", "required": ["name", "shape", "datatype", "data"],
                "properties": {**tensor_properties, "parameters": {"type": "object"},
                               "data": data}}},
            "outputs": {"type": "array", "items": {
                "type": "object", "required": ["name"],
                "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}}}},
        }},
        "InferResponse": {"type": "object", "required": ["model_name", "outputs"], "properties": {
            "model_name": {"type": "string"}, "model_version": {"type": "string"},
            "id": {"type": "string"}, "parameters": {"type": "object"},
            "outputs": {"type": "array", "items": {
                "type": "object", "required": ["name", "shape", "datatype"],
                "properties": {**tensor_properties, "parameters": {"type": "object"},
                               "data": data}}},
        }},
    }

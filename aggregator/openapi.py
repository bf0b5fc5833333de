"""OpenAPI 3.0 description of the aggregator's HTTP API (docs/api.md), served at
/api/v1/openapi.json and kept in docs/openapi.json (a test checks the copy is current).
tests/e2e/test_openapi.py fuzzes a live aggregator against it with schemathesis.

Response schemas name the fields clients rely on and leave objects open: adding a field is
not a breaking change, removing or retyping one is.
"""
from __future__ import annotations

from typing import Any

from c4 import __version__


def _obj(required: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "required": sorted(required), "properties": required, **extra}


NUM = {"type": "number"}
INT = {"type": "integer"}
STR = {"type": "string"}
BOOL = {"type": "boolean"}
NSTR = {"type": "string", "nullable": True}
NNUM = {"type": "number", "nullable": True}
STRS = {"type": "array", "items": STR}
ERROR = _obj({"error": STR})
COUNTS = {"type": "object", "additionalProperties": INT}


def _json(schema: dict[str, Any], what: str) -> dict[str, Any]:
    return {"description": what, "content": {"application/json": {"schema": schema}}}


def _err(what: str) -> dict[str, Any]:
    return _json({"$ref": "#/components/schemas/Error"}, what)


HOST = _obj({
    "name": STR, "status": {"type": "string", "enum": ["up", "silent"]},
    "agent_version": NSTR, "last_seen_age_s": NUM, "last_seen": NUM, "interval": NUM,
    "reports": INT, "nics": INT, "ports": INT, "ports_active": INT,
    "collectors_ok": STRS, "collectors_down": STRS,
    "rates": {"type": "object", "additionalProperties": NUM},
    "seq": _obj({"contiguous": INT, "lost": INT}),
})
HOST_DETAIL = {"allOf": [{"$ref": "#/components/schemas/Host"}, _obj({
    "first_seen": NUM, "last_agent_ts": NUM, "hello": {"type": "object"},
    "report": {"type": "object"}, "events": {"type": "array", "items": {"type": "object"}},
    "rejected": INT})]}
INCIDENT = _obj({
    "id": INT, "class": STR, "state": {"type": "string",
                                       "enum": ["open", "mitigated", "resolved"]},
    "job": NSTR, "comm": NSTR, "summary": STR,
    "suspects": {"type": "array", "items": {"type": "object"}},
    "evidence": {"type": "object"}, "first_symptom": NUM, "detected": NUM,
    "localised": NNUM, "resolved": NNUM, "updated": NUM,
    "actions": {"type": "array", "items": {"type": "object"}},
})
HEALTH = _obj({"ok": BOOL, "uptime_s": NUM, "hosts": INT,
               "store": _obj({"writable": BOOL, "error": NSTR, "since": NNUM})})
STATS = _obj({"accepted": COUNTS, "rejected": COUNTS, "duplicates": INT, "store_errors": INT,
              "errors": COUNTS, "hosts": INT, "hosts_silent": INT})


def spec() -> dict[str, Any]:
    get = "get"
    return {
        "openapi": "3.0.3",
        "info": {"title": "c4 aggregator API", "version": __version__,
                 "description": "Reads are open; state changes are POST with a bearer token "
                                "(docs/api.md, docs/security.md)."},
        "paths": {
            "/healthz": {get: {
                "summary": "liveness and whether the store can write",
                "responses": {"200": _json(HEALTH, "healthy"),
                              "503": _json(HEALTH, "the database cannot be written")}}},
            "/api/v1/hosts": {get: {
                "summary": "every known host",
                "responses": {"200": _json(_obj({"hosts": {
                    "type": "array", "items": {"$ref": "#/components/schemas/Host"}}}),
                    "hosts by name")}}},
            "/api/v1/hosts/{name}": {get: {
                "summary": "one host, with its latest hello, report and events",
                "parameters": [{"name": "name", "in": "path", "required": True,
                                "schema": STR}],
                "responses": {"200": _json(HOST_DETAIL, "the host"),
                              "404": _err("no such host")}}},
            "/api/v1/stats": {get: {
                "summary": "ingest counters",
                "responses": {"200": _json(STATS, "counters")}}},
            "/api/v1/incidents": {get: {
                "summary": "incidents, newest first",
                "parameters": [{"name": "state", "in": "query", "required": False,
                                "schema": {"type": "string",
                                           "enum": ["open", "mitigated", "resolved"]}}],
                "responses": {"200": _json(_obj({"incidents": {
                    "type": "array", "items": {"$ref": "#/components/schemas/Incident"}}}),
                    "incidents"), "400": _err("bad state")}}},
            "/api/v1/incidents/{id}": {get: {
                "summary": "one incident",
                "parameters": [{"name": "id", "in": "path", "required": True,
                                "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"}}],
                "responses": {"200": _json({"$ref": "#/components/schemas/Incident"},
                                           "the incident"),
                              "400": _err("not a decimal id below 10^18"),
                              "404": _err("no such incident")}}},
            "/api/v1/jobs": {get: {
                "summary": "jobs seen in collective and flow data",
                "responses": {"200": _json(_obj({"jobs": {
                    "type": "array", "items": {"type": "object"}}}), "jobs")}}},
            "/api/v1/plan": {get: {
                "summary": "C4P: current and proposed source-port plan",
                "responses": {"200": _json({"type": "object"}, "the plan view"),
                              "404": _err("planning is off")}}},
            "/api/v1/plan/apply": {"post": {
                "summary": "C4P: apply the proposed plan (needs the API token)",
                "security": [{"bearer": []}],
                "requestBody": {"required": False, "content": {"application/json": {
                    "schema": {"type": "object"}}}},
                "responses": {"200": _json({"type": "object"}, "what was sent"),
                              "400": _err("bad body"),
                              "401": _err("missing or wrong token"),
                              "403": _err("state changes are off (no api_token_file)"),
                              "404": _err("planning is off")}}},
            "/api/v1/openapi.json": {get: {
                "summary": "this document",
                "responses": {"200": _json({"type": "object"}, "OpenAPI 3.0")}}},
            "/metrics": {get: {
                "summary": "Prometheus exposition (docs/api.md)",
                "responses": {"200": {"description": "text format 0.0.4", "content": {
                    "text/plain": {"schema": STR}}}}}},
        },
        "components": {
            "schemas": {"Host": HOST, "HostDetail": HOST_DETAIL, "Incident": INCIDENT,
                        "Error": ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


if __name__ == "__main__":  # python -m c4.aggregator.openapi > docs/openapi.json
    import json

    print(json.dumps(spec(), indent=2, sort_keys=True))

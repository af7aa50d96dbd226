"""Schemathesis hooks of gateway/tests/schemathesis.rs.

Requests name the one model the test gateway serves (`TIDAL_ST_MODEL`): the document allows
any model id, and generated ids would all end in 404 `model_not_found`, so no body the
document allows would reach a worker. Invalid ids are still generated for negative tests.

Each request gets an `Idempotency-Key` of its own where it sends a valid one: generated
requests repeat a few short keys, and a repeated key is answered from the first request
(409 once that one was delivered, 422 for another body), so hardly any body would reach a
worker. Invalid keys are left as generated.
"""

import itertools
import os
import re

import schemathesis

VALID_KEY = re.compile(r"[\x21-\x7e]{1,255}")
SERIAL = itertools.count()


@schemathesis.hook
def before_load_schema(context, raw_schema):
    model = os.environ["TIDAL_ST_MODEL"]
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        raw_schema["components"]["schemas"][name]["properties"]["model"]["enum"] = [model]


@schemathesis.hook
def before_call(context, case, kwargs):
    headers = case.headers or {}
    for name, value in headers.items():
        if name.lower() == "idempotency-key" and isinstance(value, str) and VALID_KEY.fullmatch(value):
            headers[name] = f"{value[:240]}-{next(SERIAL)}"

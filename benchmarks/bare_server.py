"""The baseline for benchmarks.server: an aiohttp TLS server that only says "allowed".

It reads and decodes the AdmissionReview like the webhook does (orjson), then answers allowed
with the uid, encoded as the webhook encodes its answers (orjson, bytes, no ``json_response``),
so the difference to the webhook is the decision itself, not a slower codec in the baseline.

Run: python -m benchmarks.bare_server CERT_DIR PORT
"""

from __future__ import annotations

import ssl
import sys

import orjson
from aiohttp import web

_JSON = {"Content-Type": "application/json; charset=utf-8"}


async def allow(request: web.Request) -> web.Response:
    body = orjson.loads(await request.read())
    uid = body["request"]["uid"]
    answer = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": True},
    }
    return web.Response(body=orjson.dumps(answer), headers=_JSON)


async def livez(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


def main() -> None:
    cert_dir, port = sys.argv[1], int(sys.argv[2])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(f"{cert_dir}/tls.crt", f"{cert_dir}/tls.key")
    app = web.Application(client_max_size=7 * 1024 * 1024)
    app.router.add_post("/validate", allow)
    app.router.add_post("/mutate", allow)
    app.router.add_get("/livez", livez)
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=context, print=None, access_log=None)


if __name__ == "__main__":
    main()

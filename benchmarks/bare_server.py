"""The baseline for benchmarks.server: an aiohttp TLS server that only says "allowed".

It reads and decodes the AdmissionReview like the webhook does, then answers allowed with the
uid, so the difference to the webhook is the decision itself.

Run: python -m benchmarks.bare_server CERT_DIR PORT
"""

from __future__ import annotations

import json
import ssl
import sys

from aiohttp import web


async def allow(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    uid = body["request"]["uid"]
    answer = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": True},
    }
    return web.json_response(answer)


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

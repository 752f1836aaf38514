#!/usr/bin/env python3
"""A webhook receiver that verifies the product's deliveries with the
Standard Webhooks reference library (pip install standardwebhooks), as a
shop would. The tests run it as their endpoint (tests/tests/webhooks_out.rs).

Usage: webhook_receiver.py --port P --secret whsec_... [--path /hook]
         [--fail-share F] [--delay S] [--redirect URL]

Each delivery that verifies is answered 204 and printed as one JSON line:
{"id", "type", "reservation_id", "attempt_at"}. One that does not verify
is answered 401 and printed with "rejected". The test knobs:
  --fail-share F  the first delivery of that share of events (chosen by a
                  hash of the event id) is answered 500 (a flaky endpoint)
  --delay S       wait S seconds before answering (a slow endpoint)
  --redirect URL  answer 302 to URL instead (a redirect must not be followed)

A shop's receiver dedupes by the webhook-id header (the event id): a
delivery can come twice (at least once).
"""

import argparse
import hashlib
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

args = None
hook = None
failed_once = set()
lock = threading.Lock()


def emit(record):
    with lock:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


class Handler(BaseHTTPRequestHandler):
    # Keep-alive: the sender reuses its connections.
    protocol_version = "HTTP/1.1"

    def log_message(self, *_):
        pass

    def answer(self, code, headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if args.delay:
            time.sleep(args.delay)
        if args.redirect:
            emit({"redirected": self.headers.get("webhook-id")})
            return self.answer(302, [("location", args.redirect)])
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            event = hook.verify(body, headers)
        except WebhookVerificationError as e:
            emit({"rejected": str(e), "id": headers.get("webhook-id")})
            return self.answer(401)
        event_id = headers["webhook-id"]
        share = int(hashlib.sha256(event_id.encode()).hexdigest()[:8], 16) / 2**32
        with lock:
            fail = share < args.fail_share and event_id not in failed_once
            if fail:
                failed_once.add(event_id)
        if fail:
            emit({"failed_on_purpose": event_id})
            return self.answer(500)
        emit({
            "id": event_id,
            "type": event["type"],
            "reservation_id": (event.get("data") or {}).get("reservation_id"),
            "attempt_at": headers["webhook-timestamp"],
        })
        self.answer(204)


def main():
    global args, hook
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--secret", required=True)
    p.add_argument("--fail-share", type=float, default=0.0)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--redirect")
    args = p.parse_args()
    hook = Webhook(args.secret)
    # The default listen backlog (5) drops connections in a burst, and a
    # dropped SYN costs the sender a 1 s retransmit.
    ThreadingHTTPServer.request_queue_size = 256
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    emit({"listening": args.port})
    server.serve_forever()


if __name__ == "__main__":
    main()

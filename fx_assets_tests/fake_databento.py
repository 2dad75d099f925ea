"""A local stand-in for Databento's historical API (stdlib HTTP on 127.0.0.1, a free port).

It answers the endpoints the official client calls for a download (metadata cost / size /
count, ``timeseries.get_range``, batch submit / details / files / per-file download with
``Range``) with real Databento fixture files, checks HTTP Basic auth, and records every
request. Failures are injected per path: ``fail[path] = (status, json_body)`` answers once with
that status; ``drop[path] = fraction`` sends a full ``Content-Length`` but only that fraction of
the body, then closes the connection (an interruption mid-body); ``truncate[path] = fraction``
sends a shorter body with a matching length (a server that cuts a stream "cleanly"). The server refuses requests
beyond ``max_requests`` and shuts itself down after ``lifetime_s`` seconds, so a test that loops
or hangs cannot keep it alive.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


class FakeDatabento:
    def __init__(
        self,
        bodies: dict[str, bytes],
        *,
        key: str = "db-test",
        cost_usd: float = 1.25,
        billable_bytes: int = 1_234_567,
        records: int = 4,
        max_requests: int = 200,
        lifetime_s: float = 120.0,
    ) -> None:
        self.bodies = bodies  # schema -> DBN body
        self.key = key
        self.cost_usd, self.billable_bytes, self.records = cost_usd, billable_bytes, records
        self.requests: list[dict[str, Any]] = []
        self.fail: dict[str, tuple] = {}
        self.drop: dict[str, float] = {}
        self.truncate: dict[str, float] = {}
        self.max_requests = max_requests
        self.jobs: dict[str, dict[str, Any]] = {}
        self.job_polls_until_done = 1
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._timer = threading.Timer(lifetime_s, self.httpd.shutdown)
        self._timer.daemon = True

    def __enter__(self) -> FakeDatabento:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()

    def paths(self, method: str | None = None) -> list[str]:
        return [r["path"] for r in self.requests if method is None or r["method"] == method]

    # --- batch ----------------------------------------------------------------------------

    def submit(self, form: dict[str, str]) -> dict[str, Any]:
        job_id = f"GLBX-20250101-FAKEJOB{len(self.jobs):03d}"
        fn = f"glbx-mdp3-{form['start'].replace('-', '')}-{form['end'].replace('-', '')}.{form['schema']}.dbn.zst"
        self.jobs[job_id] = {
            "id": job_id,
            "form": form,
            "polls": 0,
            "file": fn,
            "body": self.bodies[form["schema"]],
        }
        return {**form, "id": job_id, "state": "received"}

    def details(self, job_id: str) -> dict[str, Any]:
        job = self.jobs[job_id]
        job["polls"] += 1
        state = "done" if job["polls"] > self.job_polls_until_done else "processing"
        return {"id": job_id, "state": state}

    def files(self, job_id: str) -> list[dict[str, Any]]:
        job = self.jobs[job_id]
        b = job["body"]
        meta = json.dumps({"job_id": job_id}).encode()
        return [
            {
                "filename": "metadata.json",
                "size": len(meta),
                "hash": "sha256:" + hashlib.sha256(meta).hexdigest(),
                "urls": {"https": f"{self.url}/v0/batch/download/U/{job_id}/metadata.json"},
            },
            {
                "filename": job["file"],
                "size": len(b),
                "hash": "sha256:" + hashlib.sha256(b).hexdigest(),
                "urls": {"https": f"{self.url}/v0/batch/download/U/{job_id}/{job['file']}"},
            },
        ]


def _handler(fake: FakeDatabento) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.route("GET")

        def do_POST(self) -> None:
            self.route("POST")

        def reply(
            self, status: int, body: Any, ctype: str = "application/json", headers=(), cut=None
        ) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            for k, v in [("Content-Type", ctype), ("Content-Length", str(len(data))), *headers]:
                self.send_header(k, v)
            self.end_headers()
            if cut is None:
                self.wfile.write(data)
                return
            self.wfile.write(data[: max(1, int(len(data) * cut))])
            self.wfile.flush()
            self.close_connection = True  # the rest of the body never comes

        def route(self, method: str) -> None:
            u = urlsplit(self.path)
            n = int(self.headers.get("Content-Length") or 0)
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(n).decode()).items()}
            query = {k: v[0] for k, v in parse_qs(u.query).items()}
            with fake._lock:
                fake.requests.append(
                    {
                        "method": method,
                        "path": u.path,
                        "form": form,
                        "query": query,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                    }
                )
                over = len(fake.requests) > fake.max_requests
            if over:
                return self.reply(500, {"detail": "fake server: request budget exhausted"})
            auth = "Basic " + base64.b64encode(f"{fake.key}:".encode()).decode()
            if self.headers.get("Authorization") != auth:
                return self.reply(401, {"detail": "Authentication failed."})
            if u.path in fake.fail:
                status, body = fake.fail.pop(u.path)
                return self.reply(status, body)
            cut = fake.drop.pop(u.path, None)
            name, octet = u.path.removeprefix("/v0/"), "application/octet-stream"
            if name == "metadata.get_cost":
                return self.reply(200, fake.cost_usd)
            if name == "metadata.get_billable_size":
                return self.reply(200, fake.billable_bytes)
            if name == "metadata.get_record_count":
                return self.reply(200, fake.records)
            if name == "timeseries.get_range":
                body = fake.bodies[form["schema"]]
                if (frac := fake.truncate.pop(u.path, None)) is not None:
                    body = body[: int(len(body) * frac)]
                return self.reply(200, body, octet, cut=cut)
            if name == "batch.submit_job":
                return self.reply(200, fake.submit(form))
            if name == "batch.get_job_details":
                return self.reply(200, fake.details(query["job_id"]))
            if name == "batch.list_files":
                return self.reply(200, fake.files(query["job_id"]))
            if name.startswith("batch/download/"):
                job_id, fn = name.split("/")[-2:]
                job = fake.jobs[job_id]
                data = job["body"] if fn == job["file"] else json.dumps({"job_id": job_id}).encode()
                if rng := self.headers.get("Range"):
                    a, b = map(int, rng.removeprefix("bytes=").split("-"))
                    part = data[a : b + 1]
                    hdr = [("Content-Range", f"bytes {a}-{b}/{len(data)}")]
                    return self.reply(206, part, octet, hdr, cut=cut)
                return self.reply(200, data, octet, cut=cut)
            self.reply(404, {"detail": f"no route {method} {u.path}"})

    return Handler

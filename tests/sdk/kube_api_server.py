#!/usr/bin/env python3
"""A fake Kubernetes API server for the Kubernetes backend's tests (stdlib only, plain HTTP on
loopback). It answers the few endpoints the backend uses, with the API's shapes (Status objects on
errors, lists with items, label selectors on pods, streamed pod logs), checks every request's
bearer token, and records every request (method, path, headers, body) for the test to inspect.

The test drives it through /_test/... (no token needed):
  PUT  /_test/state     {"pods": {job: [pod, ...]}, "status": {job: status}, "logs": {"pod/container":
                         {"lines": [...], "hold_after": k}}, "errors": [{"method", "path", "status",
                         "reason", "message"}], "runtimes": {name: ClusterTrainingRuntime}} (merged)
  POST /_test/release   lets a held log stream send its remaining lines
  GET  /_test/requests  the recorded requests, in order
A held log (hold_after k) sends k lines, then waits (up to 30 s) for /_test/release, then sends the
rest and records whether the release came (so a test can prove lines arrived while streaming).

Usage: kube_api_server.py --token TOKEN [--max-seconds N]; prints {"port": N} when ready; exits
when stdin closes or after max-seconds.
"""
import argparse
import json
import re
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

LOCK = threading.Lock()
STATE = {"trainjobs": {}, "secrets": {}, "pods": {}, "status": {}, "logs": {}, "errors": [], "runtimes": {},
         "requests": [], "held_released": []}
RELEASE = threading.Event()
TOKEN = ""

TJ = re.compile(r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs(?:/([^/]+))?$")
CTR = re.compile(r"^/apis/trainer\.kubeflow\.org/v1alpha1/clustertrainingruntimes/([^/]+)$")
SECRET = re.compile(r"^/api/v1/namespaces/([^/]+)/secrets(?:/([^/]+))?$")
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")
LOG = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def status_obj(code, reason, message):
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def selector_matches(selector, labels):
    # "a=b,c in (x, y)": split on commas outside parentheses.
    parts, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for p in parts:
        p = p.strip()
        m = re.match(r"^(\S+)\s+in\s+\((.*)\)$", p)
        if m:
            values = [v.strip() for v in m.group(2).split(",")]
            if labels.get(m.group(1)) not in values:
                return False
        elif "=" in p:
            k, v = p.split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif p:
            return False
    return True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *args):
        pass

    def send_json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def fail(self, code, reason, message):
        self.send_json(code, status_obj(code, reason, message))

    def handle_any(self):
        url = urlparse(self.path)
        path = unquote(url.path)
        query = parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        if path.startswith("/_test/"):
            return self.control(path, body)
        with LOCK:
            STATE["requests"].append({"method": self.command, "path": self.path,
                                      "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
        if self.headers.get("Authorization") != "Bearer " + TOKEN:
            return self.fail(401, "Unauthorized", "Unauthorized")
        with LOCK:
            for e in STATE["errors"]:
                if e["method"] == self.command and path.startswith(e["path"]):
                    return self.fail(e["status"], e["reason"], e["message"])
        m = TJ.match(path)
        if m:
            return self.trainjobs(m.group(1), m.group(2), body)
        if path == "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes" and self.command == "GET":
            with LOCK:
                items = [dict((k, v) for k, v in rt.items() if k not in ("apiVersion", "kind"))
                         for rt in STATE["runtimes"].values()]
            return self.send_json(200, {"apiVersion": "trainer.kubeflow.org/v1alpha1",
                                        "kind": "ClusterTrainingRuntimeList", "items": items, "metadata": {}})
        if re.match(r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/[^/]+/trainingruntimes$", path):
            return self.fail(403, "Forbidden", "trainingruntimes.trainer.kubeflow.org is forbidden: User \"tester\" "
                                               "cannot list resource \"trainingruntimes\"")
        m = CTR.match(path)
        if m and self.command == "GET":
            with LOCK:
                rt = STATE["runtimes"].get(m.group(1))
            if rt is None:
                return self.fail(404, "NotFound", f'clustertrainingruntimes.trainer.kubeflow.org "{m.group(1)}" not found')
            return self.send_json(200, rt)
        m = SECRET.match(path)
        if m:
            return self.secrets(m.group(1), m.group(2), body)
        m = PODS.match(path)
        if m and self.command == "GET":
            selector = query.get("labelSelector", [""])[0]
            with LOCK:
                pods = [p for job in STATE["pods"].values() for p in job
                        if p["metadata"].get("namespace", m.group(1)) == m.group(1)
                        and selector_matches(selector, p["metadata"].get("labels", {}))]
            return self.send_json(200, {"kind": "PodList", "apiVersion": "v1", "items": pods})
        m = LOG.match(path)
        if m and self.command == "GET":
            return self.log(m.group(2), query)
        return self.fail(404, "NotFound", f"the server could not find the requested resource ({self.command} {path})")

    def trainjobs(self, ns, name, body):
        with LOCK:
            jobs = STATE["trainjobs"].setdefault(ns, {})
            if self.command == "POST" and name is None:
                n = body["metadata"]["name"]
                if n in jobs:
                    return self.fail(409, "AlreadyExists", f'trainjobs.trainer.kubeflow.org "{n}" already exists')
                obj = json.loads(json.dumps(body))
                obj["metadata"].update({"namespace": ns, "uid": str(uuid.uuid4()), "creationTimestamp": now(),
                                        "resourceVersion": "1"})
                jobs[n] = obj
                return self.send_json(201, obj)
            if self.command == "GET" and name is None:
                items = []
                for n, obj in jobs.items():
                    o = dict(obj)
                    if n in STATE["status"]:
                        o["status"] = STATE["status"][n]
                    items.append(o)
                return self.send_json(200, {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJobList",
                                            "items": items, "metadata": {}})
            if name not in jobs:
                return self.fail(404, "NotFound", f'trainjobs.trainer.kubeflow.org "{name}" not found')
            if self.command == "GET":
                o = dict(jobs[name])
                if name in STATE["status"]:
                    o["status"] = STATE["status"][name]
                return self.send_json(200, o)
            if self.command == "DELETE":
                del jobs[name]
                return self.send_json(200, status_obj(200, "", "") | {"status": "Success"})
        return self.fail(405, "MethodNotAllowed", "method not allowed")

    def secrets(self, ns, name, body):
        with LOCK:
            secrets = STATE["secrets"]
            if self.command == "POST" and name is None:
                n = body["metadata"]["name"]
                if n in secrets:
                    return self.fail(409, "AlreadyExists", f'secrets "{n}" already exists')
                secrets[n] = body
                return self.send_json(201, body)
            if name not in secrets:
                return self.fail(404, "NotFound", f'secrets "{name}" not found')
            if self.command == "PATCH":
                if self.headers.get("Content-Type") != "application/merge-patch+json":
                    return self.fail(415, "UnsupportedMediaType", "expected a merge patch")
                secrets[name]["metadata"].update(body.get("metadata", {}))
                return self.send_json(200, secrets[name])
            if self.command == "DELETE":
                del secrets[name]
                return self.send_json(200, status_obj(200, "", "") | {"status": "Success"})
        return self.fail(405, "MethodNotAllowed", "method not allowed")

    def log(self, pod, query):
        container = query.get("container", [""])[0]
        follow = query.get("follow", ["false"])[0] == "true"
        with LOCK:
            spec = STATE["logs"].get(pod + "/" + container)
        if spec is None:
            return self.fail(404, "NotFound", f'pods "{pod}" not found')
        lines = spec["lines"]
        hold = spec.get("hold_after") if follow else None
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        for i, line in enumerate(lines):
            if hold is not None and i == hold:
                released = RELEASE.wait(30)
                with LOCK:
                    STATE["held_released"].append(released)
            self.wfile.write((line + "\n").encode())
            self.wfile.flush()

    def control(self, path, body):
        if path == "/_test/state" and self.command == "PUT":
            with LOCK:
                for k, v in (body or {}).items():
                    if isinstance(STATE.get(k), dict):
                        STATE[k].update(v)
                    else:
                        STATE[k] = v
            return self.send_json(200, {})
        if path == "/_test/release":
            RELEASE.set()
            return self.send_json(200, {})
        if path == "/_test/requests":
            with LOCK:
                return self.send_json(200, {"requests": STATE["requests"], "held_released": STATE["held_released"],
                                            "secrets": STATE["secrets"]})
        return self.fail(404, "NotFound", path)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = handle_any


def main():
    global TOKEN
    ap = argparse.ArgumentParser()
    ap.add_argument("--token", required=True)
    ap.add_argument("--max-seconds", type=float, default=300)
    args = ap.parse_args()
    TOKEN = args.token
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    deadline = time.time() + args.max_seconds

    def watch_stdin():
        sys.stdin.read()
        deadline_hit.set()

    deadline_hit = threading.Event()
    threading.Thread(target=watch_stdin, daemon=True).start()
    while time.time() < deadline and not deadline_hit.wait(0.2):
        pass
    server.shutdown()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A fake Kubernetes API server for the Kubernetes backend's tests (stdlib plus `cryptography` for
its throwaway certificates), on loopback. It answers the few endpoints the backend uses, with the
API's shapes (Status objects on errors, lists with items, label selectors on pods, pod logs streamed
chunked as the API server does, with `timestamps` and `sinceTime`), authenticates every request as
the API server does (a bearer token, or a client certificate the cluster CA signed), and records
every request (method, path, headers, body, TLS client identity) for the test to inspect.

With --tls-dir DIR it serves HTTPS: it writes a fresh PKI into DIR first (ca.crt, server.crt/.key
for 127.0.0.1 and localhost, client.crt/.key for user "tester" signed by the CA, and other-ca.crt
plus other-client.crt/.key from an unrelated CA), asks for client certificates and verifies any
given against ca.crt (--client-cert required: refuses the TLS handshake without one). Handshakes
that fail are recorded (tls_failures). Without --tls-dir it serves plain HTTP (as `kubectl proxy`).
No key is ever committed: each run makes its own.

The test drives it through a second, plain-HTTP control port (no credentials needed):
  PUT  /_test/state     {"pods": {job: [pod, ...]}, "status": {job: status}, "logs": {"pod/container": LOG},
                         "jobstatus": {batch Job name: its status} (batch/v1 Jobs are POSTed, read and deleted;
                         "batchjobs" holds them; a TrainJob takes merge patches),
                         "events": {namespace: [core/v1 Event, ...]} (GET .../namespaces/NS/events lists them),
                         "errors": [{"method", "path", "status", "reason", "message"}],
                         "runtimes": {name: ClusterTrainingRuntime},
                         "namespaced_runtimes": {name: TrainingRuntime (listed in its metadata.namespace)}}
                         (merged; a null value removes an entry)
  POST /_test/release   lets a held log stream send its remaining lines
  GET  /_test/requests  the recorded requests, in order (and tls_failures, held_released, secrets, batchjobs, trainjobs)
LOG = {"lines": [...], "times": [RFC 3339 with nanoseconds, one per line] (default: one line every
0.4 s from 2026-12-02T10:02:00Z), "hold_after": k, "drops": [{"at": i, "how": "reset"|"clean",
"partial": bool, "container_ends": bool, "replaced_by": POD}], "ends": true}. A followed stream sends the lines from sinceTime on (whole seconds,
as the kubelet sees it; `timestamps=true` prefixes each with its time); at a drop's line index it
either cuts the connection (reset: no closing chunk, half of line i sent first when partial) or
ends the response as if the API server had timed it out (clean); each drop happens once, and with
container_ends the container has exited by then; with replaced_by the pod is gone, another of that
name in its place (as JobSet replaces an evicted pod). After the
last line of a followed stream the container has ended (unless "ends" is false): the pod turns
Succeeded with the container terminated, and the stream closes. A held log (hold_after k) sends k
lines, then waits (up to 30 s) for /_test/release, then sends the rest and records whether the
release came (so a test can prove lines arrived while streaming).

It also plays Kubeflow Trainer's status server (KEP-2779, the TrainJobStatus feature gate): POST
.../namespaces/NS/trainjobs/NAME/status with the pods' projected token (--status-token) as bearer and
{"trainerStatus": {"progressPercentage", "estimatedRemainingSeconds", "metrics": [{"name", "value"}],
"lastUpdatedTime"}} checked as the controller's API types check it (unknown fields, ranges, empty
names or values: 422) is written into the TrainJob's status.trainerStatus.

Usage: kube_api_server.py --token TOKEN [--status-token TOKEN] [--tls-dir DIR [--client-cert optional|required]]
[--max-seconds N]; prints {"port": N, "control_port": M} when ready; exits when stdin closes or
after max-seconds.
"""
import argparse
import calendar
import datetime
import json
import os
import re
import socket
import ssl
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

LOCK = threading.Lock()
STATE = {"trainjobs": {}, "secrets": {}, "pods": {}, "status": {}, "logs": {}, "errors": [], "runtimes": {},
         "namespaced_runtimes": {}, "events": {},
         "batchjobs": {}, "jobstatus": {}, "requests": [], "held_released": [], "tls_failures": []}
RELEASE = threading.Event()
TOKEN = ""
STATUS_TOKEN = None  # the trainer pods' projected token for the status endpoint; None: no endpoint
CLIENT_CN = "tester"  # the user the client certificate names

TJ = re.compile(r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs(?:/([^/]+))?$")
CTR = re.compile(r"^/apis/trainer\.kubeflow\.org/v1alpha1/clustertrainingruntimes/([^/]+)$")
SECRET = re.compile(r"^/api/v1/namespaces/([^/]+)/secrets(?:/([^/]+))?$")
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")
POD = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)$")
LOG = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")
EVENTS = re.compile(r"^/api/v1/namespaces/([^/]+)/events$")
BATCH_JOBS = re.compile(r"^/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?$")
TJ_STATUS = re.compile(r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs/([^/]+)/status$")
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch, in place."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            merge_patch(target[k], v)
        else:
            target[k] = json.loads(json.dumps(v))


def trainer_status_problem(body):
    """What the controller's validation would refuse in a status update ("" when it is valid)."""
    if not isinstance(body, dict) or set(body) - {"trainerStatus"}:
        return "the body must be {\"trainerStatus\": {...}}"
    ts = body.get("trainerStatus")
    if not isinstance(ts, dict):
        return "trainerStatus must be an object"
    unknown = set(ts) - {"progressPercentage", "estimatedRemainingSeconds", "metrics", "lastUpdatedTime"}
    if unknown:
        return "unknown field(s) in trainerStatus: " + ", ".join(sorted(unknown))
    p = ts.get("progressPercentage")
    if p is not None and (not isinstance(p, int) or isinstance(p, bool) or not 0 <= p <= 100):
        return "progressPercentage must be an integer in [0, 100]"
    r = ts.get("estimatedRemainingSeconds")
    if r is not None and (not isinstance(r, int) or isinstance(r, bool) or r < 0 or r > 2**31 - 1):
        return "estimatedRemainingSeconds must be a 32-bit integer >= 0"
    for m in ts.get("metrics", []):
        if not isinstance(m, dict) or set(m) != {"name", "value"}:
            return "a metric is {\"name\", \"value\"}"
        if not isinstance(m["name"], str) or not m["name"] or not isinstance(m["value"], str) or not m["value"]:
            return "a metric's name and value are non-empty strings"
    t = ts.get("lastUpdatedTime")
    if t is not None and (not isinstance(t, str) or not RFC3339.match(t)):
        return "lastUpdatedTime must be an RFC 3339 time"
    return ""
BASE_TIME = calendar.timegm((2026, 12, 2, 10, 2, 0))


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def make_pki(directory):
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, plus an
    unrelated CA with its own client certificate: EC P-256, valid for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    import ipaddress

    os.makedirs(directory, exist_ok=True)
    start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    end = start + datetime.timedelta(days=1)

    def name(cn, org=None):
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        return x509.Name(attrs)

    def write(stem, cert, key=None):
        with open(os.path.join(directory, stem + ".crt"), "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        if key is not None:
            with open(os.path.join(directory, stem + ".key"), "wb") as f:
                f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))

    def ca(cn):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(name(cn)).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False, data_encipherment=False,
                                             key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        return cert, key

    def leaf(ca_cert, ca_key, subject, usage, sans=None):
        key = ec.generate_private_key(ec.SECP256R1())
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject).public_key(key.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False))
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return b.sign(ca_key, hashes.SHA256()), key

    ca_cert, ca_key = ca("fake-kube-ca")
    write("ca", ca_cert)
    server, server_key = leaf(ca_cert, ca_key, name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH,
                              [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    write("server", server, server_key)
    client, client_key = leaf(ca_cert, ca_key, name(CLIENT_CN, "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH)
    write("client", client, client_key)
    other_cert, other_key = ca("some-other-ca")
    write("other-ca", other_cert)
    other_client, other_client_key = leaf(other_cert, other_key, name(CLIENT_CN, "system:masters"),
                                          ExtendedKeyUsageOID.CLIENT_AUTH)
    write("other-client", other_client, other_client_key)


def parse_time_ns(text):
    """RFC 3339 (UTC 'Z', optional fraction) -> integer nanoseconds since the epoch."""
    m = re.match(r"^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?Z$", text)
    if not m:
        raise ValueError("not an RFC 3339 UTC time: " + text)
    seconds = calendar.timegm(tuple(int(g) for g in m.groups()[:6]))
    return seconds * 10**9 + int((m.group(7) or "").ljust(9, "0"))


def format_time_ns(ns):
    """As Go's RFC3339Nano: trailing zeros of the fraction dropped."""
    seconds, frac = divmod(ns, 10**9)
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    if frac:
        text += "." + str(frac).rjust(9, "0").rstrip("0")
    return text + "Z"


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
    protocol_version = "HTTP/1.1"  # logs stream chunked, as the API server's do; one request a connection

    def log_message(self, *args):
        pass

    def send_json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def fail(self, code, reason, message):
        self.send_json(code, status_obj(code, reason, message))

    def client_identity(self):
        """The verified client certificate's common name ("" without one)."""
        getpeercert = getattr(self.connection, "getpeercert", None)
        cert = getpeercert() if getpeercert else None
        for rdn in (cert or {}).get("subject", ()):
            for k, v in rdn:
                if k == "commonName":
                    return v
        return ""

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
        if self.server.is_control:
            return self.control(path, body)
        client_cn = self.client_identity()
        with LOCK:
            STATE["requests"].append({"method": self.command, "path": self.path,
                                      "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body,
                                      "tls": isinstance(self.connection, ssl.SSLSocket), "client_cn": client_cn})
        m = TJ_STATUS.match(path)
        if m and self.command == "POST" and STATUS_TOKEN is not None:  # the controller's status server
            return self.trainer_status(m.group(1), m.group(2), body)
        # As the API server: a valid bearer token, or a client certificate its CA signed.
        if self.headers.get("Authorization") != "Bearer " + TOKEN and client_cn != CLIENT_CN:
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
        m = re.match(r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainingruntimes$", path)
        if m and self.command == "GET":
            with LOCK:
                items = [dict((k, v) for k, v in rt.items() if k not in ("apiVersion", "kind"))
                         for rt in STATE["namespaced_runtimes"].values()
                         if rt.get("metadata", {}).get("namespace", m.group(1)) == m.group(1)]
            return self.send_json(200, {"apiVersion": "trainer.kubeflow.org/v1alpha1",
                                        "kind": "TrainingRuntimeList", "items": items, "metadata": {}})
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
        m = BATCH_JOBS.match(path)
        if m:
            return self.batch_jobs(m.group(1), m.group(2), body)
        m = PODS.match(path)
        if m and self.command == "GET":
            selector = query.get("labelSelector", [""])[0]
            with LOCK:
                pods = [p for job in STATE["pods"].values() for p in job
                        if p["metadata"].get("namespace", m.group(1)) == m.group(1)
                        and selector_matches(selector, p["metadata"].get("labels", {}))]
            return self.send_json(200, {"kind": "PodList", "apiVersion": "v1", "items": pods})
        m = POD.match(path)
        if m and self.command == "GET":
            with LOCK:
                found = self.find_pod(m.group(2))
                found = json.loads(json.dumps(found)) if found else None
            if found is None:
                return self.fail(404, "NotFound", f'pods "{m.group(2)}" not found')
            return self.send_json(200, found)
        m = LOG.match(path)
        if m and self.command == "GET":
            return self.log(m.group(2), query)
        m = EVENTS.match(path)
        if m and self.command == "GET":
            with LOCK:
                items = list(STATE["events"].get(m.group(1), []))
            return self.send_json(200, {"kind": "EventList", "apiVersion": "v1", "items": items, "metadata": {}})
        return self.fail(404, "NotFound", f"the server could not find the requested resource ({self.command} {path})")

    @staticmethod
    def find_pod(name):  # under LOCK
        for job in STATE["pods"].values():
            for p in job:
                if p["metadata"]["name"] == name:
                    return p
        return None

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
            if self.command == "PATCH":
                if self.headers.get("Content-Type") != "application/merge-patch+json":
                    return self.fail(415, "UnsupportedMediaType", "this fake takes JSON merge patches only")
                merge_patch(jobs[name], body)
                return self.send_json(200, jobs[name])
        return self.fail(405, "MethodNotAllowed", "method not allowed")

    def batch_jobs(self, ns, name, body):
        """batch/v1 Jobs (the export Job): created, read with the status the test set ("jobstatus"),
        deleted. Their pods are whatever the test puts in "pods"."""
        with LOCK:
            jobs = STATE["batchjobs"]
            if self.command == "POST" and name is None:
                n = body["metadata"]["name"]
                if n in jobs:
                    return self.fail(409, "AlreadyExists", f'jobs.batch "{n}" already exists')
                obj = json.loads(json.dumps(body))
                obj["metadata"].update({"namespace": ns, "uid": str(uuid.uuid4()), "creationTimestamp": now()})
                jobs[n] = obj
                return self.send_json(201, obj)
            if name not in jobs:
                return self.fail(404, "NotFound", f'jobs.batch "{name}" not found')
            if self.command == "GET":
                return self.send_json(200, dict(jobs[name], status=STATE["jobstatus"].get(name, {})))
            if self.command == "DELETE":
                del jobs[name]
                return self.send_json(200, status_obj(200, "", "") | {"status": "Success"})
        return self.fail(405, "MethodNotAllowed", "method not allowed")

    def trainer_status(self, ns, name, body):
        if self.headers.get("Authorization") != "Bearer " + STATUS_TOKEN:
            return self.fail(401, "Unauthorized", "the token is not a trainer pod's of this TrainJob")
        problem = trainer_status_problem(body)
        if problem:
            return self.fail(422, "Invalid", problem)
        with LOCK:
            if name not in STATE["trainjobs"].get(ns, {}):
                return self.fail(404, "NotFound", f'trainjobs.trainer.kubeflow.org "{name}" not found')
            STATE["status"].setdefault(name, {})["trainerStatus"] = body["trainerStatus"]
        return self.send_json(200, {})

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

    def chunk(self, data):
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def log(self, pod, query):
        container = query.get("container", [""])[0]
        follow = query.get("follow", ["false"])[0] == "true"
        timestamps = query.get("timestamps", ["false"])[0] == "true"
        since = query.get("sinceTime", [None])[0]
        with LOCK:
            spec = STATE["logs"].get(pod + "/" + container)
            spec = json.loads(json.dumps(spec)) if spec is not None else None
        if spec is None:
            return self.fail(404, "NotFound", f'pods "{pod}" not found')
        if since is not None:
            try:
                since_ns = parse_time_ns(since) // 10**9 * 10**9  # the kubelet gets whole seconds
            except ValueError as e:
                return self.fail(400, "BadRequest", f"sinceTime: {e}")
        lines = spec["lines"]
        times = spec.get("times") or [format_time_ns(BASE_TIME * 10**9 + i * 400 * 10**6) for i in range(len(lines))]
        first = 0
        if since is not None:
            while first < len(lines) and parse_time_ns(times[first]) < since_ns:
                first += 1
        hold = spec.get("hold_after") if follow else None
        drop = None
        if follow:
            with LOCK:  # the first drop still ahead of this stream, used up now
                live = STATE["logs"][pod + "/" + container]
                for i, d in enumerate(live.get("drops", [])):
                    if d["at"] >= first:
                        drop = live["drops"].pop(i)
                        break
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for i in range(first, len(lines)):
            text = ((times[i] + " ") if timestamps else "") + lines[i] + "\n"
            if drop is not None and i == drop["at"]:
                if drop.get("container_ends"):  # it exits while the stream is down
                    self.end_container(pod, container)
                if drop.get("replaced_by"):  # the pod is gone (evicted) and JobSet made another
                    self.replace_pod(pod, drop["replaced_by"])
                if drop.get("how", "reset") == "clean":
                    break  # the response ends properly, the container still runs
                if drop.get("partial"):
                    self.chunk(text[: len(text) // 2].encode())
                self.connection.shutdown(socket.SHUT_RDWR)  # no closing chunk: the stream is cut
                return
            if hold is not None and i == hold:
                released = RELEASE.wait(30)
                with LOCK:
                    STATE["held_released"].append(released)
            self.chunk(text.encode())
        else:
            if follow and spec.get("ends", True):  # the container exits; its log is complete
                self.end_container(pod, container)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def replace_pod(self, pod, new_name):
        with LOCK:
            for job in STATE["pods"].values():
                for i, p in enumerate(job):
                    if p["metadata"]["name"] == pod:
                        new = json.loads(json.dumps(p))
                        new["metadata"]["name"] = new_name
                        new["metadata"]["creationTimestamp"] = now()
                        job[i] = new
                        return

    def end_container(self, pod, container):
        with LOCK:
            p = self.find_pod(pod)
            if p is not None:
                p["status"]["phase"] = "Succeeded"
                p["status"]["containerStatuses"] = [{"name": container, "state": {"terminated": {
                    "exitCode": 0, "finishedAt": now()}}}]

    def control(self, path, body):
        if path == "/_test/state" and self.command == "PUT":
            with LOCK:
                for k, v in (body or {}).items():
                    if isinstance(STATE.get(k), dict):
                        for name, value in v.items():  # merged; a null removes the entry
                            if value is None:
                                STATE[k].pop(name, None)
                            else:
                                STATE[k][name] = value
                    else:
                        STATE[k] = v
            return self.send_json(200, {})
        if path == "/_test/release":
            RELEASE.set()
            return self.send_json(200, {})
        if path == "/_test/requests":
            with LOCK:
                return self.send_json(200, {"requests": STATE["requests"], "held_released": STATE["held_released"],
                                            "secrets": STATE["secrets"], "tls_failures": STATE["tls_failures"],
                                            "batchjobs": STATE["batchjobs"], "trainjobs": STATE["trainjobs"]})
        return self.fail(404, "NotFound", path)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = handle_any


class Server(ThreadingHTTPServer):
    """Serves each connection on its own thread; with a TLS context the handshake happens there too,
    so a refused handshake is recorded and the other connections go on."""
    daemon_threads = True

    def __init__(self, address, tls_context=None, is_control=False):
        super().__init__(address, Handler)
        self.tls_context = tls_context
        self.is_control = is_control

    def finish_request(self, request, client_address):
        if self.tls_context is None:
            return super().finish_request(request, client_address)
        request.settimeout(30)
        tls = self.tls_context.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        try:
            tls.do_handshake()
        except (ssl.SSLError, OSError) as e:
            with LOCK:
                STATE["tls_failures"].append(str(e))
            # Close gently: the alert just sent must reach the client before the socket goes
            # (closing with its request unread would reset the connection and lose the alert).
            raw = socket.socket(fileno=tls.detach())
            try:
                raw.shutdown(socket.SHUT_WR)
                while raw.recv(65536):
                    pass
            except OSError:
                pass
            raw.close()
            return
        try:
            Handler(tls, client_address, self)
        except (ssl.SSLError, OSError) as e:  # e.g. TLS 1.3: the client certificate is checked after the handshake
            with LOCK:
                STATE["tls_failures"].append(str(e))
        finally:
            tls.close()

    def handle_error(self, request, client_address):
        pass  # a client that went away mid-stream is no error of the server


def main():
    global TOKEN, STATUS_TOKEN
    ap = argparse.ArgumentParser()
    ap.add_argument("--token", required=True)
    ap.add_argument("--status-token")
    ap.add_argument("--tls-dir", help="serve HTTPS with a fresh PKI written here")
    ap.add_argument("--client-cert", choices=["optional", "required"], default="optional")
    ap.add_argument("--max-seconds", type=float, default=300)
    args = ap.parse_args()
    TOKEN = args.token
    STATUS_TOKEN = args.status_token
    context = None
    if args.tls_dir:
        make_pki(args.tls_dir)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(os.path.join(args.tls_dir, "server.crt"), os.path.join(args.tls_dir, "server.key"))
        context.load_verify_locations(os.path.join(args.tls_dir, "ca.crt"))
        context.verify_mode = ssl.CERT_REQUIRED if args.client_cert == "required" else ssl.CERT_OPTIONAL
    server = Server(("127.0.0.1", 0), context)
    control = Server(("127.0.0.1", 0), None, is_control=True)
    for s in (server, control):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print(json.dumps({"port": server.server_address[1], "control_port": control.server_address[1]}), flush=True)
    deadline = time.time() + args.max_seconds

    def watch_stdin():
        sys.stdin.read()
        deadline_hit.set()

    deadline_hit = threading.Event()
    threading.Thread(target=watch_stdin, daemon=True).start()
    while time.time() < deadline and not deadline_hit.wait(0.2):
        pass
    server.shutdown()
    control.shutdown()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A local stand-in for the Hugging Face Hub, for ktune's hub tests (stdlib only).

    python3 hub_server.py --root fixtures/hub --upload-dir DIR [--max-seconds 300]

Binds 127.0.0.1 on a free port and prints one JSON line {"port": N} on stdout. It exits when
its stdin closes (the test that started it is gone), on SIGTERM, or after --max-seconds.

It serves the fixture tree the way the Hub's HTTP API does, for the subset ktune uses:
  GET  /api/{models|datasets}/{org}/{name}[/revision/{rev}]   sha, siblings (size, blobId, lfs)
  GET  /{datasets/}{org}/{name}/resolve/{rev}/{path}          regular files: 200 + ETag (blob id)
       LFS files (*.safetensors *.bin *.model *.msgpack *.parquet): 302 to http://localhost:PORT/
       _cdn/{sha256} (another host name) with X-Linked-Etag / X-Linked-Size; the CDN refuses
       requests that carry Authorization (as presigned storage URLs do). Range requests -> 206.
  Every response carries X-Repo-Commit. Errors carry X-Error-Code / X-Error-Message.
  Access rules: the token "hf_goodtoken1234567890" is granted everything; "hf_otheruser1234567890"
  is a valid token not granted org/gated-model; any other token is invalid (401). org/gated-model:
  no token -> 401 GatedRepo, ungranted token -> 403 GatedRepo. A missing repo -> 404 RepoNotFound
  (401 without a token, as the Hub does).
  Faults on org/flaky-model: config.json answers 503 twice then 200; tokenizer.json 429 with
  Retry-After: 1 once; model.safetensors (on the CDN) sends half its body once and drops the
  connection. org/evil lists an extra sibling "../escape.txt" and serves it.
  Uploads: GET /api/models/{repo}, POST /api/repos/create, POST .../preupload/{rev},
  POST /{repo}.git/info/lfs/objects/batch (basic transfer), PUT /_lfs_upload/{oid} (checks the
  sha256, refuses Authorization), POST /_lfs_verify/{oid}, POST .../commit/{rev} (NDJSON; writes
  the committed files under --upload-dir/{org}/{name}/).
  Test hooks: GET /_log (requests seen: method, path, range, has_auth, host), POST /_reset.
"""
import argparse
import base64
import hashlib
import json
import os
import signal
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GOOD = "hf_goodtoken1234567890"
OTHER = "hf_otheruser1234567890"
LFS_SUFFIXES = (".safetensors", ".bin", ".model", ".msgpack", ".parquet")


def git_blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repos:
    def __init__(self, root):
        self.root = root
        self.uploaded = {}  # (kind, repo) -> True

    def files(self, kind, repo):
        base = os.path.join(self.root, kind, repo)
        if not os.path.isdir(base):
            return None
        out = {}
        for d, _, names in os.walk(base):
            for n in names:
                full = os.path.join(d, n)
                out[os.path.relpath(full, base).replace(os.sep, "/")] = full
        if repo == "org/evil":
            out["../escape.txt"] = None  # served from memory
        return dict(sorted(out.items()))

    @staticmethod
    def content(path_on_disk):
        if path_on_disk is None:
            return b"escaped!\n"
        with open(path_on_disk, "rb") as f:
            return f.read()

    def info(self, kind, repo):
        files = self.files(kind, repo)
        if files is None:
            return None
        siblings, ids = [], []
        for name, disk in files.items():
            data = self.content(disk)
            entry = {"rfilename": name, "size": len(data)}
            if name.endswith(LFS_SUFFIXES):
                sha = hashlib.sha256(data).hexdigest()
                pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n".encode()
                entry["blobId"] = git_blob_id(pointer)
                entry["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": len(pointer)}
            else:
                entry["blobId"] = git_blob_id(data)
            ids.append(entry["blobId"])
            siblings.append(entry)
        sha = hashlib.sha1(("".join(ids) + repo).encode()).hexdigest()
        return {"id": repo, "sha": sha, "siblings": siblings, "gated": "manual" if repo == "org/gated-model" else False}


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.counters = {}
        self.log = []
        self.lfs = {}  # oid -> bytes

    def bump(self, key):
        with self.lock:
            self.counters[key] = self.counters.get(key, 0) + 1
            return self.counters[key]


def make_handler(repos, state, upload_dir):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        # ---- helpers ----
        def token(self):
            auth = self.headers.get("Authorization", "")
            return auth[7:] if auth.startswith("Bearer ") else None

        def record(self):
            with state.lock:
                state.log.append({"method": self.command, "path": urllib.parse.unquote(self.path.split("?")[0]),
                                  "range": self.headers.get("Range"), "has_auth": "Authorization" in self.headers,
                                  "host": self.headers.get("Host", "")})

        def send(self, status, body=b"", headers=None, content_type="application/json"):
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def error(self, status, code, message, extra=None):
            h = {"X-Error-Message": message}
            if code:
                h["X-Error-Code"] = code
            h.update(extra or {})
            self.send(status, {"error": message}, h)

        def body(self):
            n = int(self.headers.get("Content-Length", "0"))
            return self.rfile.read(n) if n else b""

        def check_token(self):
            """False (and an answer sent) when a token is given but invalid."""
            t = self.token()
            if t is not None and t not in (GOOD, OTHER):
                self.error(401, None, "Invalid credentials in Authorization header")
                return False
            return True

        def serve_bytes(self, data, headers, cut=False):
            rng = self.headers.get("Range")
            status, start, end = 200, 0, len(data)
            if rng and rng.startswith("bytes="):
                first, _, last = rng[6:].partition("-")
                start = int(first)
                end = int(last) + 1 if last else len(data)
                if start >= len(data) and len(data) > 0:
                    return self.send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                status = 206
                headers = dict(headers, **{"Content-Range": f"bytes {start}-{end - 1}/{len(data)}"})
            chunk = data[start:end]
            self.send_response(status)
            self.send_header("Content-Length", str(len(chunk)))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if cut:  # half the promised bytes, then the connection drops
                self.wfile.write(chunk[: len(chunk) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(chunk)

        def split_repo(self, parts):
            """parts after an optional 'datasets': returns kind, repo, rest."""
            kind = "models"
            if parts and parts[0] == "datasets":
                kind, parts = "datasets", parts[1:]
            if len(parts) < 2:
                return kind, None, []
            return kind, parts[0] + "/" + parts[1], parts[2:]

        # ---- GET / HEAD ----
        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            self.record()
            url = urllib.parse.urlparse(self.path)
            parts = [urllib.parse.unquote(p) for p in url.path.split("/")[1:]]
            if parts == ["_log"]:
                with state.lock:
                    return self.send(200, list(state.log))
            if parts and parts[0] == "_cdn":
                if "Authorization" in self.headers:
                    return self.error(400, None, "Only one auth mechanism allowed (the CDN URL is presigned)")
                q = urllib.parse.parse_qs(url.query)
                kind, repo, name = q["kind"][0], q["repo"][0], q["file"][0]
                data = repos.content(repos.files(kind, repo)[name])
                cut = repo == "org/flaky-model" and name == "model.safetensors" and state.bump("cut:" + name) == 1
                return self.serve_bytes(data, {"ETag": '"%s"' % parts[1]}, cut=cut)
            if not self.check_token():
                return
            if parts and parts[0] == "api":
                return self.api_get(parts[1:])
            kind, repo, rest = self.split_repo(parts)
            if repo and len(rest) >= 2 and rest[0] == "resolve":
                return self.resolve(kind, repo, rest[1], "/".join(rest[2:]))
            return self.error(404, None, "Not found")

        def repo_access(self, kind, repo, for_content):
            """Sends the error and returns False when the caller may not see this repo."""
            info = repos.info(kind, repo)
            if info is None:
                if (kind, repo) in repos.uploaded:
                    return True
                t = self.token()
                self.error(401 if t is None else 404, "RepoNotFound", "Repository not found")
                return False
            if repo == "org/gated-model" and for_content:
                t = self.token()
                if t is None:
                    self.error(401, "GatedRepo", f"Access to model {repo} is restricted. You must have access "
                                                 "to it and be authenticated to access it. Please log in.")
                    return False
                if t != GOOD:
                    self.error(403, "GatedRepo", f"Access to model {repo} is restricted and you are not in the "
                                                 "authorized list.")
                    return False
            return True

        def api_get(self, parts):
            kind = parts[0] if parts else ""
            if kind not in ("models", "datasets") or len(parts) < 3:
                return self.error(404, None, "Not found")
            repo = parts[1] + "/" + parts[2]
            if not self.repo_access(kind, repo, for_content=False):
                return
            info = repos.info(kind, repo) or {"id": repo, "sha": "0" * 40, "siblings": []}
            if len(parts) >= 5 and parts[3] == "revision":
                rev = "/".join(parts[4:])
                if rev not in ("main", info["sha"]):
                    return self.error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return self.send(200, info)

        def resolve(self, kind, repo, rev, name):
            if not self.repo_access(kind, repo, for_content=True):
                return
            info = repos.info(kind, repo)
            if rev not in ("main", info["sha"]):
                return self.error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            files = repos.files(kind, repo)
            if name not in files:
                return self.error(404, "EntryNotFound", f"{name} does not exist on \"{rev}\"",
                                  {"X-Repo-Commit": info["sha"]})
            if repo == "org/flaky-model" and name == "config.json" and state.bump("503:" + name) <= 2:
                return self.error(503, None, "Service Unavailable")
            if repo == "org/flaky-model" and name == "tokenizer.json" and state.bump("429:" + name) == 1:
                return self.error(429, None, "Too Many Requests", {"Retry-After": "1"})
            data = repos.content(files[name])
            sib = next(s for s in info["siblings"] if s["rfilename"] == name)
            common = {"X-Repo-Commit": info["sha"]}
            if "lfs" in sib:
                sha = sib["lfs"]["sha256"]
                port = self.server.server_address[1]
                q = urllib.parse.urlencode({"kind": kind, "repo": repo, "file": name})
                loc = f"http://localhost:{port}/_cdn/{sha}?{q}"
                h = dict(common, **{"Location": loc, "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                                    "ETag": f'"{sib["blobId"]}"'})
                return self.send(302, b"", h, content_type="text/plain")
            return self.serve_bytes(data, dict(common, **{"ETag": f'"{sib["blobId"]}"'}))

        # ---- uploads ----
        def do_POST(self):
            self.record()
            url = urllib.parse.urlparse(self.path)
            parts = [urllib.parse.unquote(p) for p in url.path.split("/")[1:]]
            body = self.body()
            if parts == ["_reset"]:
                with state.lock:
                    state.counters.clear()
                    state.log.clear()
                return self.send(200, {})
            if parts and parts[0] == "_lfs_verify":
                oid = parts[1]
                req = json.loads(body)
                if state.lfs.get(oid) is None or len(state.lfs[oid]) != req.get("size"):
                    return self.error(404, None, "object not uploaded")
                return self.send(200, {})
            if not self.check_token():
                return
            if self.token() is None:
                return self.error(401, None, "Authorization header required")
            if parts[:3] == ["api", "repos", "create"]:
                req = json.loads(body)
                kind = "datasets" if req.get("type") == "dataset" else "models"
                repo = (req.get("organization") + "/" if req.get("organization") else "") + req["name"]
                if repos.info(kind, repo) is not None or (kind, repo) in repos.uploaded:
                    return self.error(409, None, "You already created this repo")
                repos.uploaded[(kind, repo)] = True
                return self.send(200, {"url": f"/{repo}"})
            if parts and parts[0] == "api" and len(parts) >= 6 and parts[4] in ("preupload", "commit"):
                kind, repo, op = parts[1], parts[2] + "/" + parts[3], parts[4]
                if not self.repo_access(kind, repo, for_content=True):
                    return
                if op == "preupload":
                    files = json.loads(body)["files"]
                    modes = [{"path": f["path"], "uploadMode": "lfs" if f["path"].endswith(LFS_SUFFIXES)
                              or f["size"] >= 100_000 else "regular", "shouldIgnore": False} for f in files]
                    return self.send(200, {"files": modes})
                return self.commit(kind, repo, body)
            if len(parts) >= 5 and parts[-4:] == ["info", "lfs", "objects", "batch"] or (
                    len(parts) >= 4 and parts[-4].endswith(".git") and parts[-3:] == ["lfs", "objects", "batch"]):
                req = json.loads(body)
                port = self.server.server_address[1]
                objs = []
                for o in req["objects"]:
                    entry = {"oid": o["oid"], "size": o["size"]}
                    if o["oid"] not in state.lfs:
                        entry["actions"] = {
                            "upload": {"href": f"http://localhost:{port}/_lfs_upload/{o['oid']}",
                                       "header": {"X-Upload-Ticket": "t-" + o["oid"][:8]}},
                            "verify": {"href": f"http://127.0.0.1:{port}/_lfs_verify/{o['oid']}"}}
                    objs.append(entry)
                return self.send(200, {"transfer": "basic", "objects": objs}, content_type="application/vnd.git-lfs+json")
            return self.error(404, None, "Not found")

        def commit(self, kind, repo, body):
            lines = [json.loads(l) for l in body.decode().splitlines() if l.strip()]
            if not lines or lines[0].get("key") != "header":
                return self.error(400, None, "first line must be the header")
            out = {}
            for line in lines[1:]:
                v = line["value"]
                if line["key"] == "file":
                    if v.get("encoding") != "base64":
                        return self.error(400, None, "only base64 file content is supported here")
                    out[v["path"]] = base64.b64decode(v["content"], validate=True)
                elif line["key"] == "lfsFile":
                    data = state.lfs.get(v["oid"])
                    if data is None or v.get("algo") != "sha256":
                        return self.error(400, None, f"LFS object {v['oid']} of {v['path']} was never uploaded")
                    out[v["path"]] = data
                else:
                    return self.error(400, None, "unsupported commit operation " + line["key"])
            for path, data in out.items():
                if path.startswith("/") or ".." in path.split("/"):
                    return self.error(400, None, "bad path " + path)
                full = os.path.join(upload_dir, kind, repo, path)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "wb") as f:
                    f.write(data)
            oid = hashlib.sha1(body).hexdigest()
            return self.send(200, {"commitOid": oid, "commitUrl": f"/{repo}/commit/{oid}"})

        def do_PUT(self):
            self.record()
            parts = [urllib.parse.unquote(p) for p in urllib.parse.urlparse(self.path).path.split("/")[1:]]
            body = self.body()
            if parts and parts[0] == "_lfs_upload":
                if "Authorization" in self.headers:
                    return self.error(400, None, "storage URL must not receive the Hub token")
                if self.headers.get("X-Upload-Ticket") != "t-" + parts[1][:8]:
                    return self.error(403, None, "missing the upload ticket header from the batch answer")
                if hashlib.sha256(body).hexdigest() != parts[1]:
                    return self.error(400, None, "content does not match its oid")
                state.lfs[parts[1]] = body
                return self.send(200, b"", content_type="text/plain")
            return self.error(404, None, "Not found")

    return Handler


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--upload-dir", required=True)
    ap.add_argument("--max-seconds", type=float, default=300)
    args = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(Repos(args.root), State(), args.upload_dir))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(json.dumps({"port": server.server_address[1]}), flush=True)

    def stop(*_):
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    threading.Timer(args.max_seconds, stop).start()
    sys.stdin.read()  # returns when the parent closes our stdin or dies
    stop()


if __name__ == "__main__":
    main()

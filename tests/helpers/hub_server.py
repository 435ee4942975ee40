"""A stand-in Hugging Face Hub for the tests: a loopback HTTP server (a thread, real sockets)
speaking the part of the Hub's API that huggingface_hub's `snapshot_download` uses, pointed to
with HF_ENDPOINT. Read from huggingface_hub 2.x (hf_api.py, file_download.py, _snapshot_download.py):

  GET  /api/models/{repo}/revision/{rev}   repo info: {"id", "sha", "siblings"}; a branch or a
                                           commit; 404 with X-Error-Code RepoNotFound /
                                           RevisionNotFound otherwise
  GET  /api/models/{repo}/tree/{commit}    the file listing: path, size, git oid, and `lfs`
                                           (sha256, size) for *.safetensors
  HEAD /{repo}/resolve/{rev}/{path}        X-Repo-Commit, ETag (git oid) or, for LFS files,
                                           X-Linked-Etag (sha256) and X-Linked-Size; Content-Length
  GET  /{repo}/resolve/{rev}/{path}        the bytes; `Range: bytes=N-` answers 206 + Content-Range

Faults a test plants per (repo, file): "cut" (the first full GET stops an eighth short and closes
the connection: huggingface_hub resumes it with a Range request), "corrupt" (same size, one byte
changed: the advertised sha256 no longer matches) and "short" (the body is shorter than the size
advertised). `requests` records (method, path, Range header) of every request.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors",)


def git_oid(data: bytes) -> str:
    """The git blob id of `data` (the Hub's ETag of a non-LFS file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def commit_id(files: dict[str, bytes], salt: str = "") -> str:
    """A deterministic 40-hex id for a set of files (a stand-in for a git commit)."""
    h = hashlib.sha1(salt.encode())
    for name in sorted(files):
        h.update(name.encode() + b"\0" + git_oid(files[name]).encode())
    return h.hexdigest()


@dataclass
class Repo:
    branches: dict[str, str] = field(default_factory=dict)  # branch -> commit
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> path -> bytes

    def commit(self, rev: str) -> str | None:
        if rev in self.commits:
            return rev
        return self.branches.get(rev)


@dataclass
class StandInHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    faults: dict[tuple[str, str], str] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def publish(
        self, repo: str, folder: Path, *, commit: str | None = None, branch: str = "main"
    ) -> str:
        """Publish the files of `folder` as a commit of `repo` (id given or derived) and point
        `branch` at it; return the commit id."""
        files = {
            str(f.relative_to(folder)): f.read_bytes()
            for f in sorted(folder.rglob("*"))
            if f.is_file()
        }
        rev = commit or commit_id(files, repo)
        entry = self.repos.setdefault(repo, Repo())
        entry.commits[rev] = files
        entry.branches[branch] = rev
        return rev

    def start(self) -> StandInHub:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = True
        self._server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def gets(self, name: str) -> list[str | None]:
        """The Range headers of the GETs of files called `name` (None: a full GET)."""
        return [r for m, p, r in self.requests if m == "GET" and p.endswith("/" + name)]


def _handler(hub: StandInHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._route(head=True)

        def do_GET(self) -> None:
            self._route(head=False)

        def _route(self, head: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path, self.headers.get("Range")))
            parts = path.strip("/").split("/")
            if parts == [""]:  # the front page: what EdgeSpec asks to see whether the Hub answers
                return self._json({})
            if parts[:2] == ["api", "models"] and len(parts) >= 6:
                repo, kind, rev = "/".join(parts[2:4]), parts[4], parts[5]
                if kind == "revision":
                    return self._info(repo, rev)
                if kind == "tree":
                    return self._tree(repo, rev)
            if len(parts) >= 5 and parts[2] == "resolve":
                repo, rev, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                return self._file(repo, rev, name, head)
            self._error(404, "EntryNotFound", "no such route")

        def _error(self, status: int, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":  # an answer to HEAD has no body
                self.wfile.write(body)

        def _json(self, value: object) -> None:
            body = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _files(self, repo: str, rev: str) -> tuple[str, dict[str, bytes]] | None:
            entry = hub.repos.get(repo)
            if entry is None:
                self._error(404, "RepoNotFound", f"Repository {repo} not found")
                return None
            commit = entry.commit(rev)
            if commit is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                return None
            return commit, entry.commits[commit]

        def _info(self, repo: str, rev: str) -> None:
            found = self._files(repo, rev)
            if found is not None:
                commit, files = found
                siblings = [{"rfilename": n} for n in sorted(files)]
                self._json({"id": repo, "sha": commit, "siblings": siblings, "private": False})

        def _tree(self, repo: str, rev: str) -> None:
            found = self._files(repo, rev)
            if found is None:
                return
            listing = []
            for name, data in sorted(found[1].items()):
                item: dict[str, object] = {
                    "type": "file",
                    "oid": git_oid(data),
                    "size": len(data),
                    "path": name,
                }
                if name.endswith(LFS_SUFFIXES):
                    sha = hashlib.sha256(data).hexdigest()
                    item["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 134}
                listing.append(item)
            self._json(listing)

        def _file(self, repo: str, rev: str, name: str, head: bool) -> None:
            found = self._files(repo, rev)
            if found is None:
                return
            commit, files = found
            if name not in files:
                return self._error(404, "EntryNotFound", f"{name} not in {repo}")
            data = files[name]
            fault = hub.faults.get((repo, name))
            self.send_response(200 if head or not self.headers.get("Range") else 206)
            self.send_header("X-Repo-Commit", commit)
            if name.endswith(LFS_SUFFIXES):
                sha = hashlib.sha256(data).hexdigest()
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("ETag", f'"{sha}"')
            else:
                self.send_header("ETag", f'"{git_oid(data)}"')
            self.send_header("Accept-Ranges", "bytes")
            if head:
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                return
            self._body(repo, name, data, fault)

        def _body(self, repo: str, name: str, data: bytes, fault: str | None) -> None:
            start = 0
            wanted = self.headers.get("Range")
            if wanted:
                start = int(wanted.split("=")[1].split("-")[0])
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            if fault == "corrupt":
                data = data[:-1] + bytes([data[-1] ^ 0xFF])
            if fault == "short":
                data = data[: len(data) // 2]
            part = data[start:]
            self.send_header("Content-Length", str(len(part)))
            self.end_headers()
            if fault == "cut" and start == 0:
                hub.faults.pop((repo, name))  # once: the retry gets the rest
                self.wfile.write(part[: len(part) - len(part) // 8])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(part)

    return Handler

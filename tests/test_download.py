"""Downloads against a local HTTP server on 127.0.0.1: complete files land byte-identical; truncated,
failing and unreachable downloads raise DownloadError naming the URL and leave no file behind,
neither under the final name nor as a temporary file."""

import http.server
import shutil
import socket
import threading

import numpy as np
import pytest

import utils
from conftest import REPO

TINY = REPO / "tests" / "fixtures" / "gpt2-tiny-f32"
PAYLOAD = np.random.default_rng(0).integers(0, 256, 3 * utils.DOWNLOAD_CHUNK + 123, dtype=np.uint8).tobytes()


def release_files():
    """The files served as OpenAI's "124M": the tiny fixture's, with stand-in bytes for the unused graph."""
    files = {name: (TINY / name).read_bytes() for name in utils.OPENAI_FILES if (TINY / name).exists()}
    return {**files, "model.ckpt.meta": b"a TensorFlow graph the loader never reads"}


class Handler(http.server.BaseHTTPRequestHandler):
    """/ok/<name>: the payload; /truncated/<name>: announces more bytes than it sends, then closes;
    /status/<code>/<name>: that error status; /models/124M/<file>: the tiny release, /broken/124M/...
    the same but model.ckpt.index fails."""

    timeout = 10  # seconds a connection may idle, so a stuck client cannot hold the server

    def do_GET(self):
        parts = self.path.strip("/").split("/")
        files = release_files()
        if parts[0] == "ok":
            self.send_body(PAYLOAD)
        elif parts[0] == "truncated":
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD[: len(PAYLOAD) // 2])
            self.close_connection = True
        elif parts[0] == "status":
            self.send_error(int(parts[1]))
        elif parts[0] in ("models", "broken") and parts[-1] in files:
            if parts[0] == "broken" and parts[-1] == "model.ckpt.index":
                self.send_error(500)
            else:
                self.send_body(files[parts[-1]])
        else:
            self.send_error(404)

    def send_body(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # keep the test output quiet
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=10)


@pytest.fixture(autouse=True)
def short_timeouts(monkeypatch):
    monkeypatch.setattr(utils, "DOWNLOAD_TIMEOUT_S", 10)


def test_complete_download_is_byte_identical(server, tmp_path):
    utils.download_file(f"{server}/ok/file.bin", tmp_path / "file.bin")
    assert (tmp_path / "file.bin").read_bytes() == PAYLOAD
    assert [p.name for p in tmp_path.iterdir()] == ["file.bin"]  # the temporary file was renamed


@pytest.mark.parametrize("route, reason", [("truncated", "closed after"), ("status/404", "404"),
                                           ("status/500", "500")])
def test_failed_download_leaves_nothing(server, tmp_path, route, reason):
    url = f"{server}/{route}/file.bin"
    with pytest.raises(utils.DownloadError, match=reason) as error:
        utils.download_file(url, tmp_path / "file.bin")
    assert url in str(error.value) and str(tmp_path) in str(error.value)
    assert list(tmp_path.iterdir()) == []


def test_failed_download_keeps_an_existing_file(server, tmp_path):
    (tmp_path / "file.bin").write_bytes(b"old")
    with pytest.raises(utils.DownloadError):
        utils.download_file(f"{server}/truncated/file.bin", tmp_path / "file.bin")
    assert (tmp_path / "file.bin").read_bytes() == b"old" and len(list(tmp_path.iterdir())) == 1


def test_unreachable_server(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on: bind one, then free it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/gpt-2/models/124M/hparams.json"
    with pytest.raises(utils.DownloadError) as error:
        utils.download_file(url, tmp_path / "hparams.json")
    message = str(error.value)
    assert url in message and "hparams.json" in message and "vocab.bpe" in message and str(tmp_path) in message
    assert list(tmp_path.iterdir()) == []


def test_missing_openai_model_is_downloaded_then_loaded(server, tmp_path, monkeypatch):
    monkeypatch.setattr(utils, "OPENAI_BASE_URL", f"{server}/models")
    encoder, hparams, params = utils.load_encoder_hparams_and_params("124M", tmp_path)
    model_dir = tmp_path / "124M"
    assert sorted(p.name for p in model_dir.iterdir()) == sorted(utils.OPENAI_FILES)
    for name, body in release_files().items():
        assert (model_dir / name).read_bytes() == body
    assert hparams["n_vocab"] == 260 and params["blocks"][0]["attn"]["c_attn"]["w"].shape == (8, 24)
    assert encoder.decode(encoder.encode(" the")) == " the"


def test_partly_present_model_fetches_only_what_is_missing(server, tmp_path, monkeypatch):
    monkeypatch.setattr(utils, "OPENAI_BASE_URL", f"{server}/broken")  # would fail on model.ckpt.index
    shutil.copytree(TINY, tmp_path / "124M")
    (tmp_path / "124M" / "vocab.bpe").unlink()
    utils.load_encoder_hparams_and_params("124M", tmp_path)
    assert (tmp_path / "124M" / "vocab.bpe").read_bytes() == (TINY / "vocab.bpe").read_bytes()
    assert (tmp_path / "124M" / "model.ckpt.meta").exists()


def test_failed_model_download_names_url_and_folder(server, tmp_path, monkeypatch):
    monkeypatch.setattr(utils, "OPENAI_BASE_URL", f"{server}/broken")
    with pytest.raises(utils.DownloadError) as error:
        utils.load_encoder_hparams_and_params("355M", tmp_path)
    assert f"{server}/broken/355M/model.ckpt.index" in str(error.value)
    assert str(tmp_path / "355M") in str(error.value)
    left = sorted(p.name for p in (tmp_path / "355M").iterdir())
    assert "model.ckpt.index" not in left and all(not name.endswith(".tmp") for name in left)


def test_failed_first_download_removes_the_folder_it_made(tmp_path, monkeypatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(utils, "OPENAI_BASE_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(utils.DownloadError):
        utils.load_encoder_hparams_and_params("774M", tmp_path)
    assert list(tmp_path.iterdir()) == []

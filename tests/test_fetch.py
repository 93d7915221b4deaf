"""`fewshot data fetch`: against a local HTTP server started here (with Range support written
in its handler), files land whole and checked, a .part resumes, a corrupt file is refused, and
Ctrl-C keeps what arrived; the recorded checksums match the real files where they are."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from datafiles import jpeg, tar_bytes, write_mnist

from fewshot.cli.main import main
from fewshot.datasets import REPO_DATA
from fewshot.datasets.fetch import (
    DATASETS,
    LIBSVM_FILES,
    Remote,
    a9a_less_a8a,
    fetch,
    image_digest,
    relabel,
    sha256,
)
from fewshot.datasets.libsvm import DATASETS as LIBSVM_SETS
from fewshot.hpo.tasks.image_data import load_image_dataset
from fewshot.runtime.errors import FewshotError


class Site:
    """Files served by a local HTTP server: `files` by URL path, `log` of (path, Range header,
    bytes sent), `stall`: a path whose response stops after that many bytes until `release` is
    set, and `ignore_range`: paths served whole whatever Range asks."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.log: list[tuple[str, str | None, int]] = []
        self.stall: dict[str, int] = {}
        self.ignore_range: set[str] = set()
        self.release = threading.Event()
        self.url = ""

    def handler(self) -> type[BaseHTTPRequestHandler]:
        """The request handler class serving this site."""
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = site.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                asked = self.headers.get("Range")
                wanted = None if self.path in site.ignore_range else asked
                start = int(re.fullmatch(r"bytes=(\d+)-", wanted).group(1)) if wanted else 0
                if wanted and start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    site.log.append((self.path, asked, 0))
                    return
                self.send_response(206 if wanted else 200)
                if wanted:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                cut = site.stall.get(self.path, len(body))
                site.log.append((self.path, asked, cut))  # before: the client may be done first
                self.wfile.write(body[:cut])
                self.wfile.flush()
                if cut < len(body):
                    site.release.wait(60)
                    with contextlib.suppress(OSError):  # the client may have gone: it has a .part
                        self.wfile.write(body[cut:])

            def log_message(self, *args: object) -> None:
                """Quiet: the test reads `site.log`."""

        return Handler


@pytest.fixture
def site(monkeypatch):
    """A started local server; stopped (and any stalled response released) at the end."""
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    served = Site()
    server = ThreadingHTTPServer(("127.0.0.1", 0), served.handler())
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    served.url = f"http://127.0.0.1:{server.server_port}"
    yield served
    served.release.set()
    server.shutdown()
    server.server_close()


def served_like(site: Site, name: str, files: dict[str, bytes]) -> tuple[Remote, ...]:
    """The registry's files of data set `name` (their paths and makers), downloaded from the
    local site instead, which serves `files` (path under the data root -> bytes)."""
    remotes = []
    for remote in DATASETS[name]:
        site.files[f"/{remote.path}"] = files[remote.path]
        url = (f"{site.url}/{remote.path}",)
        remotes.append(dataclasses.replace(remote, urls=url, digest=sha256(files[remote.path])))
    return tuple(remotes)


def test_mnist_lands_whole_where_its_reader_reads_it(site, tmp_path):
    images, labels = write_mnist(tmp_path / "source" / "mnist", 6, compress=True)
    files = {f"mnist/{p.name}": p.read_bytes() for p in (tmp_path / "source" / "mnist").iterdir()}
    root, said = tmp_path / "root", []
    fetch(served_like(site, "mnist", files), root, said.append)
    assert {path: (root / path).read_bytes() for path in files} == files
    assert not list(root.rglob("*.part"))
    assert sorted(site.log) == sorted((f"/{path}", None, len(data)) for path, data in files.items())
    split = load_image_dataset("mnist", "train", root)
    assert torch.equal(split.images[:, 0], torch.from_numpy(images))
    assert split.labels.tolist() == labels.tolist()
    assert "mnist/train-images-idx3-ubyte.gz: 0.0 MiB, checksum ok" in said
    fetch(served_like(site, "mnist", files), root, said.append)  # a second fetch reads nothing
    assert len(site.log) == 4 and said[-1].endswith(": already there, checksum ok")


def test_a_part_file_is_resumed_with_a_range_request(site, tmp_path):
    data = np.random.default_rng(0).bytes(300_000)
    site.files["/blob"] = data
    remote = Remote("set/blob", sha256(data), (f"{site.url}/blob",))
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "blob.part").write_bytes(data[:120_000])
    fetch((remote,), tmp_path, print)
    assert site.log == [("/blob", "bytes=120000-", 180_000)]  # only the rest was sent
    assert (tmp_path / "set" / "blob").read_bytes() == data
    assert not (tmp_path / "set" / "blob.part").exists()
    # A server that ignores Range answers 200 with the whole file: the .part starts over.
    site.ignore_range.add("/blob")
    (tmp_path / "set" / "blob").unlink()
    (tmp_path / "set" / "blob.part").write_bytes(data[:120_000])
    fetch((remote,), tmp_path, print)
    assert site.log[-1] == ("/blob", "bytes=120000-", 300_000)
    assert (tmp_path / "set" / "blob").read_bytes() == data


def test_a_corrupt_download_is_refused_in_one_line_and_nothing_lands(
    site, tmp_path, capsys, monkeypatch
):
    data = b"the served bytes, one of them changed on the way"
    site.files["/blob"] = data
    expected = sha256(data.replace(b"one", b"One"))
    monkeypatch.setitem(DATASETS, "tiny", (Remote("tiny/blob", expected, (f"{site.url}/blob",)),))
    assert main(["data", "fetch", "tiny", "--data-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"refused {tmp_path / 'tiny' / 'blob.part'}: checksum {sha256(data)}" in err
    assert f"expected {expected}" in err
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == []  # neither file nor .part


def test_an_unknown_name_is_refused_in_one_line_listing_the_names(capsys):
    assert main(["data", "fetch", "svhn"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "'svhn'" in err and "mnist, fashion-mnist, cifar10, libsvm" in err


def test_the_next_mirror_serves_when_one_fails_and_all_failing_is_one_line(site, tmp_path):
    site.files["/b/blob"] = data = b"served by the second mirror"
    urls = (f"{site.url}/a/blob", f"{site.url}/b/blob")
    fetch((Remote("blob", sha256(data), urls),), tmp_path, print)
    assert (tmp_path / "blob").read_bytes() == data
    assert [path for path, _, _ in site.log] == ["/b/blob"]  # /a/blob answered 404
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}/blob"
    with pytest.raises(FewshotError) as refused:
        fetch((Remote("other", sha256(data), (urls[0], nowhere)),), tmp_path, print)
    message = str(refused.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"cannot download other: {urls[0]}: HTTP 404 Not Found; {nowhere}: ")
    assert "refused" in message  # the connection's


def test_a_file_already_there_is_checked_not_downloaded(site, tmp_path):
    (tmp_path / "blob").write_bytes(b"someone else's copy")
    remote = Remote("blob", sha256(b"the expected copy"), (f"{site.url}/blob",))
    with pytest.raises(FewshotError, match=r"blob is there with checksum [0-9a-f]{64}, expected"):
        fetch((remote,), tmp_path, print)
    assert site.log == [] and (tmp_path / "blob").read_bytes() == b"someone else's copy"


def test_ctrl_c_keeps_a_part_that_the_next_fetch_resumes(site, tmp_path):
    data = np.random.default_rng(1).bytes(200_000)
    site.files["/blob"], site.stall["/blob"] = data, 50_000
    remote = Remote("tiny/blob", sha256(data), (f"{site.url}/blob",))
    script = (
        "import sys; from fewshot.cli.main import main; from fewshot.datasets import fetch; "
        "fetch.DATASETS['tiny'] = (fetch.Remote('tiny/blob', sys.argv[1], (sys.argv[2],)),); "
        "sys.exit(main(['data', 'fetch', 'tiny', '--data-root', sys.argv[3]]))"
    )
    command = [sys.executable, "-c", script, remote.digest, remote.urls[0], str(tmp_path)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    part = tmp_path / "tiny" / "blob.part"
    deadline = time.monotonic() + 120
    while process.poll() is None and time.monotonic() < deadline:
        if part.exists() and part.stat().st_size == 50_000:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGINT, err
    assert err.strip() == (
        f"fewshot data fetch: interrupted: {part} kept (50000 bytes): "
        "run the command again to resume"
    )
    assert part.read_bytes() == data[:50_000] and not (tmp_path / "tiny" / "blob").exists()
    site.release.set()
    del site.stall["/blob"]
    fetch((remote,), tmp_path, print)
    assert site.log[-1] == ("/blob", "bytes=50000-", 150_000)
    assert (tmp_path / "tiny" / "blob").read_bytes() == data


def test_cifar10_splits_one_archive_of_its_repository_into_the_readers_tarballs(site, tmp_path):
    red, blue = jpeg((200, 30, 30)), jpeg((20, 40, 220))
    archive = tar_bytes(
        {
            "CIFAR-10-images-abc/README.md": b"not an image",
            "CIFAR-10-images-abc/train/truck/0000.jpg": blue,
            "CIFAR-10-images-abc/train/airplane/0000.jpg": red,
            "CIFAR-10-images-abc/test/airplane/0000.jpg": blue,
        }
    )
    site.files["/archive"] = archive
    # The digests a split must have, from archives written another way (other folder, no gzip).
    digests = {
        "train": image_digest(
            tar_bytes({"x/train/airplane/0000.jpg": red, "x/train/truck/0000.jpg": blue}, "w")
        ),
        "test": image_digest(tar_bytes({"y/test/airplane/0000.jpg": blue}, "w")),
    }
    remotes = tuple(
        dataclasses.replace(r, urls=(f"{site.url}/archive",), digest=digests[split])
        for r, split in zip(DATASETS["cifar10"], ("train", "test"), strict=True)
    )
    fetch(remotes, tmp_path, print)
    assert len(site.log) == 1  # one download serves both splits
    assert not list(tmp_path.rglob("*.part"))
    train = load_image_dataset("cifar10", "train", tmp_path)
    assert train.labels.tolist() == [0, 9]  # airplane, truck: class order
    assert load_image_dataset("cifar10", "test", tmp_path).labels.tolist() == [0]


def test_image_digest_changes_with_any_image_and_refuses_a_broken_archive():
    one = {"a/train/cat/0.jpg": b"1", "a/train/dog/0.jpg": b"2"}
    assert image_digest(tar_bytes(one)) == image_digest(tar_bytes(dict(reversed(one.items()))))
    assert image_digest(tar_bytes(one)) != image_digest(
        tar_bytes({**one, "a/train/dog/0.jpg": b"3"})
    )
    assert image_digest(tar_bytes(one)[:-100]) == "unreadable"


def test_libsvm_conversions_against_hand_written_files(tmp_path):
    served = b"0 3:1 11:1 123:0\n1 5:1 \n\n0 2:1 \n"
    assert relabel(served, tmp_path) == b"-1 3:1 11:1 \n+1 5:1 \n-1 2:1 \n"
    folder = tmp_path / "libsvm" / "classification"
    folder.mkdir(parents=True)
    (folder / "a9a").write_bytes(b"-1 1:1 \n+1 2:1 \n-1 1:1 \n+1 3:1 \n")
    (folder / "a8a").write_bytes(b"-1 1:1 \n+1 3:1 \n")
    assert a9a_less_a8a(b"", tmp_path) == b"+1 2:1 \n-1 1:1 \n"  # one of the two equal rows stays


@pytest.mark.parametrize("name", ["libsvm", "cifar10"])
def test_recorded_checksums_match_the_real_files(real_data, name):
    """The LIBSVM and CIFAR-10 checksums are those of the copies the project's results used
    (MNIST's and Fashion-MNIST's are the published archives', which those copies recompress)."""
    root = real_data(name)
    for remote in DATASETS[name]:
        assert remote.measure((root / remote.path).read_bytes()) == remote.digest, remote.path
    if name == "libsvm":
        assert sha256(a9a_less_a8a(b"", root)) == LIBSVM_FILES["a8a.t"][1]


def test_libsvm_fetches_every_set_file_the_repository_does_not_ship():
    needed = {
        f"libsvm/{s.task}/{name}"
        for s in LIBSVM_SETS.values()
        for name in (s.train_file, s.test_file)
        if name and not (REPO_DATA / "libsvm" / s.task / f"{name}.gz").exists()
    }
    assert {remote.path for remote in DATASETS["libsvm"]} == needed

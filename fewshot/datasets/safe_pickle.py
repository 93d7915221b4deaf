"""A restricted unpickler for dataset files: plain containers, numbers, strings and numpy arrays.

Pickles run code by naming globals (functions and classes) that the loader calls. This loader
resolves only an allowlist of harmless ones, so a file that names anything else (os.system,
builtins.eval, a user class) is refused before any call is made.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

from fewshot.runtime.errors import FewshotError

# numpy moved its internals from numpy.core to numpy._core in 2.0; pickles name either.
_NUMPY_CORE = ("numpy.core", "numpy._core")

ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    [("numpy", "ndarray"), ("numpy", "dtype")]
    + [(f"{core}.multiarray", name) for core in _NUMPY_CORE for name in ("_reconstruct", "scalar")]
    + [(f"{core}.numeric", "_frombuffer") for core in _NUMPY_CORE]
    # Protocol-2 pickles written by Python 3 store bytes as _codecs.encode(text, "latin1").
    + [("_codecs", "encode")]
    + [("collections", "OrderedDict")]
    # Python 2 pickles say __builtin__ where Python 3 says builtins.
    + [
        (module, name)
        for module in ("builtins", "__builtin__")
        for name in ("set", "frozenset", "bytearray", "complex", "list", "dict", "tuple")
    ]
)


class _RestrictedUnpickler(pickle.Unpickler):
    """pickle.Unpickler whose find_class admits only ALLOWED_GLOBALS."""

    def find_class(self, module: str, name: str) -> Any:
        """Resolve a global only if it is on the allowlist."""
        if (module, name) not in ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"refused global {module}.{name}")
        return super().find_class(module, name)


def safe_load(path: str | os.PathLike) -> Any:
    """Unpickle a dataset file, admitting only plain containers, numbers, text and numpy arrays.

    latin1 decoding lets Python 2 pickles (MetaOptNet's, CIFAR-100's) load: their byte strings,
    including numpy array buffers, come back intact.
    """
    path = Path(path)
    if not path.is_file():
        raise FewshotError(f"missing file {path}")
    try:
        with open(path, "rb") as f:
            return _RestrictedUnpickler(f, encoding="latin1").load()
    except pickle.UnpicklingError as e:
        raise FewshotError(f"{path}: unsafe or corrupt pickle ({e}); it was not loaded") from None
    except (EOFError, ValueError, TypeError, AttributeError, ImportError, IndexError) as e:
        raise FewshotError(f"{path}: corrupt pickle ({type(e).__name__}: {e})") from None

"""The study drivers' evaluation cache: an evaluation of another file than the checkpoint now
at its path is made again."""

from __future__ import annotations

import hashlib
import json

from experiments.cli_runs import stale


def test_an_evaluation_is_stale_once_its_checkpoint_file_changes(tmp_path):
    checkpoint = tmp_path / "model.pt"
    checkpoint.write_bytes(b"first weights")
    cached = tmp_path / "eval.json"
    digest = hashlib.sha256(b"first weights").hexdigest()
    cached.write_text(json.dumps({"accuracy": 99.0, "checkpoint_sha256": digest}))
    assert not stale(cached, str(checkpoint))
    checkpoint.write_bytes(b"weights shipped since")
    assert stale(cached, str(checkpoint))
    # A run folder gone keeps its evaluation, as does a record without a hash.
    assert not stale(cached, str(tmp_path / "gone.pt"))
    cached.write_text(json.dumps({"accuracy": 99.0}))
    assert not stale(cached, str(checkpoint))

"""Running the command line in tests and reading its one-line refusals."""

from __future__ import annotations

from fewshot.cli.main import main


def error_line(capsys, args: list[str]) -> str:
    """Run the CLI, expect exit status 2 and exactly one line on stderr; return it."""
    try:
        code = main(args)
    except SystemExit as e:  # argparse refuses malformed flag values itself
        code = e.code
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in captured.err
    return err

"""The one exception type for user mistakes (bad flags, files, shapes)."""


class FewshotError(Exception):
    """A user-facing error: the CLI prints its message on one line and exits non-zero."""

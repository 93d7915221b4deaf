"""The one exception type for user mistakes (bad flags, files, shapes)."""


class FewshotError(Exception):
    """A user-facing error: the CLI prints its message on one line and exits non-zero."""


def summary(error: BaseException, limit: int = 300) -> str:
    """The telling line of an exception's message: torch and zlib write several, often under a
    generic title ending in ':' (e.g. 'Error(s) in loading state_dict for X:')."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    telling = [line for line in lines if not line.endswith(":")] or lines or [type(error).__name__]
    return telling[0][:limit]

"""Files that appear whole or not at all: written under a temporary name beside their place, then renamed.

A reader (or a run killed half-way) never sees half a checkpoint, corpus or result file.
"""

import contextlib
import os
import secrets


@contextlib.contextmanager
def replace_when_done(path):
    """A binary file, open for writing beside `path`, that becomes `path` only if the with-block completes.

    os.open's mode 0o666 (less the umask) gives the file a plain open()'s permissions, which
    tempfile's 0o600 would not; fsync puts the bytes on disk before the rename publishes them.
    """
    directory, name = os.path.split(os.fspath(path))
    temporary = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)  # only still there when something failed


def write_atomically(path, data):
    """Write bytes to `path` so that no reader ever sees half a file."""
    with replace_when_done(path) as file:
        file.write(data)

"""Atomic file writing: a temp file in the target's folder, fsync, rename.
A crash mid-write never leaves a half file under the final name."""
import os
import sys


def atomic_write(path, chunks):
    """Write an iterable of bytes-like chunks to path atomically."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            for c in chunks:
                f.write(c)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        try:
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def progress_bar(total, desc, enabled=True, unit="it"):
    """A tqdm bar on stderr when tqdm is installed and enabled, else None."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr)

"""Where a job writes: never into its input, never over an output without
``--overwrite``, and never half of one.

:func:`check_output` refuses, on real paths (symlinks resolved), an output that is
the input, lies inside it or holds it, an output that is a file, and an output
folder that is not empty unless ``overwrite`` is given. All before Spark starts.

:func:`staged_output` gives the job a fresh temporary folder beside the output
(``.<name>.partial-<random>``, same file system) and moves it into place only when
the job has succeeded:

* no output yet (or an empty folder): the temporary folder is renamed to it;
* ``overwrite``: the old output is renamed aside (``.<name>.old-<random>``), the new
  one renamed into place, then the old one deleted.

A job that fails or is interrupted leaves the output exactly as it was and removes
its temporary folder. A process killed outright (``kill -9``, power loss) may leave a
``.<name>.partial-*`` folder (delete it), and one killed between the two renames of
an overwrite leaves the old output complete as ``.<name>.old-*`` next to the new one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from collections.abc import Iterator

from ._inputs import JobError

__all__ = ["check_output", "staged_output"]


def _sibling(parent: str, name: str, kind: str) -> str:
    """Create and return a new folder ``.<name>.<kind>-<random>`` in ``parent``
    (with the process's usual permissions, unlike ``tempfile.mkdtemp``)."""
    while True:
        path = os.path.join(parent, f".{name}.{kind}-{secrets.token_hex(4)}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue


def _inside(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip(os.sep) + os.sep)


def check_output(input_dir: str, output_dir: str, overwrite: bool = False) -> None:
    """Refuse an output the job must not write (see the module's docstring).

    Raises:
        JobError: one line saying why and what to do.
    """
    src = os.path.realpath(input_dir)
    out = os.path.realpath(output_dir)
    if out == src:
        raise JobError(f"the output {output_dir} is the input ({src}): write the job's output to another folder")
    if _inside(out, src):
        raise JobError(f"the output {output_dir} is inside the input ({src}): write the job's output outside it")
    if _inside(src, out):
        raise JobError(f"the output {output_dir} holds the input ({src}): write the job's output to another folder")
    if os.path.lexists(output_dir) and not os.path.isdir(output_dir):
        raise JobError(f"the output {output_dir} is a file, not a folder")
    if os.path.isdir(output_dir) and os.listdir(output_dir) and not overwrite:
        raise JobError(f"the output {output_dir} is not empty: pass --overwrite to replace it, or choose a new folder")


@contextlib.contextmanager
def staged_output(input_dir: str, output_dir: str, overwrite: bool = False) -> Iterator[str]:
    """Check the output, yield a fresh temporary folder beside it to write into, and
    put that folder in the output's place once the block has succeeded.

    Raises:
        JobError: see :func:`check_output` (checked again here, just before writing).
    """
    check_output(input_dir, output_dir, overwrite)
    out = os.path.realpath(output_dir)  # a symlinked output: replace what it points to
    parent, name = os.path.split(out)
    os.makedirs(parent, exist_ok=True)
    tmp = _sibling(parent, name, "partial")
    try:
        yield tmp
        if os.path.isdir(out) and os.listdir(out):
            old = _sibling(parent, name, "old")
            os.replace(out, old)  # rename over the empty folder mkdtemp made
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)  # over an empty folder, or to a new name
    except BaseException:
        _remove(tmp)
        raise


def _remove(path: str, attempts: int = 20) -> None:
    """Delete ``path`` even while a straggling writer (a cancelled Spark task) still
    adds files to it for a moment."""
    for _ in range(attempts):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            time.sleep(0.2)
            if not os.path.exists(path):
                return
        else:
            time.sleep(0.2)

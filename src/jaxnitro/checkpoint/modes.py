"""File modes as the process umask gives them: records, manifests and bundles are
files like any other, readable as the umask allows (a team shares a run directory),
whatever mode their temporary writer (mkstemp, mkdtemp, safetensors) created them
with."""

from __future__ import annotations

import os

FILE_MODE = 0o666  # what `open()` creates a file with, before the umask
FOLDER_MODE = 0o777  # what `os.mkdir` creates a folder with, before the umask


def new_file_mode() -> int:
    """The mode the process umask gives a new file (`-rw-r--r--` under 022)."""
    return FILE_MODE & ~process_umask()


def process_umask() -> int:
    """The process umask, read without changing it where the system allows
    (`/proc/self/status` on Linux): setting it to read it back races with other
    threads creating files."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(top: str) -> None:
    """Give a folder written through temporary names, and everything in it, the
    modes the process umask gives new ones: 0o777 & ~umask for folders (mkdtemp
    makes `drwx-------`), 0o666 & ~umask for files (whatever their writer set).
    Symbolic links are left alone."""
    mask = process_umask()
    os.chmod(top, FOLDER_MODE & ~mask)
    for folder, dirs, files in os.walk(top):
        for name in dirs:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, FOLDER_MODE & ~mask)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, FILE_MODE & ~mask)

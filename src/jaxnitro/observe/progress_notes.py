"""The note stack: what user code shows beside the current phase.

`with_progress_note` blocks stack and the innermost is shown; `progress_note` replaces
the innermost block's note, or, outside any block, sets a loose note. Leaving a block
restores the note around it. A new phase or stretch clears every note, including
those of blocks still open (their notes stay cleared when they are left).

Example:
    >>> notes = NoteStack()
    >>> outer = notes.push("loading index")
    >>> inner = notes.push("decoding 1/2")
    >>> notes.shown()
    'decoding 1/2'
    >>> notes.set("decoding 2/2")
    'decoding 2/2'
    >>> notes.pop(inner)
    'loading index'
    >>> notes.clear(); notes.pop(outer)
    ''
"""

from __future__ import annotations

import threading


class NoteStack:
    """Block notes, innermost last, and the loose note; thread-safe.

    Each method that changes the stack returns the note to show afterwards.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: list[list[str]] = []  # one cell per open block, by identity
        self._loose = ""

    def shown(self) -> str:
        """The note on display: the innermost block's, else the loose one."""
        with self._lock:
            return self._shown()

    def set(self, note: str) -> str:
        """Replace the innermost block's note, or the loose note outside blocks."""
        with self._lock:
            if self._blocks:
                self._blocks[-1][0] = note
            else:
                self._loose = note
            return self._shown()

    def push(self, note: str) -> list[str]:
        """Open a block showing `note`; returns the token `pop` takes."""
        cell = [note]
        with self._lock:
            self._blocks.append(cell)
        return cell

    def pop(self, token: list[str]) -> str:
        """Close the block `push` returned (wherever it is in the stack)."""
        with self._lock:
            for index in range(len(self._blocks) - 1, -1, -1):
                if self._blocks[index] is token:
                    del self._blocks[index]
                    break
            return self._shown()

    def clear(self) -> None:
        """Clear every note: a new phase or stretch began."""
        with self._lock:
            for cell in self._blocks:
                cell[0] = ""
            self._loose = ""

    def _shown(self) -> str:
        return self._blocks[-1][0] if self._blocks else self._loose

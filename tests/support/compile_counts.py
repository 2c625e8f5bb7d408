"""What a test reads of the compile cache: the program kinds a call compiled."""

from jaxnitro.compile.cache import program_cache


def kinds_compiled(run):
    """The program kinds `run()` added to the cache (each kind once)."""
    before = set(program_cache().program_keys())
    run()
    return sorted({key.kind for key in set(program_cache().program_keys()) - before})

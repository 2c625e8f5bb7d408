"""Data: the source protocol, the Grain adapter, prefetch streams, padding, readers."""

from .arrays import ArraySource as ArraySource
from .batch_at_check import check_batch_at as check_batch_at
from .prefetch import NoPrefetch as NoPrefetch
from .prefetch import PrefetchConfig as PrefetchConfig
from .prefetch import PrefetchIterator as PrefetchIterator
from .prefetch import auto_prefetch as auto_prefetch
from .prefetch import batch_stream as batch_stream
from .prefetch import default_prefetch_workers as default_prefetch_workers
from .prefetch import eval_stream as eval_stream
from .prefetch import prefetch_config as prefetch_config
from .protocol import BatchSource as BatchSource
from .protocol import IndexedSource as IndexedSource
from .protocol import epoch_token as epoch_token
from .protocol import fanout_capable as fanout_capable
from .sources import check_source_options as check_source_options
from .stream import PrefetchStream as PrefetchStream

__all__ = [
    "ArraySource",
    "BatchSource",
    "IndexedSource",
    "NoPrefetch",
    "PrefetchConfig",
    "PrefetchIterator",
    "PrefetchStream",
    "auto_prefetch",
    "batch_stream",
    "check_batch_at",
    "check_source_options",
    "default_prefetch_workers",
    "epoch_token",
    "eval_stream",
    "fanout_capable",
    "prefetch_config",
]

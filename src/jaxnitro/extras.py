"""Lazy imports of optional packages, failing with the extra that installs them.

The core depends on JAX, Optax, NumPy, safetensors and rich only. A feature built on an
optional package imports it when first used, through `require`:

    >>> require("math", extra="none", feature="this example").sqrt(4.0)
    2.0
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingExtraError

MISSING_EXTRA = (
    "{feature} needs the `{module}` package, which is not installed ({error}). "
    "Install the `{extra}` extra: pip install 'jaxnitro[{extra}]'."
)


def require(module: str, *, extra: str, feature: str) -> ModuleType:
    """Import `module`, or raise `MissingExtraError` naming the extra to install.

    Args:
        module: the dotted module name to import, such as "tensorboardX".
        extra: the jaxnitro extra that installs it, such as "tensorboard".
        feature: what needs it, for the message, such as "TensorBoardLogger".
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingExtraError(
            MISSING_EXTRA.format(
                feature=feature, module=module, error=error, extra=extra
            )
        ) from error

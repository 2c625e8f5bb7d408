"""`StrippedHost`: the sentinel traced code sees in place of every Host field.

The tracer never walks a Host field: `compile_view` replaces it with this sentinel,
which carries only the field's name. Using the sentinel in traced code (arithmetic,
indexing, iteration, attribute access, conversion to an array or a number) raises an
error naming the field and the fixes. Storing it, hashing it or comparing it for
equality raises nothing, so it can sit in a static pytree slot.
"""

from __future__ import annotations

from typing import Any, NoReturn

from ..errors import StrippedHostError

STRIPPED_HOST_MESSAGE = """\
Traced code used the Host field `{field}` of {owner} ({operation}).
Host fields never reach the tracer: compile_view(e).{field} is StrippedHost('{field}'),
so a dataset-sized value is never walked by a compile. Three fixes, by what it is:
  1. structural (a width, a layer count, a variant name): mark it `GraphConst[...]`;
     it bakes into the graph and a new value compiles a new program.
  2. a number or array to sweep or schedule without recompiling: mark it
     `Device[...]`; it becomes a traced input.
  3. data or a driver setting: read it host-side (in build_data, derive,
     finalize_metrics or an accessor) and pass what the trace needs through the batch
     or a Device field."""


class StrippedHost:
    """The value `compile_view` substitutes for a Host field.

    Examples:
        >>> s = StrippedHost("images", "MyExp")
        >>> s
        StrippedHost('images')
        >>> s + 1
        Traceback (most recent call last):
        ...
        jaxnitro.errors.StrippedHostError: Traced code used the Host field `images` ...
    """

    __slots__ = ("_jaxnitro_field", "_jaxnitro_owner")

    def __init__(self, field: str, owner: str = "the experiment") -> None:
        object.__setattr__(self, "_jaxnitro_field", field)
        object.__setattr__(self, "_jaxnitro_owner", owner)

    def __repr__(self) -> str:
        return f"StrippedHost({self._jaxnitro_field!r})"

    __str__ = __repr__

    def __hash__(self) -> int:
        return hash(("jaxnitro.StrippedHost", self._jaxnitro_field))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, StrippedHost)
            and other._jaxnitro_field == self._jaxnitro_field
        )

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __reduce__(self) -> NoReturn:
        self._raise("serialization")

    def __copy__(self) -> StrippedHost:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> StrippedHost:
        return self

    def _raise(self, operation: str) -> NoReturn:
        raise StrippedHostError(
            STRIPPED_HOST_MESSAGE.format(
                field=self._jaxnitro_field,
                owner=self._jaxnitro_owner,
                operation=operation,
            )
        )

    def __getattr__(self, name: str) -> NoReturn:
        if name.startswith("__array"):  # NumPy probes these before __array__
            self._raise("conversion to an array")
        if name == "aval":  # JAX probes this before __jax_array__
            self._raise("conversion to a JAX array")
        self._raise(f"attribute `.{name}`")

    def __setattr__(self, name: str, value: object) -> NoReturn:
        self._raise(f"setting attribute `.{name}`")

    def __getitem__(self, key: object) -> NoReturn:
        self._raise("indexing")

    def __setitem__(self, key: object, value: object) -> NoReturn:
        self._raise("item assignment")

    def __iter__(self) -> NoReturn:
        self._raise("iteration")

    def __len__(self) -> NoReturn:
        self._raise("len()")

    def __contains__(self, item: object) -> NoReturn:
        self._raise("`in`")

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        self._raise("a call")

    def __bool__(self) -> NoReturn:
        self._raise("conversion to bool (an `if` or `and`/`or`)")

    def __float__(self) -> NoReturn:
        self._raise("float()")

    def __int__(self) -> NoReturn:
        self._raise("int()")

    def __index__(self) -> NoReturn:
        self._raise("use as an index")

    def __complex__(self) -> NoReturn:
        self._raise("complex()")

    def __array__(self, *args: object, **kwargs: object) -> NoReturn:
        self._raise("conversion to an array")

    # A property, not a method: JAX reads `getattr(x, "__jax_array__", None)` and,
    # when it is not None, raises its own error that names no field (JAX 0.10 refuses
    # `__jax_array__` during abstractification, as in `jnp.sum(x)`). Raising on the
    # read itself reaches every such probe first.
    @property
    def __jax_array__(self) -> NoReturn:
        self._raise("conversion to a JAX array")


def _make_operator(symbol: str) -> Any:
    def operator(self: StrippedHost, *args: object) -> NoReturn:
        self._raise(f"the operator `{symbol}`")

    return operator


_OPERATORS = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "truediv": "/",
    "floordiv": "//",
    "mod": "%",
    "pow": "**",
    "matmul": "@",
    "and": "&",
    "or": "|",
    "xor": "^",
    "lshift": "<<",
    "rshift": ">>",
    "divmod": "divmod",
}
for _name, _symbol in _OPERATORS.items():
    setattr(StrippedHost, f"__{_name}__", _make_operator(_symbol))
    setattr(StrippedHost, f"__r{_name}__", _make_operator(_symbol))
for _name, _symbol in {
    "neg": "unary -",
    "pos": "unary +",
    "abs": "abs()",
    "invert": "~",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "round": "round()",
}.items():
    setattr(StrippedHost, f"__{_name}__", _make_operator(_symbol))


def is_stripped(value: object) -> bool:
    """Whether `value` is a `StrippedHost` sentinel."""
    return type(value) is StrippedHost


def _refuse_as_operand(value: StrippedHost) -> NoReturn:
    value._raise("an operand of a jax.lax operation")


def _register_with_jax() -> None:
    # jax.lax primitives convert their operands through JAX's own value handlers,
    # with none of NumPy's or jnp's probes, and wrap a failure in a TypeError naming
    # only the type. A handler for the sentinel raises its own error instead, which
    # passes through (it is not a TypeError). The hook is JAX-internal: without it,
    # JAX's TypeError stands.
    try:
        from jax._src import dtypes

        register = dtypes.register_canonicalize_value_handler
    except (ImportError, AttributeError):
        return
    register(StrippedHost, _refuse_as_operand)


_register_with_jax()

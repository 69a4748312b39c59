"""``map_pipeline`` over xarray DataArrays: their dimensions matched by name to the pipeline's,
which ``dims`` names (Halide's buffers have numbered dimensions only), and the outputs made
DataArrays by ``xr.apply_ufunc``, so that alignment, coordinates, names and attributes follow
xarray's own rules (and options, such as ``keep_attrs``) as in any ``apply_ufunc`` call with
``dask="allowed"``. The chunked graph itself is ``chunked.map_pipeline``'s, over the
DataArrays' data transposed to the pipeline's order (lazily, for dask-backed data).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import xarray as xr

from shim.base.errors import ArgumentError
from shim.dask import chunked


def map_pipeline(pipeline, arrays: tuple, dims, options: dict, scalars: dict):
    """shim.dask.map_pipeline with at least one DataArray among ``arrays`` (its docstring says
    what the arguments are): a DataArray per output, or a tuple of them."""
    names = [a.name for a in pipeline.inputs if a.is_buffer]

    def name_of(i: int) -> str:
        return names[i] if i < len(names) else f"arrays[{i}]"

    for i, array in enumerate(arrays):
        if isinstance(array, xr.Dataset):
            raise ArgumentError(name_of(i), f"expected an array, got an xarray Dataset (of "
                                            f"{', '.join(map(str, array.data_vars))}): pass "
                                            f"one of its variables, ds[name]")
    arrays = [_lazy(a) if isinstance(a, xr.DataArray) else a for a in arrays]
    labelled = [a for a in arrays if isinstance(a, xr.DataArray)]
    dims = _dims(dims, labelled[0])
    core = [_core_dims(name_of(i), a, dims) if isinstance(a, xr.DataArray) else []
            for i, a in enumerate(arrays)]
    data = [a.transpose(*c).data if isinstance(a, xr.DataArray) else a
            for a, c in zip(arrays, core)]
    options = dict(options, chunks=_chunks(options["chunks"], dims))
    out_shape = chunked.output_shape(pipeline, *data, shape=options["shape"], **scalars)
    if len(out_shape) != len(dims):
        raise ArgumentError("dims", f"names {len(dims)} dimensions {dims}, and "
                                    f"{pipeline.name}'s outputs have {len(out_shape)}: name "
                                    f"those, in numpy order")
    size_of = dict(zip(dims, out_shape))
    # The dimensions whose size the pipeline changes: apply_ufunc leaves them out of alignment
    # and drops the inputs' coordinates along them.
    resized = {d for a in labelled for d in a.dims if a.sizes[d] != size_of[d]}
    try:
        xr.align(*labelled, join="exact", exclude=resized)
    except ValueError as e:  # (xarray's AlignmentError)
        raise ArgumentError("arrays", f"the DataArrays' coordinates differ: {e}") from None

    def run(*data):
        return chunked.map_pipeline(pipeline, *data, **options, **scalars)

    return xr.apply_ufunc(run, *arrays, input_core_dims=core,
                          output_core_dims=[list(dims)] * len(pipeline.outputs),
                          exclude_dims=resized, dask="allowed")


def _dims(dims, first) -> tuple:
    """``dims=`` checked: distinct names, numpy order; by default the first DataArray's."""
    if dims is None:
        return tuple(first.dims)
    if isinstance(dims, (str, bytes)) or not _is_sequence(dims):
        raise ArgumentError("dims", f"expected the pipeline's dimension names in numpy order, "
                                    f"a sequence such as ('y', 'x'), got {dims!r}")
    dims = tuple(dims)
    if not all(isinstance(d, Hashable) for d in dims) or len(set(dims)) != len(dims):
        raise ArgumentError("dims", f"expected distinct dimension names, got {dims!r}")
    return dims


def _is_sequence(value) -> bool:
    try:
        iter(value)
    except TypeError:
        return False
    return not isinstance(value, Mapping)


def _core_dims(name: str, array, dims: tuple) -> list:
    """The dimensions of one DataArray in the pipeline's order (those it has of ``dims``)."""
    others = [d for d in array.dims if d not in dims]
    if others:
        raise ArgumentError(name, f"has dimensions {others} that dims={dims} does not name: "
                                  f"the pipeline runs over those only; select along the others "
                                  f"(.isel), or name them all in dims=")
    return [d for d in dims if d in array.dims]


def _lazy(array):
    """A DataArray backed by dask: as it is, or, where it is not (opened without ``chunks=``,
    or in memory), chunked lazily, in its store's chunks where it has them, since its
    ``.data`` would read it whole."""
    if array.chunks is not None:
        return array
    return array.chunk(array.encoding.get("preferred_chunks") or "auto")


def _chunks(chunks, dims: tuple):
    """``chunks=`` by dimension name as dask's per-axis dict; any other form as given."""
    if not isinstance(chunks, Mapping):
        return chunks
    unknown = [name for name in chunks if name not in dims]
    if unknown:
        raise ArgumentError("chunks", f"names {unknown}, not among the dimensions {dims}")
    return {dims.index(name): size for name, size in chunks.items()}

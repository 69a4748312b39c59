"""Pipelines over chunked data, on dask: ``map_pipeline`` over dask arrays and stored arrays
(``chunked``: the graph, one task per output chunk, each fed the input region the bounds query
names), and over xarray DataArrays (``labelled``: dimensions by name, coordinates carried);
``open_tiff``, a TIFF file that the workers read themselves through tifffile's Zarr interface
(``tiff``).

The public API's layer, beside ``shim/__init__.py``: needs the ``dask`` extra, which ``import
shim`` does not import; xarray, zarr and tifffile are imported only where they are used.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shim.base.errors import ArgumentError
from shim.calls.pipeline import Pipeline
from shim.dask import chunked
from shim.dask.tiff import TiffSource, open_tiff

if TYPE_CHECKING:
    from numpy.typing import ArrayLike, DTypeLike

__all__ = ["map_pipeline", "open_tiff", "TiffSource"]


# (Typed Any: it returns a dask Array, or a tuple of them for a pipeline of several outputs,
# or DataArrays, which only the loaded pipeline and the inputs tell; ``chunks`` takes any of
# dask's forms.)
def map_pipeline(pipeline: Pipeline, *arrays: ArrayLike | Any, dims: Sequence[str] | None = None,
                 output_dtype: DTypeLike | Sequence[DTypeLike] | None = None, chunks: Any = None,
                 shape: Sequence[int] | None = None, device: str | None = None,
                 keep_on_device: bool = False, **scalars: object) -> Any:
    """Run ``pipeline`` over chunked arrays, chunk by chunk; returns its output as a dask
    array (a tuple of them for several outputs), computed when dask computes it, or, where
    an input is an xarray DataArray, as DataArrays.

    ``arrays``: the pipeline's input buffers in order: dask arrays, stored arrays (a Zarr
    array, ``zarr.open_array(path)``, or a TIFF file, ``open_tiff(path)``), xarray DataArrays,
    or anything ``da.asarray`` takes. An array other than a DataArray is in numpy order (x
    last), at mins 0 as numpy arrays given to a call are. Each task reads its region of a
    stored array from the store itself, so a worker holds no input between tasks (its peak
    memory follows the chunk size, not the image's); a dask array's blocks (``da.from_zarr``
    too) are each computed once and held until the chunks whose regions span them are done.
    ``scalars``: by name, the same for every chunk. ``output_dtype``: checked against the
    pipeline's (a dtype, or one per output). ``shape``: the outputs' shape in numpy order;
    without it, sized as a call sizes an omitted output (like the first input, else from the
    estimates). ``chunks``: the outputs' chunks (dask's forms; with DataArrays, also a dict
    by dimension name, a dimension left out in one chunk as in dask's dict by axis); by
    default the first input's. ``device``: a device kind
    (``"opencl"``) the pipeline was built for: each task uploads its inputs to its worker's
    device and downloads its results; input chunks already there (another map_pipeline's,
    kept) are cut and joined there. ``keep_on_device``: the results stay on the device as its
    chunk type (shim/dask_device.py), for the graph's next pipeline.

    DataArrays: ``dims`` names the pipeline's dimensions in numpy order (x, Halide's
    dimension 0, last); by default the first DataArray's own order. Each DataArray is
    transposed by name to that order (one with fewer dimensions takes those it has, in that
    order), inputs are aligned as ``xr.apply_ufunc`` aligns them (``join="exact"``), and each
    output is a DataArray with those dimensions, its name, coordinates and attributes those
    ``xr.apply_ufunc`` gives it, along every dimension whose size the output keeps (one whose
    size it changes loses its coordinates: they no longer label the output's pixels). A
    DataArray not backed by dask (opened without ``chunks=``) is chunked lazily, in its
    store's chunks where it has them, rather than read whole.

    Raises, before any task runs, what one call over the whole arrays would raise for
    arguments that do not fit (a BoundsError for an input too small for the outputs).
    """
    options = dict(output_dtype=output_dtype, chunks=chunks, shape=shape, device=device,
                   keep_on_device=keep_on_device)
    xr = sys.modules.get("xarray")  # (no DataArray exists before xarray is imported)
    if xr is not None and any(isinstance(a, (xr.DataArray, xr.Dataset)) for a in arrays):
        from shim.dask import labelled

        return labelled.map_pipeline(pipeline, arrays, dims, options, scalars)
    if dims is not None:
        raise ArgumentError("dims", f"names the dimensions of xarray DataArrays, and no input "
                                    f"is one (got dims={dims!r})")
    return chunked.map_pipeline(pipeline, *arrays, **options, **scalars)

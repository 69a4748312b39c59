"""OpenCL image memory: Halide's MemoryType::GPUTexture, behind
``halide_opencl_image_device_interface()``, on the OpenCL backend's device, context and queue.

A pipeline that stores an input or output in texture memory asks for this interface itself;
its kernels read and write images at coordinates relative to the buffer's min (launched by
native_stubs/backends/opencl.c, like every OpenCL kernel). As in Halide's runtime, an image
mirrors one buffer that is dense from its innermost dimension up, with 1 to 3 dimensions and a
type OpenCL has a channel type for (8/16/32-bit integers, 16/32-bit floats), one channel
(CL_R) a pixel, and images are not pooled (one fits only buffers of its shape and type).

Unlike Halide's runtime, which refuses every crop of an image but the whole image and copies
only whole images, crops and slices work as they do for buffers: they alias the image (a copy
of a crop moves exactly its pixels, as pieces of the image; a kernel given a crop gets an image
of its own, copied from the parent and back around the launch). And where Halide reads the
depth of a 3-D image from the buffer's second dimension, here it is the third.
"""

from __future__ import annotations

import numpy as np

from shim.backends.base import Backend, BackendError, Memory
from shim.backends.opencl import OpenCLBackend
from shim.base.errors import DeviceUnavailable
from shim.native import ffi, lib
from shim.native.regions import CopyPlan, Layout, host_memory, rectangles


def _cl():
    import pyopencl

    return pyopencl


# Halide type (code, bits) -> OpenCL channel data type, as Halide's runtime maps them.
def _channel_type(type_code: int, bits: int):
    types = _cl().channel_type
    return {
        (0, 8): types.SIGNED_INT8, (0, 16): types.SIGNED_INT16, (0, 32): types.SIGNED_INT32,
        (1, 8): types.UNSIGNED_INT8, (1, 16): types.UNSIGNED_INT16, (1, 32): types.UNSIGNED_INT32,
        (2, 16): types.HALF_FLOAT, (2, 32): types.FLOAT,
    }.get((type_code, bits))


class OpenCLImageMemory(Memory):
    """One image: ``extents`` (width, height, depth; 1 where it has fewer dimensions) of
    ``elem_size``-byte pixels, dense."""

    def __init__(self, image, extents: tuple[int, int, int], dims: int, elem_size: int,
                 owned: bool = True):
        width, height, depth = extents
        super().__init__(width * height * depth * elem_size, owned)
        self.image = image  # pyopencl.Image
        self.extents, self.dims, self.elem_size = extents, dims, elem_size
        self.handles: dict[int, object] = {}  # handle value -> its shim_cl_handle cdata

    def pieces(self, offset: int, nbytes: int):
        """The contiguous bytes [offset, offset + nbytes) of the image as image regions:
        (bytes into the run, origin, region) each, a partial row, whole rows of a slice or
        whole slices at a time."""
        e = self.elem_size
        width, height, _ = self.extents
        row, plane = width * e, width * height * e
        position, end = offset, offset + nbytes
        while position < end:
            x, y, z = position % row // e, position // row % height, position // plane
            left = end - position
            if x or left < row:
                size = min(row - x * e, left)
                region = (size // e, 1, 1)
            elif y or left < plane:
                rows = min(height - y, left // row)
                size, region = rows * row, (width, rows, 1)
            else:
                slices = left // plane
                size, region = slices * plane, (width, height, slices)
            yield position - offset, (x, y, z), region
            position += size

    def region_of(self, offset: int, region: tuple, pitches: tuple) -> tuple | None:
        """(origin, region) of the image that a rectangle copy (shim/native/regions.py) of
        ``region`` (bytes, rows, slices) at ``offset`` with ``pitches`` on the image's side
        covers, if it is one image region: rows and slices one pitch of the image apart, each
        row within a row of the image. None otherwise."""
        e = self.elem_size
        width, height, _ = self.extents
        row, plane = width * e, width * height * e
        size, rows, slices = region
        x, y, z = offset % row // e, offset // row % height, offset // plane
        if (x * e + size > row or size % e or y + rows > height
                or (rows > 1 and pitches[0] != row) or (slices > 1 and pitches[1] != plane)):
            return None
        return (x, y, z), (size // e, rows, slices)


class OpenCLImageBackend(Backend):
    kind = "opencl_image"
    index = lib.SHIM_BACKEND_OPENCL_IMAGE
    api = "opencl"
    # An image fits only a buffer of its own shape and type; Halide's runtime pools none either.
    reuses_allocations = False
    shaped_memory = True

    @classmethod
    def available(cls) -> list[str]:
        return OpenCLBackend.available(images=True)

    def __init__(self, buffers: OpenCLBackend):
        """On ``buffers``, the one OpenCL backend of the process (its context, queue and kernel
        launches): shim.device("opencl_image", ...) makes that first."""
        super().__init__()
        self.buffers = buffers
        if not buffers.images_supported:
            raise DeviceUnavailable(f"{self.buffers.name} has no image memory")

    @property
    def name(self) -> str:
        return f"{self.buffers.name}, image memory"

    def matches(self, **options) -> bool:
        return self.buffers.matches(**options)

    def memory_size(self) -> int:
        return self.buffers.memory_size()

    # --- memory ----------------------------------------------------------------------------

    def _allocate_new(self, nbytes: int) -> Memory:
        raise BackendError("an OpenCL image is made for a buffer's shape and type "
                           "(allocate_for), not for a number of bytes")

    def allocate_for(self, layout: Layout, type_code: int, nbytes: int) -> OpenCLImageMemory:
        dims = len(layout.extents)
        if not 1 <= dims <= 3:
            raise BackendError(f"an OpenCL image has 1 to 3 dimensions, not {dims}")
        e = layout.elem_size
        dense = [e]
        for extent in layout.extents[:-1]:
            dense.append(dense[-1] * extent)
        if list(layout.strides) != dense or nbytes != layout.nbytes_span:
            raise BackendError("an OpenCL image mirrors a buffer dense from its first dimension "
                               f"up (strides {tuple(s // e for s in dense)} elements), not "
                               f"strides {tuple(s // e for s in layout.strides)}")
        channel = _channel_type(type_code, e * 8)
        if channel is None:
            raise BackendError("OpenCL images hold 8-, 16- or 32-bit integers and 16- or 32-bit "
                               f"floats, not Halide type code {type_code} of {e * 8} bits")
        extents = (*layout.extents, *(1,) * (3 - dims))
        cl = _cl()
        fmt = cl.ImageFormat(cl.channel_order.R, channel)
        shape = tuple(layout.extents)
        try:
            image = cl.create_image(self.buffers.context, cl.mem_flags.READ_WRITE, fmt, shape=shape)
        except cl.Error as first:
            if not self.buffers.release_unused():  # the buffers' pool may hold the room
                raise BackendError(f"clCreateImage{shape} failed: {first}") from None
            try:
                image = cl.create_image(self.buffers.context, cl.mem_flags.READ_WRITE, fmt, shape=shape)
            except cl.Error as e:
                raise BackendError(f"clCreateImage{shape} failed: {e}") from None
        memory = OpenCLImageMemory(image, extents, dims, e)
        self._pool.count(fresh=1)
        self._live[id(memory)] = memory
        return memory

    def _free_now(self, memory: OpenCLImageMemory) -> None:
        self._forget_handles(memory)
        memory.image.release()

    def handle(self, memory: OpenCLImageMemory, offset: int, nbytes: int) -> int:
        struct = ffi.new("shim_cl_handle *")
        struct.offset = offset
        struct.mem = ffi.cast("void *", memory.image.int_ptr)
        # The image itself for a buffer that is the whole image; a crop is staged at launches.
        struct.launch_mem = struct.mem if offset == 0 else ffi.NULL
        struct.image_dims = memory.dims
        value = int(ffi.cast("uintptr_t", struct))
        memory.handles[value] = struct
        return value

    def release_handle(self, memory: OpenCLImageMemory, handle: int) -> None:
        struct = memory.handles.pop(handle, None)
        if struct is not None:
            lib.shim_opencl_handle_release(struct)

    def _forget_handles(self, memory: OpenCLImageMemory) -> None:
        for struct in memory.handles.values():
            lib.shim_opencl_handle_release(struct)
        memory.handles.clear()

    def wrap(self, native: int) -> OpenCLImageMemory:
        cl = _cl()
        try:
            image = cl.Image.from_int_ptr(native, retain=True)
            info = cl.image_info
            extents = (image.get_image_info(info.WIDTH), max(image.get_image_info(info.HEIGHT), 1),
                       max(image.get_image_info(info.DEPTH), 1))
            elem = image.get_image_info(info.ELEMENT_SIZE)
            dims = {cl.mem_object_type.IMAGE1D: 1, cl.mem_object_type.IMAGE2D: 2,
                    cl.mem_object_type.IMAGE3D: 3}.get(image.type)
        except cl.Error as e:
            raise BackendError(f"not an OpenCL image: {e}") from None
        if dims is None:
            raise BackendError("only 1-, 2- and 3-D OpenCL images (not arrays or buffers of "
                               "images) hold a Halide buffer")
        return OpenCLImageMemory(image, extents, dims, elem, owned=False)

    def native(self, memory: OpenCLImageMemory) -> int:
        return memory.image.int_ptr

    def detached(self, memory: OpenCLImageMemory) -> None:
        super().detached(memory)
        self._forget_handles(memory)
        if memory.owned:  # the caller's reference now
            _cl().Image.from_int_ptr(memory.image.int_ptr, retain=True)

    # --- copies: image regions, exactly the bytes a plan names -----------------------------

    def write(self, memory: OpenCLImageMemory, plan: CopyPlan, host_address: int) -> None:
        self._transfer(memory, plan, host_memory(host_address, plan.src_span), to_image=True)

    def read(self, memory: OpenCLImageMemory, plan: CopyPlan, host_address: int) -> None:
        self._transfer(memory, plan, host_memory(host_address, plan.dst_span), to_image=False)

    def copy(self, src: OpenCLImageMemory, dst: OpenCLImageMemory, plan: CopyPlan) -> None:
        # Through host memory: the source whole, then the plan's bytes into the destination.
        staging = np.empty(src.nbytes, np.uint8)
        whole = CopyPlan((src.nbytes,), (), ())
        self._transfer(src, whole, staging, to_image=False)
        self._transfer(dst, plan, staging, to_image=True)

    def _transfer(self, memory: OpenCLImageMemory, plan: CopyPlan, host: np.ndarray,
                  to_image: bool) -> None:
        cl = _cl()
        queue = self.buffers.queue
        try:
            for rect in rectangles(plan, whole_rows=True):
                if to_image:
                    image_at, image_pitches = rect.dst_offset, rect.dst_pitches
                    host_at, host_pitches = rect.src_offset, rect.src_pitches
                else:
                    image_at, image_pitches = rect.src_offset, rect.src_pitches
                    host_at, host_pitches = rect.dst_offset, rect.dst_pitches
                whole = memory.region_of(image_at, rect.region, image_pitches)
                if whole is not None:
                    self._enqueue(queue, memory, host[host_at:], *whole, host_pitches, to_image)
                    continue
                # Row by row, each row in as many pieces as it crosses rows of the image.
                for slice_, row in np.ndindex(rect.region[2], rect.region[1]):
                    image_row = image_at + slice_ * image_pitches[1] + row * image_pitches[0]
                    host_row = host_at + slice_ * host_pitches[1] + row * host_pitches[0]
                    for into, origin, piece in memory.pieces(image_row, rect.region[0]):
                        self._enqueue(queue, memory, host[host_row + into:], origin, piece,
                                      None, to_image)
            queue.finish()
        except cl.Error as e:
            raise BackendError(f"OpenCL image {'write' if to_image else 'read'} failed: "
                               f"{e}") from None

    @staticmethod
    def _enqueue(queue, memory, host, origin, region, host_pitches, to_image):
        # pyopencl's raw wrappers: its enqueue_copy refuses 1-D images ("invalid dest mem object
        # type"). Enqueued without blocking, then one clFinish for the whole plan (the
        # contract: complete on return).
        raw = _cl()._cl
        row_pitch, slice_pitch = host_pitches if host_pitches and region[1:] != (1, 1) else (0, 0)
        enqueue = raw._enqueue_write_image if to_image else raw._enqueue_read_image
        enqueue(queue, memory.image, origin, region, host, row_pitch=row_pitch,
                slice_pitch=slice_pitch if region[2] > 1 else 0, is_blocking=False)

    def sync(self) -> None:
        self.buffers.sync()

    def release(self) -> None:
        """Programs are the OpenCL backend's (its release drops them)."""

    # Device timing: the same queue as the OpenCL backend's.

    def timing_origin(self):
        return self.buffers.timing_origin()

    def timing_track(self, stream) -> str:
        return self.buffers.timing_track(stream)

    def timing_marker(self, stream):
        return self.buffers.timing_marker(stream)

    def timing_read(self, origin, before, after) -> tuple[int, int]:
        return self.buffers.timing_read(origin, before, after)

"""Copy plans as the drivers' rectangle copies (shim.native.regions.rectangles): the bytes a sequence
of rectangles moves, done the way clEnqueueCopyBufferRect and cuMemcpy3D define it, equal the
plan's own strided copy done by numpy, and each rectangle keeps the drivers' rules."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shim.native.regions import plan, rectangles


@st.composite
def copies(draw):
    """A box copied between two layouts of the same elements: each side its own dimension
    order and padding, as crops, transposed views and padded pitches give."""
    dims = draw(st.integers(1, 4))
    elem = draw(st.sampled_from([1, 2, 4, 8]))
    extents = draw(st.lists(st.integers(1, 5), min_size=dims, max_size=dims))

    def layout():
        order = draw(st.permutations(range(dims)))
        strides, step = [0] * dims, elem
        for d in order:
            strides[d] = step
            step *= extents[d] + draw(st.integers(0, 2))
        return strides, step

    (src_strides, src_size), (dst_strides, dst_size) = layout(), layout()
    return plan(elem, extents, src_strides, dst_strides), src_size, dst_size


def run_rectangle(rect, src: np.ndarray, dst: np.ndarray) -> None:
    """One rectangle copy as the drivers define it: depth slices of height rows of width bytes."""
    width, height, depth = rect.region
    (src_row, src_slice), (dst_row, dst_slice) = rect.src_pitches, rect.dst_pitches
    for z in range(depth):
        for y in range(height):
            s = rect.src_offset + z * src_slice + y * src_row
            d = rect.dst_offset + z * dst_slice + y * dst_row
            dst[d:d + width] = src[s:s + width]


@settings(max_examples=300, deadline=None)
@given(copies(), st.booleans(), st.sampled_from([None, 16, 64]))
def test_rectangles_move_exactly_the_plans_bytes(case, whole_rows, max_pitch):
    copy, src_size, dst_size = case
    src = np.random.default_rng(0).integers(0, 256, src_size, dtype=np.uint8)
    expected = np.zeros(dst_size, np.uint8)
    copy.dst_view(expected)[...] = copy.src_view(src)
    actual = np.zeros(dst_size, np.uint8)
    rects = list(rectangles(copy, whole_rows=whole_rows, max_pitch=max_pitch))
    for rect in rects:
        width, height, depth = rect.region
        for (row, slice_pitch) in (rect.src_pitches, rect.dst_pitches):
            assert height == 1 or row >= width          # rows do not overlap
            assert depth == 1 or slice_pitch >= row * height
            if whole_rows and depth > 1:
                assert slice_pitch % row == 0           # CUDA: slices are whole rows apart
            if max_pitch is not None and height > 1:
                assert row <= max_pitch
        run_rectangle(rect, src, actual)
    np.testing.assert_array_equal(actual, expected)
    outer = copy.shape[:-1]
    # As few as the rules allow: never more calls than contiguous chunks.
    assert len(rects) <= max(int(np.prod(outer, dtype=np.int64)), 1)


def test_a_padded_image_is_one_rectangle():
    copy = plan(4, (30, 20), (4, 4 * 32), (4, 4 * 30))  # a crop of a padded image, packed
    (rect,) = rectangles(copy, whole_rows=True)
    assert rect.region == (120, 20, 1)
    assert rect.src_pitches[0] == 128 and rect.dst_pitches[0] == 120

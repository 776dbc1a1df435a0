"""a1's hidden inputs: the shapes, masks and tiles of every trial. scaletrain.ops.conformance makes
the tensors of each from the grading seed, here, and computes the float64 reference before the
student's call; the public tests' shapes (issue 27) come last in each list."""

SM_RAGGED = ((613, 781), (3, 37, 129), (100, 3), (2, 2, 5, 11), (2, 3, 45))
SM_EVEN = ((64, 256), (2, 16, 128))
SM_LONG = ((3, 9001), (2, 16411), (2, 9001))
# (scores' shape, options): broadcast masks whose leading indices all matter (the last one: size1 = 6
# with stride 7, size2 = 5 with stride 0), padding masks, (s, s) masks; then causal mode
MASK_CASES = (((2, 3, 37, 37), dict(mask_shape=(37, 37))), ((2, 3, 2, 4, 5), dict(mask_shape=(2, 1, 2, 1, 5))),
              ((2, 9001), dict(mask_shape=(1, 9001), pad=True)), ((2, 3, 5, 7), dict(mask_shape=(2, 3, 1, 7))))
CAUSAL_CASES = (((3, 41, 41), dict(causal=True)),
                ((2, 3, 37, 37), dict(mask_shape=(2, 1, 1, 37), pad=True, causal=True)),
                ((2, 3, 17, 17), dict(mask_shape=(2, 1, 1, 17), pad=True, causal=True)))
SM_16BIT = ((67, 300), (2, 9001))
SM_BWD = ((613, 781), (7, 1), (2, 3, 45), (3, 9001), (31, 257))
SM_BWD_EVEN = ((64, 256), (16, 1024))
LN_SHAPES = ((613, 781), (7, 1), (2, 3, 45), (300, 3), (3, 9001), (31, 257))
DWDB_SHAPES = ((613, 781), (1037, 3), (3, 9001), (301, 97))
# rows in one tile: dw and db from the dx kernel's partial sums, with at most this many persistent
# programs (None: the launcher's count), so a program owns several row blocks or one
PARTIAL_PROGRAMS = (3, None, 1, 2)
PARTIAL_SHAPES = ((613, 781), (1037, 3), (301, 97), (4099, 64))
# tiles the launcher does not pick for these shapes: one row per program, rows of several tiles, a
# tile wider than the row (padding), a partial last program
TILES = ((1, 16), (2, 32), (8, 64), (4, 128))
TILE_SHAPES = ((5, 37), (3, 100))


def emulated_shapes():
    """conformance.BUCKET_SHAPES with a few rows each (the emulator runs a few million elements a second):
    every launcher bucket; 67 rows give a partial last block of 4 warp-rows and two row groups
    of the dweight / dbias reduction."""
    from scaletrain.ops import conformance as cf

    return [(rows, cols) for (_, cols), rows in zip(cf.BUCKET_SHAPES, (67, 9, 7, 5, 6, 3, 3, 2, 2, 2))]

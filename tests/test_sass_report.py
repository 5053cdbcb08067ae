"""The static SASS report (kernels/sass_report.py, sass_loops.py): its parsing on hand-written and on real nvcc output.

The hand-written listings pin the rules (what counts as a load in flight, a use, a loop); the real ones, compiled
from the shipped sources when nvcc and cuobjdump are installed (skipped cleanly otherwise: CI may lack them), check
that the new paged decode keeps >= 4 16-byte loads per lane in flight in both streaming loops and the old one does
not, and the Little's-law estimate that follows.
"""

from __future__ import annotations

import pytest

from minitransformer.kernels.decode_sizing import DECODE_VARIANTS, decode_expressions
from minitransformer.kernels.sass_loops import find_loops, innermost_busiest, parse_sass, split_functions
from minitransformer.kernels.sass_report import (
    HBM_BYTES_PER_S,
    blocks_per_sm,
    compile_sass,
    estimate_decode,
    find_cuobjdump,
    littles_law,
)
from minitransformer.kernels.toolchain import find_nvcc

LISTING = """
        Function : _Z4demoPKfPf
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/               @P0 LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ;          /* 0x000 */
                                                                                      /* 0x000 */
        /*0020*/               @P1 LDG.E.128.CONSTANT R8, desc[UR4][R2.64+0x80] ;
        /*0030*/                   IMAD.WIDE R12, R0, 0x4, R12 ;
        /*0040*/                   LDG.E.U16.CONSTANT R14, desc[UR4][R12.64] ;
        /*0050*/                   HADD2.F32 R16, -RZ, R9.H0_H0 ;
        /*0060*/                   SHFL.BFLY PT, R17, R16, 0x4, 0x1f ;
        /*0070*/                   FADD R18, R17, R4 ;
        /*0080*/                   STS [R20], R18 ;
        /*0090*/              @!P2 BRA 0x10 ;
        /*00a0*/                   EXIT ;
        /*00b0*/                   BRA.DIV UR5, 0xc0 ;
        /*00c0*/                   LDG.E R30, desc[UR4][R2.64] ;
        /*00d0*/                   BRA 0x20 ;
"""


def test_loads_in_flight_stop_at_the_first_use():
    functions = split_functions(LISTING)
    assert list(functions) == ["_Z4demoPKfPf"]
    loops = find_loops(parse_sass(functions["_Z4demoPKfPf"]))
    assert len(loops) == 1                     # the jump back from after EXIT is no loop
    loop = loops[0]
    assert (loop.start, loop.end, loop.instructions) == (0x10, 0x90, 9)
    assert loop.loads == 3 and loop.load_bytes == 16 + 16 + 2
    # HADD2 reads R9, written by the second 128-bit load (R8..R11): three loads were issued before it
    assert loop.in_flight == 3 and loop.in_flight_bytes == 34
    assert loop.before_shuffle == 3 and loop.has_shuffle


def test_a_load_used_at_once_is_one_in_flight():
    listing = """
        /*0000*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0010*/                   FFMA R6, R4, R5, R6 ;
        /*0020*/                   LDG.E R4, desc[UR4][R2.64+0x4] ;
        /*0030*/                   FFMA R6, R4, R5, R6 ;
        /*0040*/                   BRA 0x0 ;
"""
    loop = innermost_busiest(find_loops(parse_sass(listing)))
    assert (loop.loads, loop.in_flight, loop.before_shuffle, loop.has_shuffle) == (2, 1, 2, False)


def test_shuffle_destination_is_its_second_operand():
    """SHFL's first operand is a predicate: R24 below is written, not read, so the load stays in flight."""
    listing = """
        /*0000*/                   LDG.E R24, desc[UR4][R2.64] ;
        /*0010*/                   SHFL.BFLY PT, R24, R23, 0x4, 0x1f ;
        /*0020*/                   LDG.E R25, desc[UR4][R2.64+0x4] ;
        /*0030*/                   BRA 0x0 ;
"""
    loop = find_loops(parse_sass(listing))[0]
    assert loop.in_flight == 2 and loop.before_shuffle == 1


def test_littles_law_and_occupancy():
    # 132 SMs x 12 warps x 2 KiB in flight / 800 ns = 4.06e12 B/s, under the 4.8e12 cap
    assert littles_law(2048, 12, 132, 800) == pytest.approx(132 * 12 * 2048 / 800e-9)
    assert littles_law(2048, 64, 132, 800) == HBM_BYTES_PER_S
    assert blocks_per_sm(144, 128, 8 * 1024) == 3          # 144 regs: 4608 per warp, 14 warps, 3 blocks of 4
    assert blocks_per_sm(32, 128, 100 * 1024) == 2         # shared memory: 228 KiB / (100 + 1) KiB
    assert blocks_per_sm(32, 64, 0) == 32                  # the block limit


TOOLS = (find_nvcc(), find_cuobjdump())


@pytest.mark.skipif(None in TOOLS, reason="needs nvcc and cuobjdump (pip install nvidia-cuda-cuobjdump "
                    "nvidia-cuda-nvdisasm)")
def test_real_sass_new_decode_keeps_four_wide_loads_in_flight():
    def build(variant, max_group=None):
        expression = decode_expressions(variant)[2]                       # the <__half, 64> partition kernel
        assert expression.endswith("<__half, 64>")
        return compile_sass(DECODE_VARIANTS[variant], (expression,), "sm_90", *TOOLS, max_group=max_group)[0]

    new, old = build("bandwidth"), build("simple")
    key, value = new.streaming_loops()
    for loop in (key, value):
        assert loop.in_flight >= 4 and loop.in_flight_bytes == 16 * loop.in_flight   # 16-byte loads
    assert key.has_shuffle and key.before_shuffle >= 4
    old_key, _ = old.streaming_loops()
    assert old_key.in_flight_bytes / old_key.in_flight == 2 and old_key.in_flight < 4   # 16-bit loads, one token
    assert new.spill_bytes == 0 and old.spill_bytes == 0
    args = (9, 3, 64, 2, 8, 4096, 132, 800.0)               # SmolLM2 float16, batch 8, 4k context, H200
    new_estimate = estimate_decode("bandwidth", new, build("bandwidth", max_group=3), *args)   # G = 3 instructions
    old_estimate = estimate_decode("simple", old, build("simple", max_group=3), *args)
    assert new_estimate.fraction >= 0.75 > old_estimate.fraction

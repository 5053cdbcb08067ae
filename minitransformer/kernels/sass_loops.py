"""Read a kernel's SASS (the GPU's own instructions, from `cuobjdump -sass`) for what decides memory bandwidth.

A load takes hundreds of nanoseconds to come back, and a warp stalls at the first instruction that needs its result.
So what matters in a loop that streams memory is how many global loads (LDG) a warp issues before that first use:
those are the loads it keeps in flight, and by Little's law the bandwidth it can draw is (bytes in flight) / latency.
This module finds the loops (a backward branch and its target) and, per loop, counts the LDGs, their width, and how
many are issued before the first instruction that reads a register one of them writes. sass_report.py uses it.

The operand conventions (first operand the destination, `R2.64` a register pair, `@P0` a predicate guard, SHFL's
first operand a predicate) are those of NVIDIA's CUDA Binary Utilities documentation (the SASS listing of
cuobjdump / nvdisasm, "Instruction Set Reference"); loads and stores are named LDG / STG (global), LDS / STS (shared).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_GUARD = re.compile(r"^@!?U?P[T0-9]+\s+")
_REGISTER = re.compile(r"(?<![\w.])R(\d+)(\.64)?")
_WIDTHS = {".128": 16, ".64": 8, ".U8": 1, ".S8": 1, ".U16": 2, ".S16": 2}


@dataclass(frozen=True)
class Instruction:
    address: int
    opcode: str                # e.g. "LDG.E.128.CONSTANT"
    operands: tuple[str, ...]

    @property
    def is_global_load(self) -> bool:
        return self.opcode.startswith("LDG")

    @property
    def load_bytes(self) -> int:
        """Bytes one lane moves with this load (4 unless the opcode names a width)."""
        return next((b for suffix, b in _WIDTHS.items() if suffix + "." in self.opcode + "."), 4)

    def registers(self, operands) -> set[int]:
        found = set()
        for operand in operands:
            for number, pair in _REGISTER.findall(operand):
                found.update({int(number), int(number) + 1} if pair else {int(number)})
        return found

    def destinations(self) -> set[int]:
        """Registers written: the first operand (after SHFL's predicate), as many as the load's width fills."""
        if not self.operands or self.opcode.startswith(("ST", "RED", "BRA", "EXIT", "BAR", "BSYNC", "BSSY")):
            return set()
        first = self.operands[1] if self.opcode.startswith("SHFL") else self.operands[0]
        match = _REGISTER.fullmatch(first.strip())
        if not match:
            return set()
        count = max(1, self.load_bytes // 4) if self.is_global_load else (2 if match.group(2) else 1)
        return set(range(int(match.group(1)), int(match.group(1)) + count))

    def sources(self) -> set[int]:
        if self.opcode.startswith(("ST", "RED", "ATOM")):
            return self.registers(self.operands)                  # a store reads its address and its data
        skip = 2 if self.opcode.startswith("SHFL") else 1
        return self.registers(self.operands[skip:])


def parse_sass(text: str) -> list[Instruction]:
    """The instructions of one function's listing, in address order (control-code lines are skipped)."""
    instructions = []
    for match in _LINE.finditer(text):
        body = _GUARD.sub("", match.group(2).strip())
        opcode, _, rest = body.partition(" ")
        operands = tuple(o.strip() for o in rest.split(",")) if rest.strip() else ()
        instructions.append(Instruction(int(match.group(1), 16), opcode, operands))
    return instructions


def split_functions(listing: str) -> dict[str, str]:
    """cuobjdump -sass output of a whole cubin -> {mangled function name: its listing}."""
    parts = re.split(r"\n\s*Function\s*:\s*(\S+)", "\n" + listing)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


@dataclass(frozen=True)
class Loop:
    start: int                 # address of the first instruction (the branch target)
    end: int                   # address of the backward branch
    instructions: int
    loads: int                 # LDG instructions per iteration
    load_bytes: int            # bytes one lane loads per iteration
    in_flight: int             # LDGs issued before the first instruction that uses a loaded register
    in_flight_bytes: int       # bytes one lane has requested at that point
    before_shuffle: int        # LDGs issued before the first SHFL (a warp reduction), or all of them if none
    has_shuffle: bool


def _branch_target(instruction: Instruction) -> int | None:
    if not instruction.opcode.startswith("BRA") or not instruction.operands:
        return None
    match = re.search(r"0x([0-9a-f]+)", instruction.operands[-1])
    return int(match.group(1), 16) if match else None


def find_loops(instructions: list[Instruction]) -> list[Loop]:
    """Every backward branch's loop that loads from global memory, with its load statistics."""
    loops = []
    for index, instruction in enumerate(instructions):
        target = _branch_target(instruction)
        if target is None or target >= instruction.address:
            continue
        body = [i for i in instructions[:index + 1] if i.address >= target]
        loads = [i for i in body if i.is_global_load]
        if not loads or any(i.opcode == "EXIT" for i in body):
            continue               # no loads, or a jump back from the out-of-line code after EXIT: not a loop
        pending: set[int] = set()
        in_flight = in_flight_bytes = 0
        for i in body[body.index(loads[0]):]:
            if i.sources() & pending:
                break
            if i.is_global_load:
                pending |= i.destinations()
                in_flight += 1
                in_flight_bytes += i.load_bytes
        shuffles = [body.index(i) for i in body if i.opcode.startswith("SHFL")]
        before_shuffle = sum(1 for i in body[:shuffles[0]] if i.is_global_load) if shuffles else len(loads)
        loops.append(Loop(target, instruction.address, len(body), len(loads), sum(i.load_bytes for i in loads),
                          in_flight, in_flight_bytes, before_shuffle, bool(shuffles)))
    return loops


def innermost_busiest(loops: list[Loop]) -> Loop | None:
    """Of the innermost loops (those holding no other loop of the list), the one with the most loads per iteration:
    an outer loop's count mixes its inner loops' loads with its own."""
    inner = [a for a in loops if not any(a.start <= b.start and b.end <= a.end and a != b for b in loops)]
    if not inner:
        return None
    return max(inner, key=lambda loop: (loop.loads, loop.start - loop.end))

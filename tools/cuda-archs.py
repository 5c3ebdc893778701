#!/usr/bin/env python3
"""The GPU code a CUDA program carries: its machine code (sm_XY) and PTX (ptx:XY).

    tools/cuda-archs.py PROGRAM...     one line per program: "PROGRAM sm_90 ptx:90"

Reads the ELF file's .nv_fatbin section, as nvcc's fatbinary writes it: fat binaries (magic
0xBA55ED50, then a header size and the size of what follows), each a run of entries whose
header gives the kind (1: PTX, 2: machine code), the header's size, the payload's size and,
28 bytes in, the architecture (e.g. 90). tools/gpu-check.sh asks it whether a bundle's
programs can run on the GPU (cuobjdump --list-elf/--list-ptx would say the same; the
development machines' CUDA toolkit has no cuobjdump). A program with no such section prints
nothing after its name.
"""
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50


def archs(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(f"{path}: not a 64-bit ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = sections[shstrndx][4]

    def name(sec):
        start = names + sec[0]
        return data[start:data.index(b"\0", start)].decode()

    found = set()
    for sec in sections:
        if name(sec) != ".nv_fatbin":
            continue
        o, end = sec[4], sec[4] + sec[5]
        while o + 16 <= end:
            magic, _, header, size = struct.unpack_from("<IHHQ", data, o)
            if magic != FATBIN_MAGIC:  # fat binaries are 8-byte aligned in the section
                o += 8
                continue
            e, stop = o + header, o + header + size
            while e + 32 <= stop:
                kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, e)
                arch, = struct.unpack_from("<I", data, e + 28)
                found.add(("ptx:" if kind == 1 else "sm_") + str(arch))
                e += entry_header + payload
            o = stop
    return sorted(found, key=lambda a: (a.startswith("ptx"), a))


def main():
    status = 0
    for path in sys.argv[1:]:
        try:
            print(path, *archs(path))
        except (OSError, ValueError, struct.error) as e:
            print(f"cuda-archs: {e}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())

"""The .npz interop tests between gradus::io and numpy, run by CTest (tests/io/CMakeLists.txt).

  npz_interop.py numpy_reads_gradus TOOL WORKDIR
      TOOL (npz_interop) writes WORKDIR/gradus.npz; numpy.load must give back the reference
      arrays bit for bit, and every entry must be a stored (uncompressed) NPY 1.0 array
      whose header is padded so that the data starts on a 64-byte boundary.
  npz_interop.py gradus_reads_numpy TOOL WORKDIR
      numpy.savez and numpy.savez_compressed write the reference arrays; TOOL must read
      them back bit for bit.

The reference arrays are also built by npz_interop.cpp; keep the two in step.
"""
import io
import os
import subprocess
import sys
import zipfile

import numpy as np
from numpy.lib import format as npy_format

MASK64 = (1 << 64) - 1

# name, dtype, shape: the same list, in the same order, as npz_interop.cpp's references()
ARRAYS = [
    ("w1/adam_m", "<f4", (3, 4)),
    ("w1/adam_v", "<f8", (2, 3, 5)),
    ("step", "<i8", ()),
    ("labels", "<i4", (7,)),
    ("mask", "|u1", (2, 1, 3, 1, 2, 2)),
    ("empty", "<f4", (0, 3)),
    ("bias", "<f8", ()),
    ("gewicht_gr\u00f6\u00dfe", "<f4", (2,)),
]


def reference():
    out = {}
    for k, (name, dtype, shape) in enumerate(ARRAYS):
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        state = (0x9E3779B97F4A7C15 * (k + 1)) & MASK64
        raw = bytearray(n)
        for j in range(n):
            state = (state * 6364136223846793005 + 1442695040888963407) & MASK64
            raw[j] = state >> 56
        out[name] = np.frombuffer(bytes(raw), dtype=dt).reshape(shape)
    return out


def fail(msg):
    print("npz_interop.py: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def same(name, got, want):
    if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
        fail(f"{name}: got {got.dtype} {got.shape}, want {want.dtype} {want.shape} (or bytes differ)")
    print(f"npz_interop.py: {name:16} {str(got.dtype):8} {str(got.shape):20} ok")


def numpy_reads_gradus(tool, work):
    path = os.path.join(work, "gradus.npz")
    if os.path.exists(path):
        os.remove(path)
    subprocess.run([tool, "write", path], check=True)
    ref = reference()
    with np.load(path, allow_pickle=False) as z:
        if z.files != list(ref):
            fail(f"numpy.load keys {z.files}, want {list(ref)}")
        for name, want in ref.items():
            same(name, z[name], want)
    with zipfile.ZipFile(path) as zf:
        if zf.testzip() is not None:
            fail(f"CRC error in {zf.testzip()}")
        for info in zf.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                fail(f"{info.filename} is compressed (method {info.compress_type})")
            raw = zf.read(info)
            f = io.BytesIO(raw)
            if npy_format.read_magic(f) != (1, 0):
                fail(f"{info.filename} is not NPY 1.0")
            shape, fortran, dtype = npy_format.read_array_header_1_0(f)
            data_offset = f.tell()
            hlen = int.from_bytes(raw[8:10], "little")
            if data_offset != 10 + hlen or data_offset % 64 != 0 or raw[data_offset - 1:data_offset] != b"\n":
                fail(f"{info.filename}: header of {data_offset} bytes is not 64-byte aligned or lacks its '\\n'")
            want = ref[info.filename[:-4]]
            if shape != want.shape or fortran or dtype != want.dtype:
                fail(f"{info.filename}: header says {shape} {dtype} fortran_order={fortran}")


def gradus_reads_numpy(tool, work):
    ref = reference()
    for save in (np.savez, np.savez_compressed):
        path = os.path.join(work, save.__name__ + ".npz")
        if os.path.exists(path):
            os.remove(path)
        save(path, **ref)
        print(f"npz_interop.py: {save.__name__} -> npz_interop check")
        subprocess.run([tool, "check", path], check=True)


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("numpy_reads_gradus", "gradus_reads_numpy"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    mode, tool, work = sys.argv[1:]
    os.makedirs(work, exist_ok=True)
    try:
        globals()[mode](tool, work)
    except subprocess.CalledProcessError as e:
        fail(str(e))
    print("npz_interop.py: ok")


if __name__ == "__main__":
    main()

"""The interop tests between gradus::io and numpy / the safetensors spec, run by CTest
(tests/io/CMakeLists.txt). TOOL is io_interop (io_interop.cpp), WORKDIR a scratch directory.

  io_interop.py numpy_reads_gradus TOOL WORKDIR
      TOOL writes WORKDIR/gradus.npz; numpy.load must give back the reference arrays bit
      for bit, and every entry must be a stored (uncompressed) NPY 1.0 array whose header is
      padded so that the data starts on a 64-byte boundary.
  io_interop.py gradus_reads_numpy TOOL WORKDIR
      numpy.savez and numpy.savez_compressed write the reference arrays; TOOL must read
      them back bit for bit.
  io_interop.py numpy_reads_gradus_npy TOOL WORKDIR
      TOOL writes each reference array as WORKDIR/npy/<k>.npy; numpy.load must give it back
      bit for bit, C order, NPY 1.0, 64-byte aligned.
  io_interop.py gradus_reads_numpy_npy TOOL WORKDIR
      numpy.save writes what gradus converts on load (W.T, i.e. Fortran order; '>f4' and
      other big-endian types; every float16 bit pattern; bool; int8, int16, uint16, uint32,
      uint64) and, beside each, numpy's own conversion into the gradus dtype; TOOL must read
      the two the same, value by value (bit for bit), as .npy files and as .npz archives.
      uint64 values above 2^63 - 1 and complex arrays must be refused, naming the value.
  io_interop.py python_reads_gradus_safetensors TOOL WORKDIR
      TOOL writes WORKDIR/gradus.safetensors; a reader written here from the spec checks the
      layout (8-byte length, JSON header padded to 8 bytes, offsets tiling the data) and
      gives back the reference arrays bit for bit, and the metadata.
  io_interop.py gradus_reads_python_safetensors TOOL WORKDIR
      a writer written here from the spec writes the reference arrays and the types gradus
      converts (F16 every bit pattern, BF16, BOOL, I8, I16, U16, U32, U64), the JSON keys in
      another order than the data; TOOL must read them as numpy's conversions (an .npz), and
      the metadata. A U64 above 2^63 - 1 and an F8 tensor must be refused.

The safetensors Python package is not used (it is not installed where these tests run, and
they must not need the network): both sides of the format here are numpy + json + struct,
following github.com/huggingface/safetensors' README (the format's spec).

The reference arrays are also built by io_interop.cpp; keep the two in step.
"""
import io
import json
import os
import struct
import subprocess
import sys
import zipfile

import numpy as np
from numpy.lib import format as npy_format

MASK64 = (1 << 64) - 1

# name, dtype, shape: the same list, in the same order, as io_interop.cpp's references()
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
        out[name] = np.frombuffer(lcg_bytes(n, k + 1), dtype=dt).reshape(shape)
    return out


def lcg_bytes(n, seed):
    """n bytes of the 64-bit LCG io_interop.cpp's references() also runs, from seed."""
    state = (0x9E3779B97F4A7C15 * seed) & MASK64
    raw = bytearray(n)
    for j in range(n):
        state = (state * 6364136223846793005 + 1442695040888963407) & MASK64
        raw[j] = state >> 56
    return bytes(raw)


def fail(msg):
    print("io_interop.py: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def same(name, got, want):
    if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
        fail(f"{name}: got {got.dtype} {got.shape}, want {want.dtype} {want.shape} (or bytes differ)")
    print(f"io_interop.py: {name:16} {str(got.dtype):8} {str(got.shape):20} ok")


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
            check_npy_header(info.filename, zf.read(info), ref[info.filename[:-4]])


def gradus_reads_numpy(tool, work):
    ref = reference()
    for save in (np.savez, np.savez_compressed):
        path = os.path.join(work, save.__name__ + ".npz")
        if os.path.exists(path):
            os.remove(path)
        save(path, **ref)
        print(f"io_interop.py: {save.__name__} -> io_interop check")
        subprocess.run([tool, "check", path], check=True)


def check_npy_header(what, raw, want):
    f = io.BytesIO(raw)
    if npy_format.read_magic(f) != (1, 0):
        fail(f"{what} is not NPY 1.0")
    shape, fortran, dtype = npy_format.read_array_header_1_0(f)
    data_offset = f.tell()
    hlen = int.from_bytes(raw[8:10], "little")
    if data_offset != 10 + hlen or data_offset % 64 != 0 or raw[data_offset - 1:data_offset] != b"\n":
        fail(f"{what}: header of {data_offset} bytes is not 64-byte aligned or lacks its '\\n'")
    if shape != want.shape or fortran or dtype != want.dtype:
        fail(f"{what}: header says {shape} {dtype} fortran_order={fortran}")


def numpy_reads_gradus_npy(tool, work):
    d = os.path.join(work, "npy")
    os.makedirs(d, exist_ok=True)
    subprocess.run([tool, "write-npy", d], check=True)
    for k, (name, want) in enumerate(reference().items()):
        path = os.path.join(d, f"{k}.npy")
        same(name, np.load(path, allow_pickle=False), want)
        with open(path, "rb") as f:
            check_npy_header(path, f.read(), want)


def converted_cases():
    """(name, what numpy stores, what gradus must load it as): numpy's own conversions."""
    f4 = np.frombuffer(lcg_bytes(4 * 12, 21), "<f4").reshape(3, 4)  # NaNs with payloads, -0, ...
    f8 = np.frombuffer(lcg_bytes(8 * 6, 22), "<f8").reshape(2, 3)
    w = np.frombuffer(lcg_bytes(4 * 6, 23), "<f4").reshape(3, 2)
    ints = np.frombuffer(lcg_bytes(8 * 24, 24), "<i8")
    half = np.arange(65536, dtype="<u2").view("<f2")  # every float16: subnormals, inf, NaNs
    cases = [
        ("fortran_f4", w.T, np.ascontiguousarray(w.T)),  # np.save(W.T): fortran_order True
        ("fortran_i2_3d", np.asfortranarray(ints[:24].astype("<i2").reshape(2, 3, 4)),
         ints[:24].astype("<i2").reshape(2, 3, 4).astype("<i4")),
        ("big_f4", f4.byteswap().view(">f4"), f4),  # the same values, stored big-endian
        ("big_f8_fortran", np.asfortranarray(f8.byteswap().view(">f8")), f8),
        ("big_i8", ints.byteswap().view(">i8"), ints),
        ("big_u2", ints.astype("<u2").byteswap().view(">u2"), ints.astype("<u2").astype("<i4")),
        ("float16", half, half.astype("<f4")),
        ("big_float16_2d", half[:4096].reshape(64, 64).astype(">f2"), half[:4096].reshape(64, 64).astype("<f4")),
        ("bool", (ints % 3 == 0).reshape(4, 6), (ints % 3 == 0).reshape(4, 6).astype("u1")),
        ("int8", ints.astype("i1"), ints.astype("i1").astype("<i4")),
        ("int16", ints.astype("<i2"), ints.astype("<i2").astype("<i4")),
        ("uint16", ints.astype("<u2"), ints.astype("<u2").astype("<i4")),
        ("uint32", ints.astype("<u4"), ints.astype("<u4").astype("<i8")),
        ("uint64", (ints.view("<u8") >> np.uint64(1)), (ints.view("<u8") >> np.uint64(1)).astype("<i8")),
        ("uint8", ints.astype("u1"), ints.astype("u1")),
        ("scalar_f2", np.array(np.float16(-0.5)), np.array(np.float32(-0.5))),
    ]
    for name, stored, want in cases:
        if want.dtype.str not in ("<f4", "<f8", "<i4", "<i8", "|u1") or not want.flags.c_contiguous:
            fail(f"case {name}: the wanted array is {want.dtype.str}, not a gradus dtype in C order")
        if stored.shape != want.shape:
            fail(f"case {name}: shapes differ")
    return cases


def gradus_reads_numpy_npy(tool, work):
    d = os.path.join(work, "npy")
    os.makedirs(d, exist_ok=True)
    cases = converted_cases()
    for name, stored, want in cases:
        got_path, want_path = os.path.join(d, name + ".npy"), os.path.join(d, name + ".want.npy")
        np.save(got_path, stored)
        np.save(want_path, want)
        with open(got_path, "rb") as f:
            npy_format.read_magic(f)
            _, fortran, descr = npy_format.read_array_header_1_0(f)
        print(f"io_interop.py: {name}: numpy stored {descr.str} fortran_order={fortran}")
        if fortran != ("fortran" in name):
            fail(f"case {name}: numpy stored fortran_order={fortran}, not what the case is for")
        subprocess.run([tool, "same", got_path, want_path], check=True)
    # the same through .npz entries
    np.savez(os.path.join(d, "converted.npz"), **{n: s for n, s, _ in cases})
    np.savez(os.path.join(d, "converted.want.npz"), **{n: w for n, _, w in cases})
    subprocess.run([tool, "same", os.path.join(d, "converted.npz"), os.path.join(d, "converted.want.npz")], check=True)
    # refused, naming the value and its index
    np.save(os.path.join(d, "u64_big.npy"), np.array([1, 2, 2**63 + 5], dtype="<u8"))
    subprocess.run([tool, "refuse", os.path.join(d, "u64_big.npy"),
                    "uint64 value 9223372036854775813 at index 2 does not fit int64"], check=True)
    np.save(os.path.join(d, "complex.npy"), np.array([1 + 2j], dtype="<c8"))
    subprocess.run([tool, "refuse", os.path.join(d, "complex.npy"), "unsupported descr '<c8' (complex)"], check=True)


# ---- safetensors, from the spec (github.com/huggingface/safetensors, README "Format") ------
ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
             "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}


def st_write(path, tensors, metadata=None, key_order=None):
    """tensors: [(name, dtype, shape, bytes)], data in this order; the JSON keys in key_order."""
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if key_order:
        header = {k: header[k] for k in key_order}
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def st_read(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    if (8 + n) % 8 != 0:
        fail(f"{path}: the data starts at {8 + n}, not on an 8-byte boundary")
    text = raw[8:8 + n]
    if not text.startswith(b"{") or text.rstrip(b" ") != text.rstrip():
        fail(f"{path}: the header is not a JSON object padded with spaces")
    header = json.loads(text.decode("utf-8"))
    metadata = header.pop("__metadata__", None)
    data = raw[8 + n:]
    out, end = {}, 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if set(info) != {"dtype", "shape", "data_offsets"}:
            fail(f"{path}: tensor {name}: fields {sorted(info)}")
        begin, stop = info["data_offsets"]
        if begin != end:
            fail(f"{path}: tensor {name} begins at {begin}, the one before ended at {end}")
        dt = np.dtype(ST_DTYPES[info["dtype"]])
        if (stop - begin) != int(np.prod(info["shape"], dtype=np.int64)) * dt.itemsize:
            fail(f"{path}: tensor {name}: offsets {begin}, {stop} do not match shape {info['shape']}")
        out[name] = np.frombuffer(data[begin:stop], dtype=dt).reshape(info["shape"])
        end = stop
    if end != len(data):
        fail(f"{path}: the tensors end at {end}, the data holds {len(data)} bytes")
    return out, metadata


def python_reads_gradus_safetensors(tool, work):
    path = os.path.join(work, "gradus.safetensors")
    subprocess.run([tool, "write-safetensors", path], check=True)
    got, metadata = st_read(path)
    ref = reference()
    if list(got) != list(ref):
        fail(f"tensors {list(got)} (in data order), want {list(ref)}")
    for name, want in ref.items():
        same(name, got[name], want)
    if metadata != {"format": "pt", "writer": "gradus"}:
        fail(f"metadata {metadata}")


def gradus_reads_python_safetensors(tool, work):
    ref = reference()
    half = np.arange(65536, dtype="<u2")
    bf16 = np.frombuffer(lcg_bytes(2 * 40, 31), "<u2").reshape(5, 8)
    ints = np.frombuffer(lcg_bytes(8 * 12, 32), "<i8")
    st_dtype = {"<f4": "F32", "<f8": "F64", "<i4": "I32", "<i8": "I64", "|u1": "U8"}
    # (name, safetensors dtype, shape, stored bytes, what gradus must load)
    cases = [(name, st_dtype[a.dtype.str], a.shape, a.tobytes(), a) for name, a in ref.items()]
    cases += [
        ("f16_all", "F16", (256, 256), half.tobytes(), half.view("<f2").astype("<f4").reshape(256, 256)),
        # bfloat16 is the top half of a float32
        ("bf16", "BF16", (5, 8), bf16.tobytes(), (bf16.astype("<u4") << np.uint32(16)).view("<f4")),
        ("bool", "BOOL", (12,), (ints % 2 == 0).tobytes(), (ints % 2 == 0).astype("u1")),
        ("i8", "I8", (12,), ints.astype("i1").tobytes(), ints.astype("i1").astype("<i4")),
        ("i16", "I16", (3, 4), ints.astype("<i2").tobytes(), ints.astype("<i2").astype("<i4").reshape(3, 4)),
        ("u16", "U16", (12,), ints.astype("<u2").tobytes(), ints.astype("<u2").astype("<i4")),
        ("u32", "U32", (12,), ints.astype("<u4").tobytes(), ints.astype("<u4").astype("<i8")),
        ("u64", "U64", (12,), (ints.view("<u8") >> np.uint64(1)).tobytes(),
         (ints.view("<u8") >> np.uint64(1)).astype("<i8")),
    ]
    path = os.path.join(work, "python.safetensors")
    names = [c[0] for c in cases]
    st_write(path, [c[:4] for c in cases], {"format": "pt", "source": "io_interop.py"}, key_order=names[::-1])
    want_path = os.path.join(work, "python.want.npz")
    np.savez(want_path, **{c[0]: c[4] for c in cases})
    r = subprocess.run([tool, "same", path, want_path], check=True, capture_output=True, text=True)
    print(r.stdout, end="")
    meta = sorted(line for line in r.stdout.splitlines() if line.startswith("metadata "))
    if meta != ["metadata format=pt", "metadata source=io_interop.py"]:
        fail(f"gradus read the metadata as {meta}")
    bad = os.path.join(work, "u64_big.safetensors")
    st_write(bad, [("big", "U64", (2,), np.array([7, 2**64 - 1], "<u8").tobytes())])
    subprocess.run([tool, "refuse", bad, "tensor 'big': uint64 value 18446744073709551615 at index 1"], check=True)
    st_write(bad, [("q", "F8_E4M3", (2,), b"\x01\x02")])
    subprocess.run([tool, "refuse", bad, "tensor 'q': unsupported dtype 'F8_E4M3'"], check=True)


MODES = ("numpy_reads_gradus", "gradus_reads_numpy", "numpy_reads_gradus_npy", "gradus_reads_numpy_npy",
         "python_reads_gradus_safetensors", "gradus_reads_python_safetensors")


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in MODES:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    mode, tool, work = sys.argv[1:]
    os.makedirs(work, exist_ok=True)
    try:
        globals()[mode](tool, work)
    except subprocess.CalledProcessError as e:
        fail(str(e))
    print("io_interop.py: ok")


if __name__ == "__main__":
    main()

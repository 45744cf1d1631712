#!/usr/bin/env python3
"""Make enlarged copies of the graph fixtures for the throughput benchmark.

For each of wide_deep, deepfm, adam_resource and sgd_ref this writes

    OUT/<model>/model.pb          copied from fixtures/<model>/model.pb
    OUT/<model>/data/...          the fixture's data files under the same names;
                                  vocabulary files are copied unchanged, the
                                  training data file is enlarged to R records

where R is --records rounded up to a multiple of the batch size (32), so that
every epoch is a whole number of batches and `drop_remainder` never drops
anything. Records are the fixture's records repeated in order (record i of the
big file is fixture record i mod n): TFRecord files are copied as whole framed
records (length, length CRC, payload, payload CRC — nothing is re-encoded), CSV
files keep a header line once (sgd_ref has one, deepfm has none) and repeat the
body lines.

Plain Python, no TensorFlow: fast and deterministic (same arguments, same
bytes). A stamp file OUT/<model>/.bench_records records the record count;
`bench/run.sh` uses it to skip regeneration.
"""

import argparse
import os
import shutil
import struct
import sys

BATCH = 32
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "fixtures")

# model -> (data file relative to the model dir, kind, header lines)
MODELS = {
    "wide_deep": ("data/train.tfrecord", "tfrecord", 0),
    "deepfm": ("data/train.csv", "text", 0),
    "adam_resource": ("data/train.tfrecord", "tfrecord", 0),
    "sgd_ref": ("data/train.csv", "text", 1),
}
STAMP = ".bench_records"


def tfrecord_frames(blob, path):
    """Split a TFRecord file into its framed records (bytes, frame included)."""
    frames, pos = [], 0
    while pos < len(blob):
        if pos + 12 > len(blob):
            sys.exit(f"{path}: truncated TFRecord header at byte {pos}")
        (length,) = struct.unpack_from("<Q", blob, pos)
        end = pos + 12 + length + 4
        if end > len(blob):
            sys.exit(f"{path}: truncated TFRecord at byte {pos}")
        frames.append(blob[pos:end])
        pos = end
    return frames


def text_lines(blob, header, path):
    lines = blob.splitlines(keepends=True)
    if lines and not lines[-1].endswith(b"\n"):
        lines[-1] += b"\n"
    if len(lines) <= header:
        sys.exit(f"{path}: no data lines")
    return lines[:header], lines[header:]


def make_model(model, out_dir, records):
    src_dir = os.path.join(FIXTURES, model)
    dst_dir = os.path.join(out_dir, model)
    rel_data, kind, header = MODELS[model]
    if os.path.isdir(dst_dir):
        shutil.rmtree(dst_dir)
    os.makedirs(os.path.join(dst_dir, "data"))
    shutil.copyfile(os.path.join(src_dir, "model.pb"), os.path.join(dst_dir, "model.pb"))

    # every file of the fixture's data/ keeps its name; only the training data grows
    src_data_dir = os.path.join(src_dir, "data")
    for name in sorted(os.listdir(src_data_dir)):
        rel = os.path.join("data", name)
        if rel != rel_data:
            shutil.copyfile(os.path.join(src_data_dir, name), os.path.join(dst_dir, rel))

    src = os.path.join(src_dir, rel_data)
    with open(src, "rb") as f:
        blob = f.read()
    if kind == "tfrecord":
        head, body = [], tfrecord_frames(blob, src)
    else:
        head, body = text_lines(blob, header, src)
    n = len(body)
    full, rest = divmod(records, n)
    with open(os.path.join(dst_dir, rel_data), "wb") as f:
        f.writelines(head)
        chunk = b"".join(body)
        for _ in range(full):
            f.write(chunk)
        f.writelines(body[:rest])
    with open(os.path.join(dst_dir, STAMP), "w") as f:
        f.write(f"{records}\n")
    return n, os.path.getsize(os.path.join(dst_dir, rel_data))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--records", type=int, default=65536,
                    help="records per data file, rounded up to a multiple of 32 (default 65536)")
    ap.add_argument("--only", action="append", choices=sorted(MODELS),
                    help="make only this model (repeatable)")
    args = ap.parse_args()
    if args.records < 1:
        ap.error("--records must be positive")
    records = -(-args.records // BATCH) * BATCH
    os.makedirs(args.out, exist_ok=True)
    for model in args.only or list(MODELS):
        n, size = make_model(model, args.out, records)
        print(f"{model}: {records} records ({records / n:g} x {n} fixture records), "
              f"{MODELS[model][0]} {size} bytes")


if __name__ == "__main__":
    main()

"""A PEP 517 backend for Lode's training-side package.

Building the wheel compiles (a) the Rust library `lode-training` (python/native) with cargo, and
(b) the TensorFlow custom-op library (python/cc/dw_recv.cc) with the C++ compiler against the
*installed* TensorFlow: its flags come from `tf.sysconfig` as the target interpreter reports them
(pip's build isolation hides the environment's packages from this process, so the flags are
asked of a child interpreter with the isolation removed). Nothing is fetched from the network.

Settings (environment): CARGO (the cargo binary), CARGO_TARGET_DIR, CXX (the C++ compiler),
LODE_CARGO_PROFILE (release by default).
"""

import base64
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

NAME = "lode"
VERSION = "0.1.0"
HERE = Path(__file__).resolve().parent.parent  # python/
REPO = HERE.parent


def get_requires_for_build_wheel(config_settings=None):
    return []


def _fail(message):
    sys.stderr.write(f"lode build: {message}\n")
    raise SystemExit(2)


def _run(cmd, **kwargs):
    sys.stderr.write("lode build: " + " ".join(str(c) for c in cmd) + "\n")
    done = subprocess.run(cmd, **kwargs)
    if done.returncode != 0:
        _fail(f"{cmd[0]} failed with status {done.returncode}")
    return done


def _tensorflow_flags():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    probe = (
        "import json, tensorflow as tf; "
        "print(json.dumps([tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        _fail(
            f"TensorFlow is not importable by {sys.executable}: install tensorflow first "
            f"(the op library is compiled against it)\n{done.stderr.strip()[-2000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _build_native(out_dir):
    cargo = os.environ.get("CARGO", "cargo")
    profile = os.environ.get("LODE_CARGO_PROFILE", "release")
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    if not target.is_absolute():
        target = REPO / target
    _run(
        [cargo, "build", "--locked", "--profile", profile, "-p", "lode-training"],
        cwd=REPO,
    )
    built = target / ("debug" if profile == "dev" else profile) / "liblode_training.so"
    if not built.is_file():
        _fail(f"cargo did not produce {built}")
    dest = out_dir / "liblode_training.so"
    dest.write_bytes(built.read_bytes())
    return dest


def _build_ops(out_dir):
    compile_flags, link_flags = _tensorflow_flags()
    cxx = os.environ.get("CXX", "g++")
    dest = out_dir / "_lode_ops.so"
    _run(
        [cxx, "-shared", "-fPIC", "-O2", str(HERE / "cc" / "dw_recv.cc"), "-o", str(dest),
         "-I" + str(HERE / "cc"), *compile_flags, *link_flags,
         "-L" + str(out_dir), "-llode_training", "-Wl,-rpath,$ORIGIN"]
    )
    return dest


def _tag():
    impl = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{impl}-{impl}-{plat}"


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    tag = _tag()
    wheel_name = f"{NAME}-{VERSION}-{tag}.whl"
    dist_info = f"{NAME}-{VERSION}.dist-info"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        _build_native(tmp)
        _build_ops(tmp)
        files = {}
        for py in sorted((HERE / "lode").glob("*.py")):
            files[f"lode/{py.name}"] = py.read_bytes()
        files["lode/liblode_training.so"] = (tmp / "liblode_training.so").read_bytes()
        files["lode/_lode_ops.so"] = (tmp / "_lode_ops.so").read_bytes()
        files[f"{dist_info}/METADATA"] = (
            f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
            "Summary: Lode's training side: DWRecv for TensorFlow and the session hook of "
            "`lode train`\nLicense: Apache-2.0\n"
        ).encode()
        files[f"{dist_info}/WHEEL"] = (
            f"Wheel-Version: 1.0\nGenerator: lode_backend\nRoot-Is-Purelib: false\nTag: {tag}\n"
        ).encode()
        record = [_record_line(p, d) for p, d in files.items()]
        record.append(f"{dist_info}/RECORD,,")
        files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
        out = Path(wheel_directory) / wheel_name
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for path, data in files.items():
                info = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
                info.external_attr = (0o755 if path.endswith(".so") else 0o644) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, data)
    return wheel_name

"""The SGLang environment builder's fast parts: the stand-in libcuda, reuse of a finished
environment, and the errors for a missing compiler or a full disk."""
import ctypes
import json
import shutil

import pytest

from engines.server import venv
from engines.sglang import env

DRIVER_ENTRY_POINTS = [
    "cuInit", "cuDeviceGetCount", "cuDriverGetVersion", "cuGetErrorString", "cuGetProcAddress",
    "cuGetProcAddress_v2", "cuStreamCreate", "cuPointerGetAttribute", "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2", "cuCtxFromGreenCtx", "cuGreenCtxCreate", "cuGreenCtxDestroy",
    "cuGreenCtxGetDevResource", "cuDeviceGetDevResource", "cuDevResourceGenerateDesc",
    "cuDevSmResourceSplitByCount",
]


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="no C compiler")
def test_stub_libcuda_reports_no_device(tmp_path):
    lib = ctypes.CDLL(str(env.build_stub_libcuda(tmp_path, log=lambda s: None)))
    for name in DRIVER_ENTRY_POINTS:
        assert getattr(lib, name) is not None
    assert lib.cuInit(0) == 100
    count = ctypes.c_int(7)
    assert lib.cuDeviceGetCount(ctypes.byref(count)) == 100 and count.value == 0
    fn = ctypes.c_void_p(1)
    assert lib.cuGetProcAddress_v2(b"cuInit", ctypes.byref(fn), 12000, 0, None) == 100 and fn.value is None
    msg = ctypes.c_char_p()
    lib.cuGetErrorString(100, ctypes.byref(msg))
    assert b"NO_DEVICE" in msg.value


def _finished_env(root):
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").write_text("")
    env.stub_dir(root).mkdir()
    (env.stub_dir(root) / "libcuda.so.1").write_text("")
    (root / env.VENV.marker).write_text(json.dumps({"sglang": "0.5.23"}))


def test_a_finished_env_is_reused_without_running_anything(tmp_path, monkeypatch):
    _finished_env(tmp_path / "venv")
    monkeypatch.setattr(venv, "run", lambda *a, **k: pytest.fail("setup ran a command"))
    assert env.VENV.setup(tmp_path / "venv", log=lambda s: None) == tmp_path / "venv" / "bin" / "python"


def test_default_location_follows_the_cache_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("BOUNDED_BENCH_CACHE", str(tmp_path))
    assert env.VENV.default_dir() == tmp_path / "sglang-venv"


def test_missing_compiler_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(env.shutil, "which", lambda name: None)
    with pytest.raises(env.SGLangEnvError, match="no C compiler"):
        env.VENV.setup(tmp_path / "venv", log=lambda s: None)


def test_short_disk_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(env.SGLangVenv, "min_free_gb", 1e9)
    with pytest.raises(env.SGLangEnvError, match="GB free"):
        env.VENV.setup(tmp_path / "venv", log=lambda s: None)
    assert not (tmp_path / "venv").exists()


def test_cpu_server_env_puts_the_stub_first(tmp_path):
    _finished_env(tmp_path / "venv")
    got = env.cpu_server_env(tmp_path / "venv" / "bin" / "python", {"LD_LIBRARY_PATH": "/usr/lib"})
    assert got["SGLANG_USE_CPU_ENGINE"] == "1"
    assert got["LD_LIBRARY_PATH"] == f"{env.stub_dir(tmp_path / 'venv')}:/usr/lib"

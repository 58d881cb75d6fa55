"""cublas.handle: a thread's cuBLAS handle when GPU memory is held by CuPy's pool. CPU only: a stand-in CuPy
whose handle creation fails with CUBLAS_STATUS_ALLOC_FAILED until the pool has released its free blocks."""
import sys
import types

import pytest

from hybridblas import cublas


class CUBLASError(RuntimeError):        # CuPy's exception is told by its name and status
    def __init__(self, status):
        super().__init__(f"status {status}")
        self.status = status


def fake_cupy(monkeypatch, fails, status=3):
    state = {"freed": 0, "tries": 0}

    def get_cublas_handle():
        state["tries"] += 1
        if state["tries"] <= fails:
            raise CUBLASError(status)
        return 1234

    pool = types.SimpleNamespace(free_all_blocks=lambda: state.__setitem__("freed", state["freed"] + 1))
    cuda = types.SimpleNamespace(device=types.SimpleNamespace(get_cublas_handle=get_cublas_handle),
                                 Device=lambda: types.SimpleNamespace(id=0))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda, get_default_memory_pool=lambda: pool))
    return state


def test_a_handle_comes_at_once_when_memory_allows(monkeypatch):
    state = fake_cupy(monkeypatch, fails=0)
    assert cublas.handle() == 1234 and state == {"freed": 0, "tries": 1}


def test_the_pools_free_blocks_go_before_a_second_try(monkeypatch):
    state = fake_cupy(monkeypatch, fails=1)
    assert cublas.handle() == 1234 and state == {"freed": 1, "tries": 2}


def test_still_no_memory_is_a_memory_error_naming_cublas(monkeypatch):
    state = fake_cupy(monkeypatch, fails=2)
    with pytest.raises(MemoryError, match="cublasCreate failed on GPU 0"):
        cublas.handle()
    assert state == {"freed": 1, "tries": 2}


def test_other_cublas_errors_pass_unchanged(monkeypatch):
    state = fake_cupy(monkeypatch, fails=1, status=1)
    with pytest.raises(CUBLASError):
        cublas.handle()
    assert state == {"freed": 0, "tries": 1}


def fake_cupy_cublas(monkeypatch, fails, set_stream_fails=False):
    """A stand-in cupy.cuda.cublas whose create() fails with ALLOC_FAILED ``fails`` times."""
    state = fake_cupy(monkeypatch, fails=0)
    state.update(created=0, streams=[], destroyed=[])

    def create():
        state["created"] += 1
        if state["created"] <= fails:
            raise CUBLASError(3)
        return 40 + state["created"]

    def set_stream(h, ptr):
        if set_stream_fails:
            raise RuntimeError("invalid stream")
        state["streams"].append((h, ptr))
    fake = types.SimpleNamespace(create=create, setStream=set_stream, destroy=state["destroyed"].append)
    monkeypatch.setitem(sys.modules, "cupy.cuda.cublas", fake)
    sys.modules["cupy"].cuda.cublas = fake
    monkeypatch.setitem(sys.modules, "cupy.cuda", sys.modules["cupy"].cuda)
    return state


def test_a_new_handle_is_bound_to_its_stream_and_retried_once_without_memory(monkeypatch):
    state = fake_cupy_cublas(monkeypatch, fails=0)
    assert cublas.new_handle(777) == 41 and state["streams"] == [(41, 777)] and state["freed"] == 0
    state = fake_cupy_cublas(monkeypatch, fails=1)
    assert cublas.new_handle(5) == 42 and state["streams"] == [(42, 5)] and state["freed"] == 1
    state = fake_cupy_cublas(monkeypatch, fails=2)
    with pytest.raises(MemoryError, match="cublasCreate failed on GPU 0"):
        cublas.new_handle(5)
    assert state["freed"] == 1 and state["created"] == 2


def test_a_new_handle_whose_stream_cannot_be_set_is_destroyed(monkeypatch):
    state = fake_cupy_cublas(monkeypatch, fails=0, set_stream_fails=True)
    with pytest.raises(RuntimeError, match="invalid stream"):
        cublas.new_handle(9)
    assert state["destroyed"] == [41]

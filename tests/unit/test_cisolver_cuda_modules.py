"""cisolver.cuda_modules on the CPU: the units' sources (deterministic, self-contained, every kernel in exactly
one unit, every section's macros undefined after it, following the families' constants) and their compilation
once per device, dtype and unit, side by side on background threads, against a stand-in for CuPy."""
import re
import threading

import numpy as np
import pytest

from cisolver import cuda_modules, row_kernels


def _defines(code, name):
    """Whether ``code`` defines the kernel ``name``: an extern "C" entry point or a macro line that expands to
    it (ROW_PRODUCT(16) for rows_times_small_16)."""
    if re.search(rf'extern "C" __global__ void (__launch_bounds__\([^)]*\) )?{name}\(', code):
        return True
    kernel, _, width = name.rpartition("_")
    macros = [macro for entries in row_kernels.STEPS.values() for macro, k in entries if k == kernel]
    return any(re.search(rf"^{macro}\({width}\)$", code, re.M) for macro in macros)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_units_are_deterministic_self_contained_and_list_every_kernel_once(dtype):
    units = cuda_modules.units(dtype)
    assert cuda_modules.units(dtype) == units
    ctype = "float" if np.dtype(dtype) == np.float32 else "double"
    names = [name for _, _, kernels in units for name in kernels]
    assert len(set(names)) == len(names) and tuple(names) == cuda_modules.kernel_names(dtype)
    assert len({unit for unit, _, _ in units}) == len(units)
    for unit, code, kernels in units:
        assert code.startswith(f"typedef {ctype} T;\n") and "#define VEC " in code, unit      # its own head
        assert kernels and all(_defines(code, name) for name in kernels), unit
        others = [name for name in names if name not in kernels]     # no other unit's kernel defined here
        assert not any(_defines(code, name) for name in others), unit
    for kernel in ("ortho_factor", "rr_prepare", "rr_finish", "residual_sumsq", "full_rows", "row_flags",
                   "full_row_counts", "raised_squares", "column_squares"):
        assert kernel in units[0][2]                               # "main"
    assert not any("gram_" in code for _, code, _ in units)       # the Gram kernels are hybridblas's
    by_unit = {unit: kernels for unit, _, kernels in units}
    for q in row_kernels.QMAX_CHOICES:                            # one unit per (width, step)
        staged = np.dtype(dtype) == np.float64                    # float32 takes no staged kernel
        assert by_unit[f"row_product_{q}"] == (f"rows_times_small_{q}",) + ((f"staged_product_{q}",) if staged else ())
        assert by_unit[f"row_update_{q}"] == (f"update_residual_{q}",) + ((f"staged_update_{q}",) if staged else ())
    assert by_unit["gpu_fill"] == ("fill_jump_grid", "fill_own_column", "fill_own_piece", "keep_counts",
                                   "keep_starts", "keep_compact")          # the GPU build's, a unit of its own
    assert [unit for unit, _, _ in units] == ["main", "gpu_fill"] + [
        f"row_{step}_{q}" for q in row_kernels.QMAX_CHOICES for step in row_kernels.STEPS]


def test_small_factor_only_in_main_and_families_in_order():
    units = cuda_modules.units(np.float64)
    assert "cholesky_upper" in units[0][1] and not any("cholesky_upper" in code for _, code, _ in units[1:])
    families = [s.split(" ", 1)[0] for s in units[0][1].split("// ---- cisolver.")[1:]]
    assert families == [name for name, _ in cuda_modules.FAMILIES
                        if name != "row_kernels" and name not in cuda_modules.OWN_UNIT]
    for unit, code, _ in units[1:]:
        own = unit if unit in cuda_modules.OWN_UNIT else "row_kernels"
        assert [s.split(" ", 1)[0] for s in code.split("// ---- cisolver.")[1:]] == [own]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unit_sections_undefine_their_macros(dtype):
    for unit, code, _ in cuda_modules.units(dtype):
        for text in code.split("// ---- cisolver.")[1:]:
            defined = set(re.findall(r"^\s*#define\s+(\w+)", text, re.M))
            undefined = set(re.findall(r"^#undef (\w+)$", text, re.M))
            assert defined <= undefined, (unit, text.split("\n", 1)[0])
    rows = dict((unit, code) for unit, code, _ in cuda_modules.units(np.float64))["row_update_32"]
    for macro in ("STAGE_ROWS", "CHUNK", "ROW_UPDATE", "STAGED_PRODUCT"):
        assert f"#undef {macro}\n" in rows


def test_units_follow_the_families_constants(monkeypatch):
    before = dict((unit, code) for unit, code, _ in cuda_modules.units(np.float64))
    monkeypatch.setattr(row_kernels, "STAGE_ROWS", 16)
    after = dict((unit, code) for unit, code, _ in cuda_modules.units(np.float64))
    assert after["main"] == before["main"] and after["gpu_fill"] == before["gpu_fill"]
    for unit in after.keys() - {"main", "gpu_fill"}:
        assert "#define STAGE_ROWS 16\n" in after[unit] and "#define STAGE_ROWS 48\n" in before[unit]
    monkeypatch.setattr(row_kernels, "QMAX_CHOICES", (8, 24))
    assert [unit for unit, _, _ in cuda_modules.units(np.float32)] == \
        ["main", "gpu_fill", "row_product_8", "row_update_8", "row_product_24", "row_update_24"]


def test_units_refuse_other_dtypes():
    with pytest.raises(TypeError, match="float32 or float64, got int32"):
        cuda_modules.units(np.int32)


def test_row_section_of_some_widths_and_steps():
    code, constants, names = row_kernels.cuda_section(np.float64, widths=(16,), steps=("update",))
    assert names == ["update_residual_16", "staged_update_16"] and constants["STAGE_ROWS"] == row_kernels.STAGE_ROWS
    assert code.endswith("ROW_UPDATE(16)\nSTAGED_UPDATE(16)\n")
    whole = row_kernels.cuda_section(np.float32)[2]
    assert sorted(whole) == sorted(f"{k}_{q}" for q in row_kernels.QMAX_CHOICES
                                   for k in ("rows_times_small", "update_residual"))


class _FakeCupy:
    """What cuda_modules uses of CuPy: RawModule (recording each compilation begun in ``tried`` (code) and each
    done in ``compiled`` (device, code)), the current device, Device(). ``fail(code)``: that compilation raises;
    ``gate``: an Event every compilation waits for; ``meet``: compilations that must have started before any
    goes on (each waits up to 5 s for them; one that waited in vain is recorded in ``alone``)."""

    def __init__(self, fail=None, gate=None, meet=0):
        fake = self
        self.compiled, self.alone, self.fail, self.gate, self.meet = [], [], fail, gate, meet
        self.tried, self.cond = [], threading.Condition()
        self.local = threading.local()

        class RawModule:
            def __init__(self, code, options):
                self.code, self.loaded = code, None

            def get_function(self, name):
                if self.loaded is None:
                    with fake.cond:
                        fake.tried.append(self.code)
                        fake.cond.notify_all()
                        if not fake.cond.wait_for(lambda: len(fake.tried) >= fake.meet, timeout=5):
                            fake.alone.append(self.code)
                    if fake.gate is not None:
                        fake.gate.wait(5)
                    if fake.fail is not None and fake.fail(self.code):
                        raise RuntimeError("NVRTC failed")
                    self.loaded = fake.current()
                    fake.compiled.append((self.loaded, self.code))
                return (self.loaded, name)

        class Device:
            def __init__(self, i):
                self.i = i

            def __enter__(self):
                self.prev, fake.local.device = fake.current(), self.i

            def __exit__(self, *exc):
                fake.local.device = self.prev

        class runtime:
            getDevice = staticmethod(lambda: fake.current())

        class cuda:
            pass
        cuda.runtime, cuda.Device = runtime, Device
        self.RawModule, self.cuda = RawModule, cuda

    def current(self):
        return getattr(self.local, "device", 0)


@pytest.fixture
def fresh_modules(monkeypatch):
    for name in ("_modules", "_pending", "_failed", "_functions"):
        monkeypatch.setattr(cuda_modules, name, {})


def _code(dtype, unit):
    return dict((name, code) for name, code, _ in cuda_modules.units(dtype))[unit]


def test_function_compiles_the_unit_it_needs_once_per_device_and_dtype(fresh_modules, monkeypatch):
    cp = _FakeCupy()
    assert cuda_modules.function(cp, np.float32, "rows_times_small_8") == (0, "rows_times_small_8")
    assert cp.compiled == [(0, _code(np.float32, "row_product_8"))]          # that unit alone
    assert cuda_modules.function(cp, np.float32, "ortho_factor") == (0, "ortho_factor")
    cuda_modules.function(cp, np.float32, "rr_finish")                        # main again: no compilation
    cuda_modules.function(cp, np.float32, "rows_times_small_8")
    cuda_modules.function(cp, np.float64, "ortho_factor")
    with cp.cuda.Device(1):
        assert cuda_modules.function(cp, np.float32, "rr_finish") == (1, "rr_finish")
    assert cp.compiled[1:] == [(0, _code(np.float32, "main")), (0, _code(np.float64, "main")),
                               (1, _code(np.float32, "main"))]
    monkeypatch.setattr(row_kernels, "MIN_BLOCKS", 3)        # another constant: another unit
    cuda_modules.function(cp, np.float32, "rows_times_small_8")
    assert len(cp.compiled) == 5 and "#define MIN_BLOCKS 3\n" in cp.compiled[-1][1]
    with pytest.raises(ValueError, match="no CUDA kernel named 'rows_times_small_7'"):
        cuda_modules.function(cp, np.float32, "rows_times_small_7")


def test_prepare_compiles_every_unit_side_by_side_and_function_waits_for_its_unit(fresh_modules):
    units = cuda_modules.units(np.float32)
    gate = threading.Event()
    cp = _FakeCupy(gate=gate, meet=len(units))     # no compilation goes on before every unit's has started
    compiling = cuda_modules.prepare(cp, np.float32, [0, 1, 0])
    assert compiling.is_alive() and cp.compiled == []
    got = []
    waiter = threading.Thread(target=lambda: got.append(cuda_modules.function(cp, np.float32, "update_residual_32")))
    waiter.start()
    gate.set()
    waiter.join(10)
    compiling.join(10)
    assert not compiling.is_alive() and got == [(0, "update_residual_32")]
    assert cp.alone == []                          # the units' compilations ran at the same time
    assert sorted(cp.compiled) == sorted((dev, code) for dev in (0, 1) for _, code, _ in units)   # each once
    with cp.cuda.Device(1):
        cuda_modules.function(cp, np.float32, "rr_finish")
    assert len(cp.compiled) == 2 * len(units)
    assert cuda_modules.prepare(cp, np.float32, [0, 1]) is None       # nothing left to do


def test_a_failed_unit_is_raised_where_it_is_needed(fresh_modules):
    cp = _FakeCupy(fail=lambda code: "namespace gpu_rayleigh_ritz" in code)     # main fails, the rows do not
    cuda_modules.prepare(cp, np.float64, [0]).join(10)
    assert cuda_modules.function(cp, np.float64, "staged_update_16") == (0, "staged_update_16")
    with pytest.raises(RuntimeError, match="NVRTC failed"):
        cuda_modules.function(cp, np.float64, "rr_prepare")
    assert cp.tried.count(_code(np.float64, "main")) == 1       # the background failure, not one of its own
    cp.fail = None                                 # the failure is not kept: the next call compiles again
    assert cuda_modules.function(cp, np.float64, "rr_prepare") == (0, "rr_prepare")
    assert sum(code == _code(np.float64, "main") for _, code in cp.compiled) == 1

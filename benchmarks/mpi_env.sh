# Sourced by the shell campaigns: mpi_setup makes mpiexec and mpi4py usable on a device machine. It takes the
# machine's own mpiexec when there is one (BIND="--bind-to none" under Open MPI, so ranks keep every core) unless
# MPI_FROM_WHEELS=1; else it installs the mpich and mpi4py wheels carried in .whl/ under the prefix /tmp/mpich
# (pip puts the wheel's bin/ and lib/ there; with --target its lib/ would land beside the target) and points
# mpi4py at that libmpi (MPICH's ABI: its wheel holds one extension per MPI and loads what the path finds first).
mpi_setup() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 BIND=""
  if [ "${MPI_FROM_WHEELS:-0}" != 1 ] && command -v mpiexec >/dev/null; then
    mpiexec --version 2>&1 | grep -q "Open MPI" && BIND="--bind-to none"
    return 0
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --ignore-installed --prefix /tmp/mpich .whl/*.whl \
      || return 1
  local site
  site=$(python3 -c "import sys; print('/tmp/mpich/lib/python%d.%d/site-packages' % sys.version_info[:2])")
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/mpich/bin:$PATH
  export LD_LIBRARY_PATH=/tmp/mpich/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} MPI4PY_MPIABI=mpich
}

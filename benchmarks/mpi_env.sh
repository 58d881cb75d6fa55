# Sourced by the shell campaigns: mpi_setup makes mpiexec and mpi4py usable on a device machine. It takes the
# machine's own mpiexec when there is one (BIND="--bind-to none" under Open MPI, so ranks keep every core),
# else installs the mpich and mpi4py wheels carried in .whl/ into /tmp/site and points mpi4py at that libmpi
# (mpi4py's wheel loads whichever libmpi it finds first).
mpi_setup() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 BIND=""
  if command -v mpiexec >/dev/null; then
    mpiexec --version 2>&1 | grep -q "Open MPI" && BIND="--bind-to none"
    return 0
  fi
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || return 1
  export PYTHONPATH=$PYTHONPATH:/tmp/site PATH=/tmp/site/bin:$PATH
  export MPI4PY_LIBMPI=$(find /tmp/site -name 'libmpi.so.12' | head -1)
}

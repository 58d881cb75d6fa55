#!/usr/bin/env bash
# Calibrate this node once, look at the profile, then every hybridblas call uses it by itself.
set -euo pipefail
hybridblas-tune info                  # devices, BLAS libraries, GPUs, which profile is active
hybridblas-tune calibrate --quick     # ~2 min on a GPU node, seconds on a laptop; writes the YAML profile
hybridblas-tune show                  # the measured rates, block sizes and CPU share
python3 -c "import hybridblas as hb; print(hb.load_profile())"

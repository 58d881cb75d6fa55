import sys

from hybridblas_launcher import hybridblas_tune

sys.exit(hybridblas_tune())

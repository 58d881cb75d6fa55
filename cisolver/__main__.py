import sys

from hybridblas_launcher import cisolver

sys.exit(cisolver())

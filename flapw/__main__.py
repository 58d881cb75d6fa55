import sys

from hybridblas_launcher import flapw

sys.exit(flapw())

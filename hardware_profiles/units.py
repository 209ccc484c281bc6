"""Unit conversion constants: the only place where GB, GiB, TFLOP/s, Gb/s and µs are defined.

Inside paraplan every quantity is SI (bytes, seconds, FLOPs); these convert at the edges
(loading YAML/CSV, rendering tables).
"""

BYTES_PER_GIB = 2**30
BYTES_PER_GB = 1e9
BYTES_PER_TB = 1e12
BYTES_PER_S_PER_GBIT_S = 1e9 / 8  # 1 Gb/s = 1.25e8 B/s
FLOPS_PER_TFLOP = 1e12
SECONDS_PER_US = 1e-6
SECONDS_PER_MS = 1e-3
SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86_400.0
JOULES_PER_MWH = 3.6e9  # 1 MWh = 1e6 W x 3,600 s
